"""``vla plan``'s CPU process RSS prediction against the peak RSS of real ``vla train`` runs.

    PYTHONPATH=. python bench/plan_rss.py --data DATASET [--steps 12]

For each config: the planner's tensor peak (fake tensors) plus ``diagnostics.rss.predict_rss``
(measured interpreter + library baseline, allocator slack, prefetched batches, preloaded data),
against ``train/peak_mem_mb`` of a real ``vla train`` run of ``--steps`` steps on ``DATASET`` (the
training process's ``ru_maxrss``, which is what the issue measured). Target: |error| <= 10%.
Writes bench/results/plan_rss.json with the CPU flags, torch version and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import environment, print_table, write_results
from bench.faults import cpu_flags
from vlastack.config import load_config
from vlastack.diagnostics.plan import simulate
from vlastack.diagnostics.rss import CHURN_SLACK, MMAP_THRESHOLD_ENV, predict_rss

CONFIGS = [
    ("tiny", 8, ()),
    ("tiny", 32, ()),
    ("tiny", 32, ("train.precision=bf16",)),
    ("tiny", 32, ("train.activation_checkpointing=true",)),
    ("tiny", 32, ("train.preload=true",)),
    ("tiny", 96, ()),
    ("small", 4, ("model.camera_names=[scene,wrist]",)),
]
# Not used to fit CHURN_SLACK / TRAINER_STATE_BYTES (vlastack/diagnostics/rss.py): a check.
HELD_OUT = [
    ("tiny", 64, ("train.lora_rank=16",)),
    ("small", 2, ("model.camera_names=[scene,wrist]", "train.precision=bf16")),
]


def measured_rss(preset: str, bs: int, ov: tuple[str, ...], data: str, steps: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "vlastack.cli", "train", "--preset", preset, "--data", data, "--out", out,
               f"train.batch_size={bs}", f"train.steps={steps}", f"train.log_every={steps}", *ov]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        last = Path(out, "metrics.jsonl").read_text().strip().splitlines()[-1]
        return json.loads(last)["train/peak_mem_mb"] * 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="tiny configs only")
    ap.add_argument(
        "--mmap-threshold",
        type=int,
        default=None,
        help="run with MALLOC_MMAP_THRESHOLD_=N (glibc's fixed mmap threshold) -> plan_rss_mmap.json",
    )
    args = ap.parse_args()
    if args.mmap_threshold:  # the training runs inherit it; predict_rss reads it
        os.environ[MMAP_THRESHOLD_ENV] = str(args.mmap_threshold)
    rows = []
    for preset, bs, ov in CONFIGS + HELD_OUT:
        if args.quick and preset != "tiny":
            continue
        cfg = load_config(preset, overrides=[f"train.batch_size={bs}", *ov])
        sim = simulate(cfg, bs, "train")
        pred = predict_rss(cfg, sim["categories"], args.data)
        meas = measured_rss(preset, bs, ov, args.data, args.steps)
        rows.append({
            "preset": preset, "batch_size": bs, "overrides": list(ov), "held_out": (preset, bs, ov) in HELD_OUT,
            "tensor_peak_mib": round(sim["peak_bytes"] / 2**20, 1),
            "predicted_rss_mib": round(pred["rss_bytes"] / 2**20, 1),
            "measured_rss_mib": round(meas / 2**20, 1),
            "error": round(pred["rss_bytes"] / meas - 1, 4),
            "tensor_only_error": round(sim["peak_bytes"] / meas - 1, 4),
            "parts_mib": {k: round(v / 2**20, 1) for k, v in pred["parts"].items()},
        })  # fmt: skip
        print(rows[-1], flush=True)
    print_table(rows, ["preset", "batch_size", "overrides", "held_out", "tensor_peak_mib", "predicted_rss_mib",
                       "measured_rss_mib", "error", "tensor_only_error"])  # fmt: skip
    worst = max(abs(r["error"]) for r in rows)
    held = max((abs(r["error"]) for r in rows if r["held_out"]), default=None)
    print(
        f"worst |error| {worst:.1%} (target <= 10%); held-out configs {held if held is None else f'{held:.1%}'}"
    )
    write_results("plan_rss_mmap" if args.mmap_threshold else "plan_rss", {
        "malloc_mmap_threshold": args.mmap_threshold,
        "environment": environment(), "torch": torch.__version__, "cpu": cpu_flags(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "data": args.data, "steps": args.steps, "churn_slack": CHURN_SLACK,
        "definition": "measured: train/peak_mem_mb of `vla train` (the training process's ru_maxrss) after "
        "--steps steps; predicted: vla plan's persistent tensors (parameters, gradients, optimizer state) + its "
        "transient tensors (activations, temporaries, inputs) x churn slack + trainer state + measured "
        "interpreter/library baseline + prefetched batches + preloaded data (vlastack/diagnostics/rss.py)",
        "rows": rows, "worst_abs_error": worst, "worst_abs_error_held_out": held,
    })  # fmt: skip


if __name__ == "__main__":
    main()
