"""What ``vla serve`` adds over ``Policy.infer``, measured without a GPU: issue #40's "serve adds
<= 1 ms" target, taken apart.

    python bench/serve_overhead.py                 # -> bench/results/serve_overhead.json

A real ``PolicyServer`` runs in its own process (``run``, as ``vla serve`` does) on a tiny policy
with pi0's three cameras, whose forward pass is replaced by a fixed ``--forward-ms`` sleep (a GPU
sync also releases the GIL while it waits): every millisecond above that is the serving path's own.
The client is the real ``openpi_client.WebsocketClientPolicy`` sending three 224x224 uint8 images
(450 KB), as the GPU bench does. Reported, medians over ``--requests``:

- ``overhead_ms`` = client round trip - ``Policy.infer`` in-process on the same policy (the check of
  the observation and the sleep);
- ``server_beyond_forward_ms`` = the server's ``total_ms`` - its ``infer_ms`` (decode, check and
  the hand-offs between the event loop, the decoder thread and the batcher thread);
- ``transport_ms`` = round trip - the server's ``total_ms`` (the client's packing and the bytes
  both ways through websockets, the reply's packing);
- ``bare_websocket_ms``: the same message through a websockets server that only sleeps
  ``--forward-ms`` on its event loop and sends a 2 KB reply: round trip minus the time it held the
  message (comparable with ``transport_ms``), the floor of any websocket server written with this
  library (idle as long between messages, so its threads wake as cold);
- ``wake_ms``: one thread waking another after ``--forward-ms`` of idling, through a
  ``threading.Event`` and through an asyncio loop's ``call_soon_threadsafe``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import struct
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS, environment

CAMERAS = ("cam0", "cam1", "cam2")


def _policy(forward_ms: float):
    import torch

    from vlastack.config import load_config
    from vlastack.infer.policy import Policy
    from vlastack.models import build_model

    torch.manual_seed(0)
    cfg = replace(load_config("tiny").model, camera_names=CAMERAS)
    policy = Policy(build_model(cfg), device="cpu")
    zeros = np.zeros((cfg.action_horizon, cfg.action_dim), np.float32)

    def fixed_forward(obs_list: list) -> list[dict]:  # the model's time, and nothing else
        time.sleep(forward_ms / 1e3)
        return [{"actions": zeros} for _ in obs_list]

    policy.infer_results = fixed_forward
    return policy, cfg


def _observation(cfg) -> dict:
    rng = np.random.default_rng(0)
    return {
        "images": {c: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for c in CAMERAS},
        "state": rng.normal(size=cfg.state_dim).astype(np.float32),
        "prompt": "pick up the red block and put it in the bowl",
    }


def _serve(port: int, forward_ms: float) -> None:
    from vlastack.infer.server import PolicyServer, run

    run(PolicyServer(_policy(forward_ms)[0], port=port))


def _echo(port: int, forward_ms: float) -> None:
    from websockets.asyncio.server import serve

    async def handler(ws) -> None:
        async for _ in ws:
            t0 = time.perf_counter()
            await asyncio.sleep(forward_ms / 1e3)  # idle as long as the server's forward: as cold
            held_ms = (time.perf_counter() - t0) * 1e3
            await ws.send(struct.pack("d", held_ms) + b"x" * 2000)

    async def main() -> None:
        async with serve(handler, "127.0.0.1", port, compression=None, max_size=None):
            await asyncio.Future()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.Popen([sys.executable, __file__, *args], env=env)


def _connect(port: int, proc: subprocess.Popen, timeout_s: float = 120):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            return WebsocketClientPolicy("127.0.0.1", port)
        except Exception:  # not listening yet
            if time.monotonic() - t0 > timeout_s:
                raise
            time.sleep(0.5)


def _median_ms(fn, n: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ms))


def wake_latency(idle_ms: float, n: int = 50) -> dict:
    """How long a thread takes to wake another after it idled ``idle_ms``: a ``threading.Event``
    waiter, and an asyncio loop woken by ``call_soon_threadsafe`` (how the batcher's result reaches
    the server's event loop)."""
    import threading

    event_ms = []
    for _ in range(n):
        ev, seen = threading.Event(), []
        th = threading.Thread(target=lambda ev=ev, seen=seen: (ev.wait(), seen.append(time.perf_counter())))
        th.start()
        time.sleep(idle_ms / 1e3)
        t0 = time.perf_counter()
        ev.set()
        th.join()
        event_ms.append((seen[0] - t0) * 1e3)

    async def loop_wakes() -> list[float]:
        loop, out = asyncio.get_running_loop(), []
        for _ in range(n):
            fut, sent = loop.create_future(), []

            def other(fut=fut, sent=sent) -> None:
                time.sleep(idle_ms / 1e3)
                sent.append(time.perf_counter())
                loop.call_soon_threadsafe(fut.set_result, None)

            threading.Thread(target=other).start()
            await fut
            out.append((time.perf_counter() - sent[0]) * 1e3)
        return out

    loop_ms = asyncio.run(loop_wakes())
    return {
        "threading_event_ms": round(float(np.median(event_ms)), 3),
        "asyncio_call_soon_threadsafe_ms": round(float(np.median(loop_ms)), 3),
    }


def measure(forward_ms: float, requests: int) -> dict:
    from openpi_client import msgpack_numpy
    from websockets.sync.client import connect

    policy, cfg = _policy(forward_ms)
    obs = _observation(cfg)
    row: dict = {"forward_ms": forward_ms, "requests": requests}
    row["policy_infer_ms"] = round(_median_ms(lambda: policy.infer(obs), requests), 3)

    port = _free_port()
    proc = _child("--_server", str(port), "--forward-ms", str(forward_ms))
    try:
        client = _connect(port, proc)
        rt, total, infer = [], [], []
        for i in range(requests + 5):
            t0 = time.perf_counter()
            out = client.infer(obs)
            if i >= 5:  # warm-up
                rt.append((time.perf_counter() - t0) * 1e3)
                total.append(out["server_timing"]["total_ms"])
                infer.append(out["server_timing"]["infer_ms"])
    finally:
        proc.terminate()
        proc.wait(30)
    rt_ms, total_ms, infer_ms = (float(np.median(x)) for x in (rt, total, infer))
    row.update(
        serve_roundtrip_ms=round(rt_ms, 3),
        overhead_ms=round(rt_ms - row["policy_infer_ms"], 3),
        server_beyond_forward_ms=round(total_ms - infer_ms, 3),
        transport_ms=round(rt_ms - total_ms, 3),
    )

    msg = msgpack_numpy.Packer().pack(obs)
    row["message_bytes"] = len(msg)
    port = _free_port()
    proc = _child("--_echo", str(port), "--forward-ms", str(forward_ms))
    try:
        for _ in range(240):
            try:
                ws = connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None)
                break
            except OSError:
                time.sleep(0.25)
        with ws:
            bare = []
            for i in range(requests + 5):
                t0 = time.perf_counter()
                ws.send(msg)
                held_ms = struct.unpack("d", ws.recv()[:8])[0]
                if i >= 5:
                    bare.append((time.perf_counter() - t0) * 1e3 - held_ms)
            row["bare_websocket_ms"] = round(float(np.median(bare)), 3)
    finally:
        proc.terminate()
        proc.wait(30)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--forward-ms", type=float, default=30.0, help="the stand-in model's time per call")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3, help="whole measurements (new processes each)")
    ap.add_argument("--out", default=None, help="default bench/results/serve_overhead.json")
    ap.add_argument("--_server", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_echo", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._server is not None:
        return _serve(args._server, args.forward_ms)
    if args._echo is not None:
        return _echo(args._echo, args.forward_ms)
    import torch

    torch.set_num_threads(1)
    rows = []
    for i in range(args.repeats):
        rows.append(measure(args.forward_ms, args.requests))
        print(f"[{i + 1}/{args.repeats}] {rows[-1]}", flush=True)
    keys = ("overhead_ms", "server_beyond_forward_ms", "transport_ms", "bare_websocket_ms")
    summary = {k: round(float(np.median([r[k] for r in rows])), 3) for k in keys}
    print("median of the repeats:", summary)
    wake = wake_latency(args.forward_ms)
    print("wake-up after idling", args.forward_ms, "ms:", wake)
    from vlastack.labs._core import cpu_flags

    env = environment() | {"machine": platform.machine(), "cores": os.cpu_count(), "cpu_flags": cpu_flags()}
    payload = {"environment": env, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    payload |= {"target_overhead_ms": 1.0, "summary": summary, "rows": rows, "wake_ms": wake}
    out = Path(args.out) if args.out else RESULTS / "serve_overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
