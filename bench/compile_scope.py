"""Warm-up and latency of the fast path's two compile scopes on this CPU: ``whole`` (the prefix
pass and the Euler step, each one graph) against ``layers`` (``fastpath.compile_layers``: one
decoder layer and one SigLIP block per kind of call, shared by every layer).

The model has pi0's depths (SigLIP 27, Gemma 18 + expert 18) at the tiny preset's widths: the
compile work grows with the graph's node count, which the depth sets, while the widths only
change the kernels' run time. Each scope runs in a fresh process with an empty inductor cache, so
neither warm-up is served from the other's cache. Writes bench/results/compile_scope_cpu.json.

    .venv/bin/python bench/compile_scope.py              # ~4 minutes on 2 cores
    .venv/bin/python bench/compile_scope.py --variant pi05 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.common import RESULTS, environment  # noqa: E402

DEPTHS = ["model.vlm.depth=18", "model.expert.depth=18", "model.vision.depth=27"]


def measure(variant: str, scope: str, repeats: int) -> dict:
    """In this process: build, prepare, compile with ``scope``; first call and steady latency."""
    import torch

    from vlastack.batch import dummy_batch
    from vlastack.config import load_config
    from vlastack.models import build_model
    from vlastack.models.heads.flow.fastpath import StaticSampler, prepare_for_inference

    cfg = load_config("tiny", overrides=[f"model.head_options.variant={variant}", *DEPTHS]).model
    torch.manual_seed(0)
    model = prepare_for_inference(build_model(cfg).eval(), torch.float32)
    batch = dummy_batch(cfg, 1, train=False)
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim)
    with torch.inference_mode():
        want = StaticSampler(model)(batch, noise)
        sampler = StaticSampler(model, compile=True, compile_scope=scope)
        t0 = time.perf_counter()
        got = sampler(batch, noise)
        warmup = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            sampler(batch, noise)
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {
        "scope": scope,
        "warmup_s": round(warmup, 2),
        "p50_ms": round(times[len(times) // 2], 2),
        "min_ms": round(times[0], 2),
        "rel_err_vs_eager": float((got - want).norm() / want.norm()),
        "params": sum(p.numel() for p in model.parameters()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="pi0", choices=["pi0", "pi05"])
    ap.add_argument("--scopes", default="layers,whole")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one scope in a fresh process
        print(json.dumps(measure(args.variant, args.child, args.repeats)))
        return
    rows = []
    for scope in args.scopes.split(","):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            cmd = [sys.executable, __file__, "--variant", args.variant, "--repeats", str(args.repeats)]
            out = subprocess.run(
                [*cmd, "--child", scope], env=env, capture_output=True, text=True, check=True
            )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    from vlastack.labs._core import cpu_flags

    env = environment() | {"machine": platform.machine(), "cores": os.cpu_count(), "cpu_flags": cpu_flags()}
    payload = {
        "environment": env,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": f"tiny widths, {args.variant}, depths " + ", ".join(DEPTHS),
        "note": "each scope in a fresh process with an empty TORCHINDUCTOR_CACHE_DIR; warmup_s = the "
        "first call (dynamo + inductor + C++ builds); fp32, batch 1",
        "rows": rows,
    }
    path = Path(args.out) if args.out else RESULTS / "compile_scope_cpu.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    old[args.variant] = payload
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
