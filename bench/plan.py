"""Planner accuracy: predicted (fake tensors) vs measured (real CPU run) peak memory per config.

    PYTHONPATH=. python bench/plan.py [--quick]

For each config the planner (``vlastack.diagnostics.plan.simulate``) runs two training steps on
fake tensors; the measurement runs the same two steps on real CPU tensors while torch's profiler
records every CPU allocation (``cpu_allocator_peak``: the largest number of bytes torch's CPU
allocator held at once, from model construction to the end of step 2). Inference rows run
``sample_actions`` once. The target is |error| <= 10%. pi0 on a GPU is not measured here (no GPU
in this session); its prediction is printed without a measurement.
Writes bench/results/plan.json.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import environment, write_results
from vlastack.config import load_config
from vlastack.diagnostics.memory import fmt_bytes
from vlastack.diagnostics.plan import measure, simulate

CONFIGS = [
    ("tiny", 8, (), "train"),
    ("tiny", 32, (), "train"),
    ("tiny", 32, ("train.precision=bf16",), "train"),
    ("tiny", 32, ("train.activation_checkpointing=true",), "train"),
    ("tiny", 32, ("train.lora_rank=16",), "train"),
    ("tiny", 16, ("model.head=tokens",), "train"),
    ("tiny", 32, (), "infer"),
    ("small", 2, (), "train"),
    ("small", 4, ("train.precision=bf16", "train.activation_checkpointing=true"), "train"),
    ("small", 2, ("train.lora_rank=16",), "train"),
    ("small", 4, (), "infer"),
]


def cpu_flags() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Flags")), "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny configs only")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    print(f"{'config':58s} {'predicted':>12s} {'measured':>12s} {'error':>7s}  sim s / real s")
    for preset, bs, ov, mode in CONFIGS:
        if args.quick and preset != "tiny":
            continue
        cfg = load_config(preset, overrides=list(ov))
        t0 = time.perf_counter()
        pred = simulate(cfg, bs, mode)
        t1 = time.perf_counter()
        meas = measure(cfg, bs, mode)
        t2 = time.perf_counter()
        err = pred["peak_bytes"] / meas["allocator_peak_bytes"] - 1
        name = f"{preset} {mode} batch {bs} {' '.join(ov)}".strip()
        print(
            f"{name:58s} {fmt_bytes(pred['peak_bytes']):>12s} {fmt_bytes(meas['allocator_peak_bytes']):>12s}"
            f" {err:+7.2%}  {t1 - t0:.1f} / {t2 - t1:.1f}"
        )
        rows.append(
            {
                "preset": preset,
                "mode": mode,
                "batch_size": bs,
                "overrides": list(ov),
                "predicted_bytes": pred["peak_bytes"],
                "measured_allocator_bytes": meas["allocator_peak_bytes"],
                "measured_live_tensor_bytes": meas["peak_bytes"],
                "error": err,
                "predicted_categories": pred["categories"],
                "simulate_s": t1 - t0,
                "measure_s": t2 - t1,
            }
        )
    t0 = time.perf_counter()
    pi0 = simulate(load_config("pi0"), 1)
    pi0_s = time.perf_counter() - t0
    print(f"pi0 train batch 1 bf16 + checkpointing: predicted {fmt_bytes(pi0['peak_bytes'])} ({pi0_s:.0f} s)")
    worst = max(abs(r["error"]) for r in rows)
    print(f"worst |error| {worst:.2%} (target <= 10%)")
    write_results(
        "plan",
        {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "cpu_flags": cpu_flags(),
            "note": (
                "measured = peak bytes held by torch's CPU allocator (profiler memory events) over model "
                "construction + 2 training steps (or one sample_actions call); predicted = the same code "
                "under FakeTensorMode with LiveTensorTracker. Memory figures do not depend on machine "
                "load; the timings do (shared 2-core machine). pi0 on a GPU: no GPU in this session, "
                "prediction only."
            ),
            "environment_detail": environment(),
            "rows": rows,
            "worst_abs_error": worst,
            "pi0_prediction": {
                "batch_size": 1,
                "peak_bytes": pi0["peak_bytes"],
                "categories": pi0["categories"],
                "simulate_s": pi0_s,
                "measured": None,
            },
        },
    )


if __name__ == "__main__":
    main()
