"""Load test of ``vla serve``: N concurrent openpi clients x a fixed request count each.

    python bench/serve.py                                   # tiny preset, CPU, clients 1/4/8
    python bench/serve.py --clients 1 8 --requests 20 --max-batch 1 8

The server runs in its own process (``vla serve`` on a random tiny model saved to a temp folder);
the clients are threads using the real ``openpi_client.WebsocketClientPolicy``. Reports p50/p99
end-to-end latency, throughput, mean forward-pass batch size and errors (expected 0).
"""

from __future__ import annotations

import argparse
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


def start_server(policy: Path, max_batch: int) -> tuple[subprocess.Popen, int]:
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
        "-1",
        "--max-batch",
        str(max_batch),
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stderr.readline()
        if "serving ws://" in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, int(line.split("ws://127.0.0.1:")[1].split()[0])
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("server did not start")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--requests", type=int, default=25, help="requests per client")
    ap.add_argument("--max-batch", type=int, nargs="+", default=[8])
    args = ap.parse_args()
    cfg = load_config(args.preset)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    s = cfg.model.vision.image_size
    obs = {
        "images": {c: rng.integers(0, 256, (s, s, 3), dtype=np.uint8) for c in cfg.model.camera_names},
        "state": rng.standard_normal(cfg.model.state_dim).astype(np.float32),
        "prompt": "pick up the red cube",
    }
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


if __name__ == "__main__":
    main()
