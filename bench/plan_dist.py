"""Cluster planner accuracy: ``vla plan --nodes/--gpus-per-node`` per-rank predictions vs measured
per-rank peaks of real DDP / FSDP2 / HSDP runs (gloo on 127.0.0.1, world sizes 1, 2 and 4).

    PYTHONPATH=. python bench/plan_dist.py [--quick]

Each row: the prediction (``plan_dist.derive_rank`` from one fake-tensor simulation of the
per-rank batch, ``target="cpu"``: gloo's copies counted) against the largest of the ranks' torch
CPU allocator peaks over two training steps (after the model is built and wrapped). Two shapes:
``tiny`` (activations dominate) and ``tiny`` with a 16k vocabulary at batch 1 (parameters and
optimizer state dominate; its embedding makes the unsharded root large, as pi0's does). The
target is |error| <= 10% on every row; the error against the median rank is recorded too (with 4
ranks on 2 cores one rank sometimes holds a gloo buffer its worker thread frees late). Also checked: FSDP2's per-rank parameter + optimizer memory
(held after the steps) falls as 1/world within 10%. Writes the ``plan_distributed`` key of
bench/results/scale.json (the other keys are kept).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vlastack.config import load_config
from vlastack.diagnostics.memory import fmt_bytes
from vlastack.diagnostics.plan import simulate
from vlastack.diagnostics.plan_dist import derive_rank, measure_distributed

RESULTS = Path(__file__).parent / "results" / "scale.json"
SHAPES = {
    "tiny b2": ("tiny", 2, ()),
    "tiny-16k-vocab b1": ("tiny", 1, ("model.vlm.vocab_size=16384",)),
}
VARIANTS = {"plain": (), "lora": ("train.lora_rank=16",)}
# LoRA under DDP is not measured: the last VLM layer's q/o adapters get no gradient (only its
# keys and values reach the action expert) and DDP stops with "Parameter indices which did not
# receive grad" (the base weights there are frozen; apply_lora makes every adapter trainable).
DDP_LORA = "not measured: DDP raises on the last VLM layer's q/o LoRA adapters, which get no gradient"
RUNS = [
    ("ddp", 1, 1),
    ("fsdp", 1, 1),
    ("ddp", 2, 1),
    ("fsdp", 2, 1),
    ("ddp", 4, 1),
    ("fsdp", 4, 1),
    ("hsdp", 4, 2),
]


def cpu_info() -> dict:
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    model = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in info if ln.startswith("flags")), [])
    return {
        "model": model,
        "flags": [f for f in flags if f.startswith(("avx", "amx"))],
        "cores": os.cpu_count(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="plain tiny only")
    ap.add_argument("--no-write", action="store_true", help="print, do not write scale.json")
    args = ap.parse_args()
    rows = []
    print(
        f"{'shape':18s} {'variant':6s} {'strategy':10s} {'predicted':>11s} {'measured':>11s} {'error':>7s}  at"
    )
    for shape, (preset, bs, ov) in SHAPES.items():
        for vname, vov in VARIANTS.items():
            if args.quick and (shape != "tiny b2" or vname != "plain"):
                continue
            cfg = load_config(preset, overrides=[*ov, *vov, f"train.batch_size={bs}"])
            sim = simulate(cfg, bs)
            for strategy, world, nodes in RUNS:
                if vname != "plain" and (world == 1 or strategy == "ddp"):
                    continue  # DDP refuses LoRA here: see DDP_LORA
                t0 = time.perf_counter()
                ranks = measure_distributed(cfg, bs, strategy, world, nodes)
                pred = derive_rank(sim, cfg, strategy, nodes, world // nodes, target="cpu")
                meas = max(r["peak_bytes"] for r in ranks)
                err = pred["peak_bytes"] / meas - 1
                label = (
                    f"{strategy} {nodes}x{world // nodes}" if strategy == "hsdp" else f"{strategy} x{world}"
                )
                print(
                    f"{shape:18s} {vname:6s} {label:10s} {fmt_bytes(pred['peak_bytes']):>11s} {fmt_bytes(meas):>11s}"
                    f" {err:+7.2%}  {pred['phase_at_peak']} ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
                rows.append(
                    {
                        "shape": shape, "overrides": [*ov, *vov], "batch_size_per_rank": bs, "strategy": strategy,
                        "world_size": world, "nodes": nodes, "predicted_bytes": pred["peak_bytes"],
                        "predicted_phase": pred["phase_at_peak"], "predicted_extra": pred["extra"],
                        "measured_bytes": meas, "measured_per_rank": [r["peak_bytes"] for r in ranks],
                        "held_after_steps_per_rank": [r["held_bytes"] for r in ranks],
                        "startup_per_rank": [r["startup_bytes"] for r in ranks], "error": err,
                        "abs_error": abs(err), "measured_median_bytes": statistics.median(r["peak_bytes"] for r in ranks),
                        "error_vs_median_rank": pred["peak_bytes"] / statistics.median(r["peak_bytes"] for r in ranks) - 1,
                    }
                )  # fmt: skip
    # FSDP2's parameters + optimizer state per rank (held after the steps) against 1/world
    scaling = []
    for shape in {r["shape"] for r in rows}:
        for ov in {tuple(r["overrides"]) for r in rows if r["shape"] == shape}:
            f = {r["world_size"]: min(r["held_after_steps_per_rank"]) for r in rows
                 if r["shape"] == shape and tuple(r["overrides"]) == ov and r["strategy"] == "fsdp"}  # fmt: skip
            if 1 in f:
                for w in (2, 4):
                    ratio = f[w] / (f[1] / w)
                    scaling.append({"shape": shape, "overrides": list(ov), "world_size": w, "held_bytes": f[w],
                                    "ideal_bytes": f[1] / w, "ratio": ratio})  # fmt: skip
                    print(f"FSDP2 params+optimizer per rank, {shape} x{w}: {fmt_bytes(f[w])} vs 1/{w} of world 1 "
                          f"{fmt_bytes(f[1] / w)} ({ratio - 1:+.1%})")  # fmt: skip
    worst = max(r["abs_error"] for r in rows)
    print(f"worst |error| {worst:.2%} (target <= 10%) over {len(rows)} rows")
    if args.no_write:
        return
    entry = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_info(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "backend": "gloo on 127.0.0.1, one process per rank, 1 thread each",
        "target": "vla plan per-rank prediction within 10% of the largest measured per-rank peak, every row",
        "measured": "torch's CPU allocator peak (profiler memory events) of each rank over two training steps, "
        "after building and wrapping the model (what the model holds counts)",
        "rows": rows,
        "worst_abs_error": worst,
        "worst_abs_error_vs_median_rank": max(abs(r["error_vs_median_rank"]) for r in rows),
        "within_target": sum(r["abs_error"] <= 0.10 for r in rows),
        "fsdp_param_optimizer_scaling": scaling,
        "ddp_lora": DDP_LORA,
    }
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    doc["plan_distributed"] = entry
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {RESULTS} (plan_distributed)")


if __name__ == "__main__":
    main()
