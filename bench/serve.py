"""Load test of ``vla serve``: N concurrent openpi clients x a fixed request count each.

    python bench/serve.py                                   # tiny preset, CPU, clients 1/4/8
    python bench/serve.py --clients 1 8 --requests 20 --max-batch 1 8
    python bench/serve.py --hold 300 --config demo --clients 200 --http-clients 50   # serve_load.json
    python bench/serve.py --scaling                         # scale.json "serving": obs/s vs clients
    python bench/serve.py --shutdown                        # scale.json "serve_shutdown": SIGTERM faults

The server runs in its own process (``vla serve`` on a random tiny model saved to a temp folder);
the clients are threads using the real ``openpi_client.WebsocketClientPolicy``. Reports p50/p99
end-to-end latency, throughput, mean forward-pass batch size and errors (expected 0).

``--scaling`` (issue #66 item 3): N environment workers sharing one server. For each preset
(``--presets``, default tiny and small), ``vla serve`` unbatched (``--max-batch 1``), batched with
no wait, and batched with a latency cap (``--max-batch 16 --max-wait-ms``), each against 1..16
closed-loop clients (each sends its next observation when its reply arrives, as an env worker
does): observations per second, p50/p99 latency, mean batch. Beside it, the forward pass's own cost
in-process at batch 1 and 16 (the most any server could gain by batching on this machine). Writes
the ``serving`` entry of bench/results/scale.json (other entries are kept).

``--hold SECONDS`` (issue #34 item 5): load held for that long, websocket clients (openpi) and HTTP
clients (keep-alive ``POST /act``) each sending back to back; no error and no lost reply (a request
with neither a reply nor an error), the server's RSS sampled every second (growth after a warm-up of
a tenth of the run, at least 10 s), p50/p99 per transport; writes bench/results/serve_load.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, print_table, write_results
from vlastack.config import load_config
from vlastack.models import build_model


def start_server(
    policy: Path,
    max_batch: int,
    http: bool = False,
    extra: tuple[str, ...] = (),
    env: dict | None = None,
    timeout_s: float = 120.0,
) -> tuple[subprocess.Popen, int]:
    """``vla serve`` on an ephemeral port in its own process (``extra``: more options, e.g.
    ``--fast``) -> (process, websocket port), once it says it is serving."""
    cmd = [
        sys.executable,
        "-m",
        "vlastack.cli",
        "serve",
        "--policy",
        str(policy),
        "--port",
        "0",
        "--http-port",
        "0" if http else "-1",
        "--max-batch",
        str(max_batch),
        *extra,
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        line = proc.stderr.readline()
        if "serving ws://" in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            proc.http_port = int(line.split("HTTP on ")[1].split(")")[0]) if http else -1
            return proc, int(line.split("ws://127.0.0.1:")[1].split()[0])
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("server did not start")


def cpu_info() -> dict:
    """CPU model, the SIMD flags that decide kernel speed, cores (recorded with every CPU figure)."""
    import platform

    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), platform.machine()
    )
    flags = next((ln.split(":", 1)[1].split() for ln in info if ln.startswith("flags")), [])
    return {
        "model": model,
        "flags": [f for f in flags if f.startswith(("avx", "amx"))],
        "cores": os.cpu_count(),
    }


def run_load(port: int, clients: int, requests: int, obs: dict) -> dict:
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    lat: list[float] = []
    batch: list[int] = []
    errors: list[str] = []
    conns = [WebsocketClientPolicy("127.0.0.1", port) for _ in range(clients)]
    conns[0].infer(obs)  # warm-up
    barrier = threading.Barrier(clients)

    def worker(c) -> None:
        barrier.wait()
        for _ in range(requests):
            t0 = time.perf_counter()
            try:
                out = c.infer(obs)
                lat.append((time.perf_counter() - t0) * 1e3)
                batch.append(out["server_timing"]["batch_size"])
            except Exception as e:
                errors.append(repr(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "requests": clients * requests,
        "p50_ms": round(percentile(lat, 50), 1),
        "p99_ms": round(percentile(lat, 99), 1),
        "throughput_rps": round(len(lat) / wall, 1),
        "mean_batch": round(float(np.mean(batch)), 2),
        "errors": len(errors),
    }


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def held_load(
    port: int, http_port: int, pid: int, ws_clients: int, http_clients: int, hold_s: float, obs: dict
) -> dict:
    """Every client sends back to back for ``hold_s`` seconds; see the module docstring."""
    import base64
    import http.client
    import json

    from openpi_client.websocket_client_policy import WebsocketClientPolicy
    from tqdm import tqdm

    lat: dict[str, list[float]] = {"ws": [], "http": []}
    errors: list[str] = []
    sent = {"ws": 0, "http": 0}
    lock = threading.Lock()
    images = {
        k: {"b64": base64.b64encode(v.tobytes()).decode(), "dtype": "uint8", "shape": list(v.shape)}
        for k, v in obs["images"].items()
    }
    body = json.dumps({"images": images, "state": obs["state"].tolist(), "prompt": obs["prompt"]}).encode()
    conns = []
    for _ in tqdm(range(ws_clients), desc="connecting", leave=False):
        conns.append(WebsocketClientPolicy("127.0.0.1", port))
    start = threading.Barrier(ws_clients + http_clients + 1)
    stop_at = [0.0]

    def client_loop(kind: str, request, on_error=lambda: None) -> None:
        """``request()`` back to back until the hold ends; each one a reply, or an error."""
        start.wait()
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            with lock:
                sent[kind] += 1
            try:
                request()
                with lock:
                    lat[kind].append((time.perf_counter() - t0) * 1e3)
            except Exception as e:
                with lock:
                    errors.append(f"{kind} {type(e).__name__}: {e}"[:200])
                on_error()

    def ws_worker(c) -> None:
        client_loop("ws", lambda: c.infer(obs))

    def http_worker() -> None:
        conn = [http.client.HTTPConnection("127.0.0.1", http_port, timeout=120)]

        def post() -> None:
            conn[0].request("POST", "/act", body=body, headers={"Content-Type": "application/json"})
            r = conn[0].getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")

        def reconnect() -> None:  # a failed keep-alive connection is not reused
            conn[0].close()
            conn[0] = http.client.HTTPConnection("127.0.0.1", http_port, timeout=120)

        client_loop("http", post, reconnect)
        conn[0].close()

    threads = [threading.Thread(target=ws_worker, args=(c,), daemon=True) for c in conns]
    threads += [threading.Thread(target=http_worker, daemon=True) for _ in range(http_clients)]
    for t in threads:
        t.start()
    warmup = max(10.0, hold_s / 10)
    rss: list[tuple[float, float]] = []
    t_start = time.perf_counter()
    stop_at[0] = t_start + hold_s
    start.wait()
    with tqdm(total=int(hold_s), desc="load held (s)", unit="s") as bar:
        while (now := time.perf_counter()) < stop_at[0]:
            rss.append((now - t_start, _rss_mib(pid)))
            bar.n = int(now - t_start)
            bar.set_postfix(
                replies=len(lat["ws"]) + len(lat["http"]), errors=len(errors), rss_mib=round(rss[-1][1])
            )
            time.sleep(1.0)
    for t in threads:
        t.join(180)
    wall = time.perf_counter() - t_start
    after = [r for t, r in rss if t >= warmup]
    base = after[0] if after else float("nan")
    replies = {k: len(v) for k, v in lat.items()}
    return {
        "ws_clients": ws_clients,
        "http_clients": http_clients,
        "hold_s": hold_s,
        "wall_s": round(wall, 1),
        "sent": sent,
        "replies": replies,
        "errors": len(errors),
        "error_samples": errors[:5],
        "lost": sum(sent.values()) - sum(replies.values()) - len(errors),
        "p50_ms": {k: round(percentile(v, 50), 1) for k, v in lat.items() if v},
        "p99_ms": {k: round(percentile(v, 99), 1) for k, v in lat.items() if v},
        "throughput_rps": round(sum(replies.values()) / wall, 1),
        "rss_mib": {
            "warmup_s": warmup,
            "after_warmup": round(base, 1),
            "max_after_warmup": round(max(after), 1) if after else None,
            "end": round(rss[-1][1], 1) if rss else None,
            "growth": round(max(after) / base - 1, 4) if after else None,
            "series_every_10s": [round(r, 1) for t, r in rss[::10]],
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--config", default=None, help="YAML on top of the preset (e.g. demo)")
    ap.add_argument("--hold", type=float, default=0, help="hold the load this many seconds (serve_load.json)")
    ap.add_argument("--http-clients", type=int, default=0, help="with --hold: HTTP clients beside them")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--requests", type=int, default=25, help="requests per client")
    ap.add_argument("--max-batch", type=int, nargs="+", default=[8])
    ap.add_argument(
        "--scaling", action="store_true", help="obs/s vs clients, unbatched and batched (scale.json)"
    )
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"], help="with --scaling")
    ap.add_argument("--max-wait-ms", type=float, default=5.0, help="with --scaling: the batched server's cap")
    ap.add_argument("--min-obs", type=int, default=32, help="with --scaling: observations per row, at least")
    ap.add_argument(
        "--row-seconds",
        type=float,
        default=6.0,
        help="with --scaling: rows of ~this many s of batch-1 passes",
    )
    ap.add_argument("--threads", type=int, default=2, help="with --scaling: the server's torch threads")
    ap.add_argument("--shutdown", action="store_true", help="SIGTERM under a retry storm and large uploads")
    ap.add_argument("--repeats", type=int, default=3, help="with --shutdown: trials of each kind")
    args = ap.parse_args()
    if args.scaling:
        return scaling_main(args)
    if args.shutdown:
        return shutdown_main(args)
    cfg = load_config(args.preset, args.config)
    obs = make_obs(cfg)
    if args.hold:
        return hold_main(args, cfg, obs)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        build_model(cfg.model).save_pretrained(tmp)
        for mb in args.max_batch:
            proc, port = start_server(Path(tmp), mb)
            try:
                for n in args.clients:
                    rows.append(
                        {"preset": args.preset, "max_batch": mb, **run_load(port, n, args.requests, obs)}
                    )
                    print(rows[-1], flush=True)
            finally:
                proc.terminate()
                proc.wait(60)
    cols = [
        "preset",
        "max_batch",
        "clients",
        "requests",
        "p50_ms",
        "p99_ms",
        "throughput_rps",
        "mean_batch",
        "errors",
    ]
    print_table(rows, cols)
    path = write_results("serve", {"device": "cpu", "rows": rows})
    print(f"wrote {path}")


def make_obs(cfg) -> dict:
    """One fixed observation of the config's cameras, image size and state width."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    s = cfg.model.vision.image_size
    return {
        "images": {c: rng.integers(0, 256, (s, s, 3), dtype=np.uint8) for c in cfg.model.camera_names},
        "state": rng.standard_normal(cfg.model.state_dim).astype(np.float32),
        "prompt": "pick up the red cube",
    }


def forward_cost(policy_dir: Path, obs: dict, batches: tuple[int, ...], threads: int) -> dict:
    """In-process ``Policy.infer_results`` ms per pass at each batch size (best of 3 after one warm-up):
    the bound on what batching can buy, whatever the server does."""
    from vlastack.infer.policy import Policy

    torch.set_num_threads(threads)
    pol = Policy.from_pretrained(policy_dir)
    out = {}
    for b in batches:
        checked = [pol.check(obs) for _ in range(b)]
        pol.infer_results(checked)
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            pol.infer_results(checked)
            ts.append((time.perf_counter() - t0) * 1e3)
        out[b] = {"ms_per_pass": round(min(ts), 1), "obs_per_s": round(b * 1e3 / min(ts), 2)}
    return out


def scaling_main(args: argparse.Namespace) -> None:
    import datetime
    import math

    from tqdm import tqdm

    clients = sorted(set(args.clients if args.clients != [1, 4, 8] else [1, 2, 4, 8, 16]))
    top = max(clients)
    modes = {"unbatched": (1, 0.0), "batched_no_wait": (top, 0.0), "batched": (top, args.max_wait_ms)}
    presets = {}
    for preset in args.presets:
        cfg = load_config(preset)
        obs = make_obs(cfg)
        with tempfile.TemporaryDirectory() as tmp:
            model = build_model(cfg.model)
            n_params = sum(p.numel() for p in model.parameters())
            model.save_pretrained(tmp)
            del model
            fwd = forward_cost(Path(tmp), obs, (1, top), args.threads)
            print(preset, "forward:", fwd, flush=True)
            total = max(args.min_obs, int(fwd[1]["obs_per_s"] * args.row_seconds))
            rows = []
            for mode, (mb, wait) in modes.items():
                extra = ("--max-wait-ms", str(wait), "--threads", str(args.threads))
                proc, port = start_server(Path(tmp), mb, extra=extra, timeout_s=300)
                try:
                    for n in tqdm(clients, desc=f"{preset} {mode}", leave=False):
                        row = run_load(port, n, max(2, math.ceil(total / n)), obs)
                        rows.append({"mode": mode, "max_batch": mb, "max_wait_ms": wait, **row})
                        print(preset, rows[-1], flush=True)
                finally:
                    proc.terminate()
                    proc.wait(60)
        rps = {(r["mode"], r["clients"]): r["throughput_rps"] for r in rows}
        one = rps[("unbatched", 1)]
        presets[preset] = {
            "params_m": round(n_params / 1e6, 1),
            "image_size": cfg.model.vision.image_size,
            "cameras": len(cfg.model.camera_names),
            "forward_in_process": {str(k): v for k, v in fwd.items()},
            "batching_bound_x": round(fwd[top]["obs_per_s"] / fwd[1]["obs_per_s"], 2),
            "rows": rows,
            f"speedup_{top}_clients_batched_vs_1_client": round(rps[("batched", top)] / one, 2),
            f"speedup_{top}_clients_unbatched_vs_1_client": round(rps[("unbatched", top)] / one, 2),
        }
        print_table(
            rows,
            ["mode", "clients", "requests", "p50_ms", "p99_ms", "throughput_rps", "mean_batch", "errors"],
        )
    path = _merge_scale(
        "serving",
        {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "cpu": cpu_info(),
            "torch": torch.__version__,
            "server_threads": args.threads,
            "note": "server and clients (threads of one process, real openpi clients) share the machine; each "
            "client is closed-loop (its next observation when its reply arrives); random weights",
            "presets": presets,
        },
    )
    print(f"wrote {path}")


def _merge_scale(key: str, entry: dict) -> Path:
    """Write ``entry`` as ``key`` of bench/results/scale.json, keeping the other entries."""
    import json

    from bench.common import RESULTS

    path = RESULTS / "scale.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc[key] = entry
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def shutdown_main(args: argparse.Namespace) -> None:
    """Issue #66: ``vla serve --drain-timeout 10`` gets SIGTERM (a) while 16 HTTP clients retry at once
    after every 503, (b) while websocket and HTTP clients upload 2000x2000 images and retry at once.
    Target: no request that reached the server without a reply, exit within the drain timeout."""
    import datetime

    from tests.faults import serve_trials as st
    from tests.faults.conftest import micro_policy

    drain = 10.0
    setups = {
        "retry_storm_16http": lambda p: st.sigterm_under_load_trial(
            p, clients=16, backoff_s=0, drain_timeout=drain
        ),
        "large_uploads_8ws": lambda p: st.large_upload_sigterm_trial(p, ws_clients=8, drain_timeout=drain),
        "large_uploads_eager_24ws_10http": lambda p: st.large_upload_sigterm_trial(
            p, ws_clients=24, http_clients=10, eager=True, drain_timeout=drain
        ),
    }
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        good = micro_policy(Path(tmp) / "good-policy")
        for name, fn in setups.items():
            rows = []
            for i in range(args.repeats):
                t = fn(good)
                rows.append({"ok": t.ok, **t.detail})
                print(f"{name} #{i + 1}: ok={t.ok} {t.detail}", flush=True)
            out[name] = {
                "trials": len(rows),
                "passed": sum(r["ok"] for r in rows),
                "exit_s_max": max(r["exit_s"] for r in rows),
                "lost_max": max(r.get("lost", 0) for r in rows),
                "rows": rows,
            }
    entry = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_info(),
        "torch": torch.__version__,
        "drain_timeout_s": drain,
        "target": "every request that reached the server answered (lost 0); exit within the drain timeout + 2 s",
        "trials": out,
    }
    print(f"wrote {_merge_scale('serve_shutdown', entry)}")


def hold_main(args: argparse.Namespace, cfg, obs: dict) -> None:
    import datetime

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        build_model(cfg.model).save_pretrained(tmp)
        proc, port = start_server(Path(tmp), args.max_batch[0], http=args.http_clients > 0)
        try:
            row = held_load(
                port, proc.http_port, proc.pid, args.clients[0], args.http_clients, args.hold, obs
            )
        finally:
            proc.terminate()
            rc = proc.wait(60)
    row["server_exit_code"] = rc
    payload = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "policy": f"preset {args.preset}"
        + (f" + {args.config}.yaml" if args.config else "")
        + ", random weights",
        "max_batch": args.max_batch[0],
        "cpu": cpu_info(),
        "torch": torch.__version__,
        "note": "clients and server share the same 2 cores; latencies include the clients' own Python time",
        **row,
    }
    print(payload)
    print(f"wrote {write_results('serve_load', payload)}")


if __name__ == "__main__":
    main()
