"""Score a LeRobot policy folder with ``vla eval`` through ``scripts/lerobot_policy_server.py``: the
one evaluator every row of the Meta-World table goes through (issue #64).

    # a tuning trial on the validation seeds (2000 + j), recorded under mt10.tuning.<as>
    .venv/bin/python bench/lerobot_served.py --run runs/lr_act_t1 --resize 128 \\
        --seed 2000 --episodes-per-task 10 --trial "ACT, lr 1e-4, chunk 20, temporal ensembling" --as lerobot_act
    # the test seeds (1000 + j), 50 per task, once, for the recipe chosen on the validation seeds:
    # --row records the table row mt10.<row> (refused unless the run is the best trial of --as)
    .venv/bin/python bench/lerobot_served.py --run runs/lr_act_t4 --resize 128 --out runs/lr_act_t4/eval_vla \
        --as lerobot_act --row lerobot_act_tuned

The server runs in LeRobot's venv (``--lerobot-python``) with LeRobot's own pre- and
post-processors; ``vla eval`` runs here with vlastack's environment (the same renderer, seeds and
episode count as vlastack's rows). ``--resize R`` resizes the evaluator's frames with vlastack's
``fit_image`` before LeRobot's preprocessor: the policy trained on a ``vla data resize`` copy sees
at evaluation what it saw in training. ``--set FIELD=JSON`` overrides policy config fields at load
(e.g. ACT's ``n_action_steps``, ``temporal_ensemble_coeff``): both land in ``eval.json``'s
``server`` entry. A run trained on a ``vla data task-onehot`` copy is served with
``--task-onehot`` (the prompt's task as its one-hot environment state). The evaluation resumes
(``vla eval --resume``) when run again with the same arguments; SIGTERM or SIGHUP to this script
stops its ``vla eval`` and its server (a killed script used to leave both running, the server
holding 1.4 GB and a port, the evaluation holding the journal's lock).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lerobot_common import (
    LAST,
    LEDGER,
    LEROBOT_PYTHON,
    OUT,
    PLAN,
    RUN_INFO,
    machine,
    read_json,
    task_onehot,
)

ROOT = Path(__file__).resolve().parent.parent


def start_server(py: str, policy: Path, resize: int | None, sets: list[str], threads: int, log: Path,
                 onehot: str | None = None):  # fmt: skip
    """The LeRobot policy server on a free port -> (process, port); waits for its 'serving' line."""
    cmd = [py, str(ROOT / "scripts" / "lerobot_policy_server.py"), "--policy", str(policy), "--env", "metaworld",
           "--port", "0", "--threads", str(threads)]  # fmt: skip
    if resize:
        cmd += ["--resize", str(resize)]
    for s in sets:
        cmd += ["--set", s]
    if onehot:
        cmd += ["--task-onehot", onehot]
    env = dict(os.environ, HF_HUB_OFFLINE="1", MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    with log.open("w") as fh:  # the server keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 300
    while time.time() < deadline:
        m = re.search(r"serving ws://127\.0\.0\.1:(\d+)", log.read_text())
        if m:
            return proc, int(m.group(1)), cmd
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"the LeRobot policy server did not start; see {log}:\n{log.read_text()[-2000:]}")


def _stop(signum: int, _frame) -> None:
    """SIGTERM/SIGHUP -> SystemExit, so ``main``'s ``finally`` stops the evaluation and the server."""
    raise SystemExit(f"{signal.Signals(signum).name}: stopping the evaluation and the policy server")


def stop_children(procs: list[subprocess.Popen], timeout: float = 60.0) -> None:
    """SIGTERM to each child still running, then SIGKILL to any that outlives ``timeout``. The
    evaluation's journal keeps every finished episode, so the same command resumes it."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a bench/lerobot_metaworld.py train run")
    ap.add_argument("--checkpoint", default=None, help="a pretrained_model folder (default: the run's last)")
    ap.add_argument("--lerobot-python", default=LEROBOT_PYTHON)
    ap.add_argument("--config", default="metaworld_mt10", help="vla eval's config (suite, renderer, seeds)")
    ap.add_argument("--tasks", default=None, help="vla eval --tasks (default: the config's)")
    ap.add_argument("--seed", type=int, default=1000, help="1000: test seeds; 2000: validation seeds")
    ap.add_argument("--episodes-per-task", type=int, default=50)
    ap.add_argument("--workers", type=int, default=2, help="vla eval's environment processes")
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    ap.add_argument("--resize", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=JSON")
    ap.add_argument("--out", default=None, help="default RUN/eval_val (seed 2000) or RUN/eval_vla")
    ap.add_argument("--trial", default=None, help="record a tuning trial (validation seeds) with this text")
    ap.add_argument("--as", dest="tuning", default=None, help="the tuning list's name, e.g. lerobot_act")
    ap.add_argument("--row", default=None, help="test seeds: record the table row SUITE.ROW (needs --as)")
    ap.add_argument("--suite", default="mt10")
    args = ap.parse_args()
    if (args.trial or args.row) and not args.tuning:
        ap.error("--trial and --row need --as (the tuning list's name)")
    if args.trial and args.row:
        ap.error(
            "--trial scores a tuning trial (validation seeds), --row a table row (test seeds): one of them"
        )

    run = Path(args.run)
    policy = Path(args.checkpoint) if args.checkpoint else run / OUT / LAST / "pretrained_model"
    if not (policy / "config.json").exists():
        sys.exit(f"no LeRobot policy at {policy}")
    out = Path(args.out) if args.out else run / ("eval_val" if args.seed >= 2000 else "eval_vla")
    chosen = None
    if args.row:  # checked before hours of evaluation, not after
        from bench.metaworld import load
        from bench.metaworld_protocol import TEST_SEED, VALIDATION_SEED, chosen_recipe

        if not TEST_SEED <= args.seed < VALIDATION_SEED:
            sys.exit(f"--row scores the test seeds ({TEST_SEED}+j), got --seed {args.seed}")
        chosen = chosen_recipe(load(), args.suite, args.tuning, run)
    out.mkdir(parents=True, exist_ok=True)
    plan = read_json(run / PLAN) or {}
    data = plan.get("data")
    onehot = data if task_onehot(data) else None  # trained with the task one-hot: served with it
    proc, port, server_cmd = start_server(args.lerobot_python, policy.resolve(), args.resize, args.set,
                                          args.threads, out / "server.log", onehot)  # fmt: skip
    argv = ["eval", "--policy", f"ws://127.0.0.1:{port}", "--config", args.config, "--out", str(out),
            "--resume", "--workers", str(args.workers), "--episodes-per-task", str(args.episodes_per_task),
            "--seed", str(args.seed), "--videos", "0"]  # fmt: skip
    if args.tasks:
        argv += ["--tasks", args.tasks]
    t0 = time.time()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    child = None
    try:
        # A child process, not vlastack.cli.main here: this script's folder (bench/, first on
        # sys.path) holds metaworld.py, which would shadow the Meta-World package.
        child = subprocess.Popen([sys.executable, "-m", "vlastack.cli", *argv], cwd=ROOT)
        rc = child.wait()
    finally:
        stop_children([c for c in (child, proc) if c is not None])
    if rc != 0:
        sys.exit(f"vla eval failed (rc {rc})")
    ev = json.loads((out / "eval.json").read_text())
    print(f"{out / 'eval.json'}: mean task success {ev['mean_task_success']:.1%} ({time.time() - t0:.0f}s)")
    server = {"resize": args.resize, "set": args.set, "task_onehot": onehot, "command": server_cmd}
    if chosen is not None:
        from bench.metaworld import record_lerobot

        by = f"bench/lerobot_served.py --run {args.run} --as {args.tuning} --row {args.row}"
        evaluator = {
            "evaluator": "vla eval (ws:// LeRobot policy server)",
            "server": server,
            "wall_s": ev.get("wall_s"),
        }
        record_lerobot(args.suite, args.row, out / "eval.json", run, by, Path(data), evaluator, chosen)
        return
    if not args.trial:
        return
    from bench.metaworld import load, save
    from bench.metaworld_protocol import LEROBOT_DEFAULT_BATCH, record_validation

    info = read_json(run / RUN_INFO) or {}
    batch = (info.get("non_default") or {}).get("batch_size", {}).get("value", LEROBOT_DEFAULT_BATCH)
    ledger = read_json(run / LEDGER) or []
    # A run the watchdog stopped at the budget is scored at its last checkpoint, short of the plan.
    trial = {"trial": args.trial, "run": str(run), "cpu_hours": info.get("cpu_hours"),
             "steps": info.get("step_reached"), "steps_planned": plan.get("steps"),
             "stopped_at_budget": bool(ledger and ledger[-1].get("stopped_at_budget")), "batch_size": int(batch),
             "data": info.get("data"), "non_default": info.get("non_default"),
             "server": server,
             "evaluator": "vla eval (ws:// LeRobot policy server)",
             "date": datetime.date.today().isoformat(), "machine": info.get("machine") or machine()}  # fmt: skip
    res = load()
    entry = record_validation(res, args.suite, args.tuning, ev, trial)
    save(res)
    print(
        f"{args.suite} tuning {args.tuning} [{args.trial}]: {entry['mean']:.1%} on validation seeds {entry['seeds']}"
    )


if __name__ == "__main__":
    main()
