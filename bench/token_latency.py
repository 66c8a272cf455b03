"""Token-head ``sample_actions`` latency (batch 1): bins and FAST autoregressive decoding with the
static KV cache, and OFT-style parallel decoding; eager vs a compiled decode step / parallel pass.

    python bench/token_latency.py [--preset tiny] [--repeats 10] [--no-compile] [--threads 1]

FAST is fitted on random smooth chunks and the model is untrained, so it never emits the end token:
its rows are the worst case (max_action_tokens + 1 steps). ``bench/latency.py`` calls
``token_rows`` for its token-head rows.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, print_table, time_fn, write_results
from vlastack.batch import dummy_batch
from vlastack.config import PRESETS, TokenHeadConfig
from vlastack.models import build_model

VARIANTS = {
    "bins": TokenHeadConfig(tokenizer="bins", placement="new_rows"),
    "fast": TokenHeadConfig(tokenizer="fast", placement="new_rows"),
    "parallel": TokenHeadConfig(tokenizer="bins", placement="new_rows", decoding="parallel"),
    "parallel+l1": TokenHeadConfig(placement="new_rows", decoding="parallel", regression_head=True),
}


def smooth_chunks(n: int, horizon: int, dim: int, seed: int = 0) -> np.ndarray:
    """[n, horizon, dim] random smooth trajectories in [-1, 1] (to fit FAST)."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, horizon)[None, :, None]
    x = sum(
        rng.uniform(0.05, 0.3, (n, 1, dim))
        * np.sin(2 * np.pi * rng.uniform(0.05, 1.5, (n, 1, dim)) * t + rng.uniform(0, 6.3, (n, 1, dim)))
        for _ in range(3)
    )
    return np.clip(x, -1, 1)


def token_rows(
    preset: str, device: str = "cpu", compile_modes=(False, True), repeats: int = 10
) -> list[dict]:
    """One row per (variant, eager/compiled): p50/p90 ms of ``sample_actions`` at batch 1."""
    base = PRESETS[preset]().model
    rows = []
    for name, tc in VARIANTS.items():
        cfg = replace(base, head="tokens", tokens=tc)
        for compiled in compile_modes:
            torch.manual_seed(0)
            model = build_model(cfg, device=device).eval()
            if tc.tokenizer == "fast":
                model.head.fit_tokenizer(smooth_chunks(2000, cfg.action_horizon, cfg.action_dim))
            if compiled:
                model.head.compile_decoding()
            batch = dummy_batch(cfg, 1, train=False, device=device)

            def call(model=model, batch=batch):
                with torch.inference_mode():
                    return model.sample_actions(batch)

            times = time_fn(call, device, warmup=2, repeats=repeats)
            rows.append(
                {
                    "preset": preset,
                    "device": device,
                    "head": f"tokens:{name}",
                    "mode": "compiled-step" if compiled else "eager",
                    "dtype": "fp32",
                    "decode_steps": 1 if tc.decoding == "parallel" else model.head.num_steps,
                    "p50_ms": round(percentile(times, 50), 2),
                    "p90_ms": round(percentile(times, 90), 2),
                    "params": model.num_params(),
                }
            )
            print_table(rows[-1:], list(rows[-1]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = token_rows(args.preset, "cpu", (False,) if args.no_compile else (False, True), args.repeats)
    print()
    print_table(rows, ["preset", "head", "mode", "decode_steps", "p50_ms", "p90_ms"])
    print(f"wrote {write_results('token_latency', {'batch_size': 1, 'rows': rows})}")


if __name__ == "__main__":
    main()
