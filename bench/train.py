"""Training throughput (samples/s) and peak memory: tiny and small on CPU; pi0 on a GPU.

    .venv/bin/python bench/train.py [--steps 5] [--presets tiny,small,demo] [--cpu-precisions fp32,bf16]
    .venv/bin/python bench/train.py --ab fp32,fp32+fused,bf16 --reps 7 --steps 3 --name train_ab

``--ab`` times variants of the demo step interleaved (medians of wall and process CPU time per
step), for A/B decisions on a machine other jobs share; run it once more under
``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` for an AVX2-only CPU.

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
from vlastack.train.parallel import apply_activation_checkpointing, apply_compile
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


def build_variant(spec: str, batch_size: int = 32) -> dict:
    """A demo-preset training step for A/B timing. ``spec``: precision plus options joined by '+':
    ``fp32``, ``bf16``, ``fp32+fused`` (AdamW's fused CPU kernel instead of foreach),
    ``fp32+compile`` (torch.compile of the whole model: forward and backward),
    ``fp32+regional`` (``train.compile``: each block compiled, ``apply_compile``),
    ``fp32+threads1`` (one intra-op thread)."""
    from vlastack.apps.demo import demo_config

    precision, *opts = spec.split("+")
    cfg = demo_config("tiny", None, [f"train.precision={precision}"], precision=precision)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = build_optimizer(model, cfg.train)
    if "fused" in opts:
        groups = [{k: v for k, v in g.items() if k not in ("foreach", "fused")} for g in opt.param_groups]
        opt = torch.optim.AdamW(groups, lr=cfg.train.lr, betas=cfg.train.betas, fused=True)
    if "compile" in opts:
        model.compile(fullgraph=True, dynamic=False)
    if "regional" in opts:
        apply_compile(model)
    batch = dummy_batch(cfg.model, batch_size)
    threads = 1 if "threads1" in opts else None

    def step():
        return train_step(model, opt, [batch], device_type="cpu", precision=precision)

    t0 = time.perf_counter()
    with _threads(threads):
        step()  # warm-up (and compilation)
        first = time.perf_counter() - t0
        step()
    return {"spec": spec, "step": step, "threads": threads, "first_step_s": first}


class _threads:
    def __init__(self, n: int | None) -> None:
        self.n, self.old = n, torch.get_num_threads()

    def __enter__(self) -> None:
        if self.n:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.old)


def ab(specs: list[str], reps: int, steps: int) -> list[dict]:
    """Interleaved A/B: each rep times ``steps`` steps of every variant in turn (a noisy neighbour
    then hits all of them alike); per-step medians over reps of wall and process CPU time."""
    import statistics

    variants = [build_variant(s) for s in specs]
    wall: dict[str, list[float]] = {s: [] for s in specs}
    cpu: dict[str, list[float]] = {s: [] for s in specs}
    for r in range(reps):
        for v in variants:
            with _threads(v["threads"]):
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(steps):
                    v["step"]()
                wall[v["spec"]].append((time.perf_counter() - t0) / steps)
                cpu[v["spec"]].append((time.process_time() - c0) / steps)
        print(f"rep {r + 1}/{reps}: " + ", ".join(f"{s} {wall[s][-1]:.3f}s" for s in specs), flush=True)
    return [
        {
            "preset": "demo",
            "variant": v["spec"],
            "batch": 32,
            "reps": reps,
            "steps_per_rep": steps,
            "step_s_median": round(statistics.median(wall[v["spec"]]), 4),
            "step_s_min": round(min(wall[v["spec"]]), 4),
            "cpu_s_per_step_median": round(statistics.median(cpu[v["spec"]]), 4),
            "first_step_s": round(v["first_step_s"], 2),
        }
        for v in variants
    ]


def machine() -> dict:
    """CPU flags that decide bf16 speed, ATen's kernel level, the load, the date."""
    import datetime
    import os

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    flags = next((ln for ln in lines if ln.startswith("flags")), "")
    keep = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni", "avx_vnni")
    return {
        "cpu_flags": [f for f in keep if f in flags.split()],
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY", ""),
        "loadavg_1min_at_end": os.getloadavg()[0],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--presets", default="tiny,small,demo", help="CPU rows; '' for none")
    ap.add_argument("--cpu-precisions", default="fp32,bf16", help="CPU rows per preset")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pi0-batches", default="32,16,8,4,2,1", help="tried largest first")
    ap.add_argument("--name", default="train", help="results file (bench/results/NAME.json)")
    ap.add_argument("--ab", default="", help="interleaved A/B of demo variants, e.g. fp32,fp32+fused,bf16")
    ap.add_argument("--reps", type=int, default=7, help="--ab: interleaved repetitions (medians over them)")
    ap.add_argument("--note", default="", help="--ab: a note stored with the rows (e.g. 'machine shared')")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.ab:
        rows = ab(args.ab.split(","), args.reps, args.steps)
        print_table(rows, list(rows[0]))
        payload = {"rows": rows, "machine": machine(), "notes": args.note}
        print("wrote", write_results(args.name, payload))
        return
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
