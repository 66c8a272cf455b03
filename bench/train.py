"""Training throughput (samples/s) and peak memory: tiny and small on CPU; pi0 on a GPU.

    .venv/bin/python bench/train.py [--steps 5] [--presets tiny,small,demo] [--cpu-precisions fp32,bf16]

``demo`` is the ``vla demo`` model and batch (tiny + the demo recipe: patch 8, two cameras, the
grounding head). CPU rows run once per precision: bf16 autocast pays off on CPUs with bf16 matmul
instructions (avx512_bf16, AMX) and can be slower elsewhere.

Times full optimizer steps (forward, backward, clip, AdamW) of ``vlastack.train.step.train_step``
on synthetic batches in the batch format (data loading is not included). On CUDA the pi0 preset
runs in bf16 autocast with and without activation checkpointing, and MFU is computed from

    FLOPs/step = 6 * B * (N_vision * T_img + N_vlm * T_prefix + N_expert * T_suffix)

(the matmul FLOPs of the linear layers: 2 forward + 4 backward per parameter per token, with
each token group counted against the parameters it passes through; attention score FLOPs and
the recomputation of activation checkpointing are not counted, so MFU is "model FLOPs"
utilization) over a dense bf16 peak of 989 TFLOP/s (H100/H200 SXM). Writes bench/results/train.json.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import print_table, write_results
from vlastack.batch import dummy_batch
from vlastack.config import load_config
from vlastack.diagnostics.memory import peak_memory_mb, reset_peak_memory
from vlastack.models import build_model
from vlastack.train.optim import build_optimizer, part_of
from vlastack.train.parallel import apply_activation_checkpointing
from vlastack.train.step import make_scaler, train_step

PEAK_BF16_FLOPS = 989e12


def step_flops(model, cfg, batch_size: int) -> float:
    m = cfg.model
    n = {"vision": 0, "vlm": 0, "expert": 0}
    for name, p in model.named_parameters():
        if p.ndim >= 2 and "embed" not in name and "pos" not in name:
            n[part_of(name)] += p.numel()
    t_img = m.num_cameras * m.vision.num_patches
    return (
        6.0
        * batch_size
        * (n["vision"] * t_img + n["vlm"] * m.prefix_len + n["expert"] * (1 + m.action_horizon))
    )


def bench(preset: str, batch_size: int, device: str, steps: int, precision: str, ckpt: bool) -> dict:
    overrides = [f"train.precision={precision}", f"train.activation_checkpointing={ckpt}"]
    if preset == "demo":
        from vlastack.apps.demo import demo_config

        cfg = demo_config("tiny", None, overrides)
    else:
        cfg = load_config(preset, overrides=overrides)
    torch.manual_seed(0)
    model = build_model(cfg.model, device=device)
    if ckpt:
        apply_activation_checkpointing(model)
    opt = build_optimizer(model, cfg.train)
    scaler = make_scaler(torch.device(device).type, precision)
    batch = dummy_batch(cfg.model, batch_size, device=device)
    dev_type = torch.device(device).type

    def step():
        return train_step(model, opt, [batch], device_type=dev_type, precision=precision, scaler=scaler)

    step()  # warm-up (allocations, kernel selection)
    reset_peak_memory(device)
    if dev_type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if dev_type == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    row = {
        "preset": preset, "device": device, "precision": precision, "act_ckpt": ckpt, "batch": batch_size,
        "params_M": round(model.num_params() / 1e6, 1), "step_s": round(dt, 3),
        "samples_per_s": round(batch_size / dt, 1), "peak_mem_MiB": round(peak_memory_mb(device)),
    }  # fmt: skip
    if dev_type == "cuda":
        f = step_flops(model, cfg, batch_size)
        row["model_TFLOP_per_step"] = round(f / 1e12, 2)
        row["MFU_%"] = round(100 * f / dt / PEAK_BF16_FLOPS, 1)
    return row


def bench_fitting(
    preset: str, batches: list[int], device: str, steps: int, precision: str, ckpt: bool
) -> dict:
    """The first batch size in ``batches`` that fits in device memory (largest first)."""
    for b in batches:
        try:
            return bench(preset, b, device, steps, precision, ckpt)
        except torch.OutOfMemoryError:
            print(f"{preset} batch {b} act_ckpt={ckpt}: out of memory")
        gc.collect()  # outside the handler, so the traceback's frames (and tensors) are gone
        torch.cuda.empty_cache()
    raise RuntimeError(f"{preset}: no batch size in {batches} fits")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--presets", default="tiny,small,demo", help="CPU rows; '' for none")
    ap.add_argument("--cpu-precisions", default="fp32,bf16", help="CPU rows per preset")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pi0-batches", default="32,16,8,4,2,1", help="tried largest first")
    ap.add_argument("--name", default="train", help="results file (bench/results/NAME.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cpu_batch = {"tiny": 32, "small": 4, "pi0": 1, "demo": 32}
    presets = [p for p in args.presets.split(",") if p]
    precisions = [p for p in args.cpu_precisions.split(",") if p]
    rows = [bench(p, cpu_batch[p], "cpu", args.steps, d, False) for p in presets for d in precisions]
    notes = "CPU rows: peak memory = process peak RSS (includes earlier rows)." if rows else ""
    if torch.cuda.is_available():
        batches = [int(b) for b in args.pi0_batches.split(",")]
        for ckpt in (False, True):
            rows.append(bench_fitting("pi0", batches, "cuda", args.steps, "bf16", ckpt))
            print_table(rows[-1:], list(rows[-1]))
        notes += (
            " pi0 rows: full fine-tuning (every parameter trained, fp32 master weights and AdamW"
            " state), bf16 autocast, the largest batch of --pi0-batches that fits."
        )
    else:
        notes += " pi0-on-GPU rows skipped: no CUDA device."
        print("no CUDA device: skipping the pi0 GPU rows")
    cols = [
        "preset",
        "device",
        "precision",
        "act_ckpt",
        "batch",
        "params_M",
        "step_s",
        "samples_per_s",
        "peak_mem_MiB",
    ]
    if any("MFU_%" in r for r in rows):
        cols += ["model_TFLOP_per_step", "MFU_%"]
    print_table(rows, cols)
    print("wrote", write_results(args.name, {"rows": rows, "notes": notes.strip()}))


if __name__ == "__main__":
    main()
