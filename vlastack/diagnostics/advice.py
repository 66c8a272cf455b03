"""The doctor's recommendations (the usual causes, each with its expected effect) and ``--try``.

Each recommendation is a dict: ``id``, ``title``, ``applies`` (whether the measurements call for
it), ``why`` (the numbers, or why it does not apply), ``expected`` (the effect to expect) and
``overrides`` (the config change, empty when it is a code change or has no config knob).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from vlastack.config import Config, apply_overrides
from vlastack.diagnostics.memory import fmt_bytes

MEMORY_PRESSURE = 0.8  # peak / capacity above which the memory levers apply


def _rec(id_, title, applies, why, expected, overrides=()) -> dict:
    return {"id": id_, "title": title, "applies": bool(applies), "why": why, "expected": expected,
            "overrides": list(overrides)}  # fmt: skip


def device_capacity(on_gpu: bool) -> int | None:
    if on_gpu and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cpu_has_bf16() -> bool:
    cap = torch.backends.cpu.get_cpu_capability().upper()
    return "AMX" in cap or "BF16" in cap or ("AVX512" in cap and _flag("avx512_bf16"))


def _flag(name: str) -> bool:
    try:
        return name in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def recommend(r: dict, cfg: Config, on_gpu: bool, synthetic: bool = False) -> list[dict]:
    """Recommendations for a doctor report ``r`` (see the module docstring)."""
    t, d = cfg.train, cfg.data
    b = r["breakdown_s"]
    step = r["step_time_s"]
    wait = r["data_wait_fraction"]
    bott = r["bottleneck"]
    prof = r["profiled"]
    cores = os.cpu_count() or 1
    out = []

    # ---- numerics first: a diverging run is wrong, not slow
    from vlastack.diagnostics.numerics import suggested_lr

    h = r.get("training_health") or {}
    first = h.get("first_nonfinite_step")
    lr = suggested_lr(t.lr)
    out.append(_rec(
        "diverging", f"lower the learning rate (train.lr={lr:g})", h.get("diverging"),
        (f"loss or gradients non-finite from step {first['step']} ({h['nonfinite_steps']} of {h['steps']} steps)"
         if first else "no step had a non-finite loss or gradient"),
        h.get("advice") or "training stays finite",
        [f"train.lr={lr:g}"],
    ))  # fmt: skip

    # ---- data
    nw = min(max(2, 2 * d.num_workers), max(2, cores))
    compute = step - b["data"] - b["h2d"]
    est = max(compute, b["data"] / nw) if nw else step
    out.append(_rec(
        "num_workers", f"more data-loader workers (data.num_workers={nw})",
        wait >= 0.1 and not t.preload and d.num_workers < nw and not synthetic,
        f"data wait is {wait:.0%} of the step with data.num_workers={d.num_workers}",
        f"loading overlaps compute: step ~{est * 1e3:.0f} ms instead of {step * 1e3:.0f} ms "
        f"(max of compute and data/{nw} workers), if {nw} cores are free",
        [f"data.num_workers={nw}"],
    ))  # fmt: skip
    out.append(_rec(
        "preload", "decode the dataset into memory once (train.preload=true)",
        wait >= 0.25 and not t.preload and not synthetic,
        f"data wait {wait:.0%}: each sample is decoded (video) every epoch",
        "data wait near zero after a one-off decode; needs RAM for the decoded frames (small datasets)",
        ["train.preload=true"],
    ))  # fmt: skip
    out.append(_rec(
        "persistent_workers", "persistent workers", False,
        "already on: vlastack's loader keeps its workers between epochs", "none",
    ))  # fmt: skip
    h2d = b["h2d"] / max(step, 1e-12)
    out.append(_rec(
        "pin_memory", "pinned host memory + non_blocking copies (data.pin_memory=true)",
        on_gpu and h2d >= 0.05 and not d.pin_memory,
        f"host-to-device copy {h2d:.0%} of the step" if on_gpu else "n/a on CPU (no host-to-device copy)",
        "copies overlap compute (to_device already passes non_blocking=True)", ["data.pin_memory=true"],
    ))  # fmt: skip

    # ---- host syncs
    extra = [loc for loc in prof["host_syncs"]["locations"] if "vlastack/train/step.py" not in loc["where"]]
    n_extra = sum(loc["count_per_step"] for loc in extra)
    out.append(_rec(
        "host_syncs", "remove host syncs from the step loop",
        n_extra >= 1,
        "; ".join(f"{loc['count_per_step']:.1f}/step at {loc['where']}" for loc in extra[:4])
        or "only the training step's own loss/grad-norm reads",
        f"on CUDA each sync drains the GPU queue: {n_extra:.0f} fewer stalls per step "
        "(keep values as tensors, read them every log_every steps); on CPU the gain is small",
    ))  # fmt: skip

    # ---- host / launch overhead
    launchy = bott == "launch/host-bound"
    out.append(_rec(
        "compile", "torch.compile the blocks (train.compile=true)",
        (launchy or bott == "memory-bound") and not t.compile,
        f"{r['kernels_per_step']:.0f} ops per step, {r['short_kernel_time_fraction']:.0%} of op time in ops < 10 us",
        "fuses elementwise chains into fewer kernels: typically 1.2-2x on launch/memory-bound GPU steps; "
        "the first steps pay the compile time",
        ["train.compile=true"],
    ))  # fmt: skip
    out.append(_rec(
        "cuda_graphs", "CUDA graphs (torch.compile mode='reduce-overhead')",
        on_gpu and launchy,
        f"GPU busy {r['gpu_busy_fraction']:.0%}" if on_gpu else "n/a on CPU",
        "replays the step's kernels with one launch: removes per-kernel launch gaps; needs static shapes "
        "and no host syncs in the captured region (a code change, no config knob)",
    ))  # fmt: skip
    cap = device_capacity(on_gpu)
    peak = r["memory"]["peak_bytes"]
    pressure = peak / cap if cap else 0.0
    out.append(_rec(
        "batch_size", f"larger batch (train.batch_size={2 * t.batch_size})",
        launchy and peak * 2 < (cap or 0) * MEMORY_PRESSURE,
        f"host-bound with peak memory {fmt_bytes(peak)} of {fmt_bytes(cap or 0)}",
        "the same per-op overhead is spread over twice the samples: samples/s up to ~2x while host-bound "
        "(retune the learning rate)",
        [f"train.batch_size={2 * t.batch_size}"],
    ))  # fmt: skip

    # ---- compute
    bf16_ok = on_gpu or cpu_has_bf16()
    out.append(_rec(
        "bf16", "bf16 autocast (train.precision=bf16)",
        t.precision == "fp32" and bott in ("compute-bound", "memory-bound") and bf16_ok,
        f"fp32 with matmuls {prof['matmul_time_fraction']:.0%} of op time"
        + ("" if bf16_ok else f"; this CPU ({torch.backends.cpu.get_cpu_capability()}) has no native bf16"),
        "tensor-core matmuls (~2x on compute-bound GPU steps) and half-size activations",
        ["train.precision=bf16"],
    ))  # fmt: skip
    out.append(_rec(
        "fused_optimizer", "fused optimizer", False,
        "already: AdamW(fused=True) on CUDA, foreach on CPU (vlastack.train.optim.build_optimizer)", "none",
    ))  # fmt: skip

    # ---- memory capacity
    cats = r["memory"]["categories"]
    press = f"peak {fmt_bytes(peak)} = {pressure:.0%} of {fmt_bytes(cap or 0)}"
    hot = pressure >= MEMORY_PRESSURE
    out.append(_rec(
        "activation_checkpointing", "activation checkpointing (train.activation_checkpointing=true)",
        hot and not t.activation_checkpointing,
        f"{press}; saved activations {fmt_bytes(cats['activations'])}",
        "saved activations shrink to the block inputs (see `vla plan`); ~30% more compute",
        ["train.activation_checkpointing=true"],
    ))  # fmt: skip
    out.append(_rec(
        "adamw8bit", "8-bit AdamW (train.optimizer=adamw8bit)",
        hot and t.optimizer != "adamw8bit",
        f"{press}; optimizer state {fmt_bytes(cats['optimizer_state'])}",
        f"optimizer state ~{fmt_bytes(cats['optimizer_state'] * 0.254)} (needs bitsandbytes, CUDA)",
        ["train.optimizer=adamw8bit"],
    ))  # fmt: skip
    out.append(_rec(
        "lora", "LoRA (train.lora_rank=16)", hot and t.lora_rank == 0,
        f"{press}; gradients + optimizer state {fmt_bytes(cats['gradients'] + cats['optimizer_state'])}",
        "gradients and optimizer state for the adapters only; trains fewer parameters", ["train.lora_rank=16"],
    ))  # fmt: skip
    out.append(_rec(
        "fsdp", "FSDP2 over N GPUs (train.parallel=fsdp under torchrun)", hot and on_gpu and t.parallel != "fsdp",
        press, "parameters, gradients and optimizer state divided by N (see `vla plan` for N=2,4,8)",
    ))  # fmt: skip
    return out


def try_recommendations(
    cfg: Config, report: dict, measure: Callable[[Config, str], tuple[dict, dict]], log=print
) -> list[dict]:
    """Re-run with each applicable recommendation's overrides; the measured changes.

    ``measure(cfg, name)`` runs the doctor's warm-up and timed phases for ``cfg`` and returns
    ``(memory, timing)`` (``Session.memory`` / ``Session.timed``)."""
    base_step, base_sps = report["step_time_s"], report["samples_per_s"]
    base_peak = report["memory"]["peak_bytes"]
    out = []
    for rec in report["recommendations"]:
        if not (rec["applies"] and rec["overrides"]):
            continue
        log(f"doctor: trying {' '.join(rec['overrides'])}")
        try:
            mem, tm = measure(apply_overrides(cfg, rec["overrides"]), rec["id"])
        except (ValueError, RuntimeError, ImportError) as e:
            out.append(
                {"id": rec["id"], "overrides": rec["overrides"], "error": str(e), "result": f"failed: {e}"}
            )
            continue
        row = {
            "id": rec["id"],
            "overrides": rec["overrides"],
            "step_time_s": tm["step_time_s"],
            "samples_per_s": tm["samples_per_s"],
            "data_wait_fraction": tm["data_wait_fraction"],
            "peak_bytes": mem["peak_bytes"],
            "step_time_change": tm["step_time_s"] / base_step - 1,
            "samples_per_s_change": tm["samples_per_s"] / base_sps - 1,
            "peak_change": mem["peak_bytes"] / max(base_peak, 1) - 1,
        }
        row["result"] = (
            f"step {base_step * 1e3:.1f} -> {tm['step_time_s'] * 1e3:.1f} ms ({row['step_time_change']:+.0%}), "
            f"samples/s {row['samples_per_s_change']:+.0%}, data wait {report['data_wait_fraction']:.0%} -> "
            f"{tm['data_wait_fraction']:.0%}, peak {fmt_bytes(base_peak)} -> {fmt_bytes(mem['peak_bytes'])}"
        )
        out.append(row)
    return out
