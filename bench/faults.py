"""Fault-injection figures: run every trial of tests/faults (the slow ones too) and count.

    PYTHONPATH=$PWD python bench/faults.py [--random-kills 10] [--repeats 3]
    PYTHONPATH=$PWD python bench/faults.py --only-drain [--repeats 5]   # -> serve_drain.json

For each fault kind: trials, passed, and time to clear the error (seconds from the fault to a clear
outcome: the one-line error printed, the error reply received, or the resumed run finished
bit-exact), median and max. Writes bench/results/faults.json with CPU flags, torch version, date.
Network traffic goes to 127.0.0.1 only. The real-full-disk trial mounts a tmpfs (root only; it is
skipped elsewhere).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import print_table, write_results  # noqa: E402
from tests.faults import cli_trials as ct  # noqa: E402
from tests.faults import serve_trials as st  # noqa: E402
from tests.faults import trials as tr  # noqa: E402
from tests.faults.trials import Trial  # noqa: E402


def cpu_flags() -> dict:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    keep = [f for f in flags if f.startswith(("avx", "amx", "sse4", "fma", "f16c"))]
    return {"model": model, "flags": keep}


def data_trials(tmp: Path) -> list[Trial]:
    import numpy as np

    from tests.faults.helpers import set_value, write_small_dataset
    from vlastack.data.check import check_dataset

    ds = write_small_dataset(tmp / "nan-data")
    set_value(ds, "action", episode=1, frame=5, dim=2, value=np.nan)
    t0 = time.perf_counter()
    found = [f for f in check_dataset(ds) if f.level == "error"]
    dt = time.perf_counter() - t0
    out = [
        Trial(
            "nan_in_dataset_check",
            len(found) == 1 and found[0].episodes == (1,),
            dt,
            {"found": [str(f) for f in found]},
        )
    ]
    t0 = time.perf_counter()
    rc, err = tr.cli(["train", "--data", str(ds), "--out", str(tmp / "nan-run"), *ct.CLI_TRAIN])
    ok = rc == 2 and "episode 1 frame 5" in err and not (tmp / "nan-run" / "checkpoints").exists()
    out.append(Trial("nan_in_dataset_train_refused", ok, time.perf_counter() - t0, {"stderr": err[-300:]}))
    return out


def run_all(tmp: Path, random_kills: int, repeats: int, log) -> list[Trial]:
    from vlastack.infer.policy import Policy

    trials: list[Trial] = []

    def add(t: Trial | None) -> None:
        if t is None:
            return
        trials.append(t)
        log(
            f"{'ok  ' if t.ok else 'FAIL'} {t.kind:<48} {t.clear_s:7.3f}s" + ("" if t.ok else f"  {t.detail}")
        )

    # ---- training: faults inside the save, at each point of it
    ref_run = tmp / "reference"
    tr.run_training(ref_run)
    reference = tr.outcome(ref_run)
    for point in tr.POINTS:
        for action in ("kill", "sigint"):
            add(tr.kill_in_save_trial(tmp / "save", reference, point, action))
        add(tr.in_process_fault_trial(tmp / "save", reference, point, "enospc"))

    # ---- real `vla train` processes: kill -9 at random moments; a real full disk
    inputs = ct.Inputs(tmp / "inputs")
    cli_ref, window = tr.cli_reference(inputs.dataset, tmp / "cli-reference")
    for seed in range(random_kills):
        add(tr.random_kill_trial(inputs.dataset, tmp / f"random-kill-{seed}", cli_ref, window, seed))
    add(tr.tmpfs_enospc_trial(inputs.dataset, tmp / "tmpfs-trial", cli_ref))

    # ---- every broken input kind the CLI reads, and run failures
    for kind, (hows, _) in ct.CASES.items():
        for how in hows:
            add(ct.bad_file_trial(inputs, kind, how, tmp / "bad"))
    add(ct.disk_full_trial(inputs, tmp / "cli"))
    add(ct.ctrl_c_trial(inputs, tmp / "cli"))
    add(ct.diverged_trial(inputs, tmp / "cli"))
    add(ct.eval_worker_died_trial(inputs, tmp / "cli"))
    add(ct.nan_eval_trial(tmp / "cli"))
    add(ct.missing_gl_trial(tmp / "cli"))
    add(ct.no_args_trial())
    add(ct.old_python_trial())
    for t in data_trials(tmp / "data"):
        add(t)

    # ---- serving
    from tests.faults.conftest import micro_policy

    good = micro_policy(tmp / "good-policy")
    nan = micro_policy(tmp / "nan-policy", nan=True)
    with st.serving(Policy.from_pretrained(nan, seed=0), max_batch=8) as srv:
        for _ in range(repeats):
            add(st.nan_http_trial(srv))
            add(st.nan_ws_trial(srv))
    with st.serving(Policy.from_pretrained(good, seed=0), max_batch=8) as srv:
        for _ in range(repeats):
            add(st.concurrent_http_trial(srv, 50))
            add(st.concurrent_ws_trial(srv, 50))
            add(st.disconnect_mid_post_trial(srv))
    for _ in range(repeats):
        add(st.drain_trial(Policy.from_pretrained(good, seed=0)))
    for _ in range(max(1, repeats - 1)):
        add(st.sigterm_under_load_trial(good))
        add(st.sigterm_under_load_trial(good, clients=16, backoff_s=0))  # a retry storm (issue #66)
    for t in drain_trials(good, repeats):
        add(t)
    return trials


# SIGTERM while 2000x2000 images are uploading (issue #34 item 1): polite websocket clients, then
# clients that retry at once after "shutting down" / 503, with HTTP uploads beside them.
DRAIN_SETUPS = (
    dict(ws_clients=8, http_clients=0, eager=False),
    dict(ws_clients=8, http_clients=10, eager=True),
    dict(ws_clients=24, http_clients=10, eager=True),
)


def drain_trials(policy_dir: Path, repeats: int) -> list[Trial]:
    out = []
    for setup in DRAIN_SETUPS:
        for _ in range(repeats):
            t = st.large_upload_sigterm_trial(policy_dir, **setup)
            t.kind = f"{t.kind}_{setup['ws_clients']}ws_{setup['http_clients']}http"
            print(f"{t.kind}: ok={t.ok} {t.detail}", flush=True)
            out.append(t)
    return out


def summarize(trials: list[Trial]) -> dict:
    by: dict[str, list[Trial]] = defaultdict(list)
    for t in trials:
        by[t.kind].append(t)
    out = {}
    for kind, ts in by.items():
        times = [t.clear_s for t in ts]
        out[kind] = {
            "trials": len(ts),
            "passed": sum(t.ok for t in ts),
            "clear_s_median": round(statistics.median(times), 4),
            "clear_s_max": round(max(times), 4),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-kills", type=int, default=10, help="kill -9 trials at random moments")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each serving trial")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument(
        "--only-drain", action="store_true", help="only the large-upload SIGTERM trials (serve_drain.json)"
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.only_drain:
        return only_drain(args.repeats, not args.no_write)
    with tempfile.TemporaryDirectory(prefix="vla-faults-") as d:
        trials = run_all(Path(d), args.random_kills, args.repeats, lambda s: print(s, flush=True))
    kinds = summarize(trials)
    rows = [{"kind": k, **v} for k, v in kinds.items()]
    print_table(rows, ["kind", "trials", "passed", "clear_s_median", "clear_s_max"])
    total, passed = len(trials), sum(t.ok for t in trials)
    print(f"{passed}/{total} trials passed in {time.perf_counter() - t0:.0f}s")
    random_kills = [t.detail for t in trials if t.kind == "kill9_random"]
    payload = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_flags(),
        "note": "2-core machine shared with other jobs: clear_s figures are wall-clock and noisy",
        "definition": "clear_s: seconds from the fault to a clear outcome (one-line error printed, error "
        "reply received, or the resumed run finished bit-exact with an uninterrupted run)",
        "trials": total,
        "passed": passed,
        "wall_s": round(time.perf_counter() - t0, 1),
        "kinds": kinds,
        "random_kills": random_kills,
        "failures": [{"kind": t.kind, **t.detail} for t in trials if not t.ok],
    }
    if not args.no_write:
        print(f"wrote {write_results('faults', payload)}")
    return 0 if passed == total else 1


def only_drain(repeats: int, write: bool) -> int:
    from tests.faults.conftest import micro_policy

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vla-drain-") as d:
        trials = drain_trials(micro_policy(Path(d) / "p"), repeats)
    kinds = summarize(trials)
    for kind in kinds:
        ts = [t for t in trials if t.kind == kind]
        kinds[kind]["exit_s_max"] = max(t.detail["exit_s"] for t in ts)
        kinds[kind]["lost"] = sum(t.detail["lost"] for t in ts)
        kinds[kind]["replies"] = {
            k: sum(t.detail["replies"].get(k, 0) for t in ts)
            for k in sorted({k for t in ts for k in t.detail["replies"]})
        }
    print_table(
        [{"kind": k, **v} for k, v in kinds.items()], ["kind", "trials", "passed", "exit_s_max", "lost"]
    )
    payload = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_flags(),
        "definition": "vla serve --drain-timeout 10 gets SIGTERM 3 s into uploads of 2000x2000 uint8 images "
        "(msgpack over websocket; base64 JSON over HTTP), one request at a time per client. lost: websocket "
        "messages that arrived before their connection's close and got no reply (the server's own count, "
        "logged at exit) plus HTTP requests reset; exit_s: SIGTERM to process exit. Passing: exit 0, "
        "lost 0, exit within 10 + 2 s.",
        "kinds": kinds,
        "wall_s": round(time.perf_counter() - t0, 1),
        "failures": [{"kind": t.kind, **t.detail} for t in trials if not t.ok],
    }
    if write:
        print(f"wrote {write_results('serve_drain', payload)}")
    return 0 if all(t.ok for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
