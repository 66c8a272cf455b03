"""Issues #23/#40 on one GPU, in one command: Pi0/Pi0.5 inference latency (eager, fast path, CUDA
graph, compiled + graph), a breakdown and kernel counts, memory, training MFU and LoRA samples/s,
the pi05_lora_24gb recipe's real peak (``recipe24``), ``vla serve --fast`` against ``Policy.infer``
with the real openpi client and real-time chunking on the fast policy (``serve``), and LeRobot's
PI0Policy/PI05Policy side by side. Writes bench/results/latency_cuda.json (merged per
part, saved after every figure, so a run cut short keeps what it measured).

    python3 bench/latency_gpu.py                          # GPU: every part, in priority order, <= --budget-s
    python3 bench/latency_gpu.py --parts compile,lerobot-compile   # a second command: the slow parts
    python3 bench/latency_gpu.py --lerobot                # = --parts lerobot (LeRobot side only)
    python3 bench/latency_gpu.py --smoke                  # CPU, tiny shapes: checks the script (no figures)

Shapes (full size, random weights): pi0 with 3 cameras and a 48-token prompt, pi0.5 with 2 cameras
and its 200-token prompt; 224x224 images, chunk 50, 10 Euler steps, batch 1/4/16. Modes:

- ``eager``: ``model.sample_actions`` with fp32 weights under bf16 autocast (the earlier baseline);
- ``fast-eager``: ``prepare_for_inference`` (bf16 weights, fused QKV/gate-up, folded norms, time
  tables) and ``StaticSampler`` without capture;
- ``fast-graph``: the same function captured in one CUDA graph (prefix pass + all steps);
- ``fast-compile-graph``: prefix pass and Euler step torch.compiled (inductor), then captured;
- ``fast-compile-autotune-graph`` (``--compile-variants default,autotune``): the same in
  inductor's ``max-autotune-no-cudagraphs`` mode (GEMM configs benchmarked for the step's 50-row
  matmuls; a longer warm-up);
- ``fast-compile-layers-graph`` (``--compile-variants layers``): one layer of each kind compiled
  and shared by all layers (``fastpath.compile_layers``), then the whole call captured: a shorter
  warm-up, no fusion across layers.

``model_p50_ms`` is the sampler alone on device-resident inputs; ``policy_p50_ms`` is
``Policy.infer`` end to end (numpy obs in, actions out, tokenization and normalization included).
``warmup_s``: first call (compile + capture). ``breakdown``: prefix pass and one Euler step, each
captured alone and replayed; host = policy - model. ``kernels``: CUDA kernels per call from
torch.profiler (a graph replays the same kernels in one launch). Training: ``train_step`` (bf16
autocast, fused AdamW, activation checkpointing) at the largest batch that fits; FLOPs from
FlopCounterMode on that step (``hw_flops`` counts the recomputed forward; ``model_flops`` subtracts
one forward counted alone) over 989 TFLOP/s dense bf16.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, environment, percentile, sync, time_fn  # noqa: E402
from bench.serve import start_server  # noqa: E402
from vlastack.batch import dummy_batch  # noqa: E402
from vlastack.config import load_config  # noqa: E402
from vlastack.infer.policy import Policy  # noqa: E402
from vlastack.models import build_model  # noqa: E402
from vlastack.models.heads.flow.fastpath import StaticSampler, prepare_for_inference, uncompile_layers  # noqa: E402

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "4090": 165e12}
# the row each torch.compile mode's figures go under (fastpath.COMPILE_MODES)
# --compile-variants: row name, torch.compile mode, compile scope (fastpath.compile_layers)
COMPILE_ROWS = {
    "default": ("fast-compile-graph", None, "whole"),
    "autotune": ("fast-compile-autotune-graph", "max-autotune-no-cudagraphs", "whole"),
    "layers": ("fast-compile-layers-graph", None, "layers"),
}
PARTS = ("infer", "train", "recipe24", "serve", "lerobot", "compile", "lerobot-compile")
PRESET_CAMERAS = {
    "pi0": ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
    "pi05": ("base_0_rgb", "left_wrist_0_rgb"),
}
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


class Results:
    """The JSON file, merged into and written after every update."""

    def __init__(self, path: Path, smoke: bool) -> None:
        self.path = path
        old = json.loads(path.read_text()) if path.exists() and not smoke else {}
        self.data = old if old.get("schema") == "latency_gpu/1" else {"schema": "latency_gpu/1"}
        if old and old.get("schema") != "latency_gpu/1":  # bench/latency.py's figures: kept, not merged
            self.data["previous"] = old
        self.data.setdefault("sections", {})
        self.data.setdefault("skipped", {})
        self.data["environment"] = environment()
        self.data["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.data["smoke"] = smoke

    def put(self, section: str, key: str, value) -> None:
        self.data["sections"].setdefault(section, {})[key] = value
        self.data["skipped"].pop(f"{section}/{key}", None)
        self.save()

    def skip(self, what: str, why: str) -> None:
        log(f"SKIP {what}: {why}")
        self.data["skipped"][what] = why
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str))


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds

    def left(self) -> float:
        return self.deadline - time.perf_counter()


def guarded(res: Results, what: str, fn: Callable[[], None]) -> None:
    """Run one measurement; on failure record why and go on (free the GPU memory it held)."""
    try:
        fn()
    except Exception as e:  # a bench records every failure and continues
        traceback.print_exc()
        res.skip(what, f"{type(e).__name__}: {str(e)[:400]}")
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def timed(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2) -> dict:
    ms = time_fn(fn, device, warmup=warmup, repeats=repeats)
    return {"p50_ms": round(percentile(ms, 50), 3), "p90_ms": round(percentile(ms, 90), 3), "n": repeats}


def first_call_s(fn: Callable[[], object], device: torch.device) -> float:
    t0 = time.perf_counter()
    fn()
    sync(device)
    return round(time.perf_counter() - t0, 2)


def model_config(preset: str, smoke: bool):
    """Full-size presets (random weights), or tiny shapes with the same structure for --smoke."""
    variant = "pi05" if preset == "pi05" else "pi0"
    if smoke:
        cfg = load_config("tiny", overrides=[f"model.head_options.variant={variant}"]).model
        cams = tuple(f"cam{i}" for i in range(len(PRESET_CAMERAS[preset])))
        # pi0.5 writes the state into the prompt: the tiny preset's 88 tokens do not hold it
        text = 128 if variant == "pi05" else cfg.max_text_len
        return replace(cfg, camera_names=cams, max_text_len=text).with_head_options(num_denoise_steps=3)
    cfg = load_config(preset).model
    return replace(cfg, camera_names=PRESET_CAMERAS[preset], action_horizon=50).with_head_options(
        num_denoise_steps=10
    )


def observations(cfg, n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    s = cfg.vision.image_size
    return [
        {
            "images": {c: rng.integers(0, 256, (s, s, 3), dtype=np.uint8) for c in cfg.camera_names},
            "state": rng.normal(size=cfg.state_dim).astype(np.float32),
            "prompt": "pick up the red block and put it in the bowl",
        }
        for _ in range(n)
    ]


def kernel_count(fn: Callable[[], object], device: torch.device) -> dict:
    """Kernels (and memcpy/memset) one call launches, and their summed device time, from the
    profiler. On CPU (--smoke) it counts the aten ops instead."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        sync(device)
    events = prof.events()
    if device.type == "cuda":
        dev = [e for e in events if e.device_type == DeviceType.CUDA]
        times = [getattr(e, "device_time", getattr(e, "cuda_time", 0.0)) / 1e3 for e in dev]
        return {"kernels": len(dev), "kernel_time_ms": round(sum(times), 3),
                "top": top_kernels([e.name for e in dev], times)}  # fmt: skip
    ops = [e for e in events if e.name.startswith("aten::")]
    return {"aten_ops": len(ops), "top": top_kernels([e.name for e in ops], [0.0] * len(ops))}


def top_kernels(names: list[str], times_ms: list[float], n: int = 15) -> list[dict]:
    """The ``n`` kernel names with the most summed time (then count): where a call's ~3,400
    kernels go, so the next fusion is chosen from a measurement. Names are cut to 90 characters."""
    by: dict[str, list[float]] = {}
    for name, t in zip(names, times_ms):
        row = by.setdefault(name[:90], [0, 0.0])
        row[0] += 1
        row[1] += t
    rows = sorted(by.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))[:n]
    return [{"name": k, "count": c, "ms": round(t, 3)} for k, (c, t) in rows]


def graph_replay_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Capture ``fn`` alone in a CUDA graph and time its replays (CPU: time it eagerly)."""
    if device.type != "cuda":
        return timed(fn, device, repeats)["p50_ms"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(), fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return timed(g.replay, device, repeats)["p50_ms"]


def breakdown(sampler: StaticSampler, device: torch.device, repeats: int) -> dict:
    """Prefix pass and one Euler step, each captured alone (after ``sampler`` ran once)."""
    m = sampler.model
    prefill = lambda: sampler._prefill(m, sampler.inputs, sampler.cache)  # noqa: E731
    cache, positions, mask, state = prefill()
    x = sampler.noise.clone()
    step = lambda: sampler._step(cache, state, x, sampler.rows[0], positions, mask)  # noqa: E731
    out = {
        "prefix_ms": graph_replay_ms(prefill, device, repeats),
        "step_ms": graph_replay_ms(step, device, repeats),
    }
    out["prefix_plus_steps_ms"] = round(out["prefix_ms"] + sampler.num_steps * out["step_ms"], 3)
    return out


# ----------------------------------------------------------------------------- inference


def bench_inference(res: Results, preset: str, args, budget: Budget, compile_only: bool) -> None:
    dev = torch.device(args.device)
    cfg = model_config(preset, args.smoke)
    sec = f"infer/{preset}"
    res.put(sec, "shapes", {
        "cameras": len(cfg.camera_names), "image": cfg.vision.image_size, "text_tokens": cfg.max_text_len,
        "prefix_len": cfg.prefix_len, "chunk": cfg.action_horizon, "steps": cfg.head_options.num_denoise_steps,
    })  # fmt: skip
    log(f"{preset}: building the model ({dev})")
    torch.manual_seed(0)
    model = build_model(cfg, device=dev).eval()
    res.put(sec, "params", model.num_params())
    batches = {b: dummy_batch(cfg, b, train=False, seed=b, device=dev) for b in args.batches}
    noises = {b: torch.randn(b, cfg.action_horizon, cfg.action_dim, device=dev) for b in args.batches}
    reps = args.repeats
    gpu = dev.type == "cuda"  # --smoke on the CPU: fp32 (CPU bf16 is slow and checks nothing more)

    if not compile_only:

        def eager() -> None:
            def call():
                with torch.inference_mode(), torch.autocast(dev.type, torch.bfloat16, enabled=gpu):
                    return model.sample_actions(batches[1], noise=noises[1])

            row = timed(call, dev, max(3, reps // 4), warmup=1)
            row["kernels"] = kernel_count(call, dev)
            res.put(sec, "eager_autocast_fp32_weights_b1", row)
            log(f"{preset} eager b1: {row}")

        guarded(res, f"{sec}/eager_autocast_fp32_weights_b1", eager)

    t0 = time.perf_counter()
    prepare_for_inference(model, torch.bfloat16 if gpu else torch.float32)
    sync(dev)
    res.put(sec, "prepare_s", round(time.perf_counter() - t0, 2))
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    res.put(sec, "weights_gib", round(weights / 2**30, 3))
    # one row name per torch.compile mode: fast-compile-graph (default), fast-compile-autotune-graph
    compiled = {COMPILE_ROWS[v][0]: COMPILE_ROWS[v][1:] for v in args.compile_variants}
    modes = list(compiled) if compile_only else ["fast-eager", "fast-graph"]
    refs: dict[int, torch.Tensor] = {}  # batch size -> the uncompiled static function's answer
    for mode in modes:
        compile = mode in compiled
        for b in args.compile_batches if compile else {"fast-eager": [1]}.get(mode, args.batches):
            if budget.left() < (150 if compile else 20):
                res.skip(f"{sec}/{mode}_b{b}", f"budget: {budget.left():.0f} s left")
                continue

            def run_mode(mode=mode, b=b, compile=compile) -> None:
                if compile:
                    torch._dynamo.reset()
                cmode, scope = compiled.get(mode, (None, "whole"))
                uncompile_layers(model)  # a layers row before this one compiled them in place
                if compile and b not in refs:  # one reference per batch size for every compiled row
                    with torch.inference_mode():
                        refs[b] = StaticSampler(model)(batches[b], noises[b])
                ref = refs.get(b) if compile else None
                sampler = StaticSampler(
                    model,
                    graph=mode != "fast-eager",
                    compile=compile,
                    compile_mode=cmode,
                    compile_scope=scope,
                )
                call = lambda: sampler(batches[b], noises[b])  # noqa: E731
                with torch.inference_mode():
                    if dev.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(dev)
                    row = {"warmup_s": first_call_s(call, dev)}
                    row.update(timed(call, dev, reps))
                    row["samples_per_s"] = round(b * 1e3 / row["p50_ms"], 2)
                    if ref is not None:  # same inputs every call: ``out`` is the last call's answer
                        row["rel_err_vs_fast_eager"] = float((sampler.out - ref).norm() / ref.norm())
                    if dev.type == "cuda":
                        row["peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 3)
                        row["peak_over_weights_gib"] = round(row["peak_gib"] - weights / 2**30, 3)
                    if b == 1:
                        if mode != "fast-graph":  # a graph replays the same kernels as the function
                            plain = (
                                StaticSampler(model, compile=compile, compile_mode=cmode, compile_scope=scope)
                                if compile
                                else sampler
                            )
                            plain._prefill, plain._step = sampler._prefill, sampler._step
                            row["kernels"] = kernel_count(lambda: plain(batches[1], noises[1]), dev)
                        row["breakdown"] = breakdown(sampler, dev, reps)
                        if mode != "fast-eager":
                            try:  # a failure here must not lose the model's figures above
                                row["policy"] = policy_latency(model, cfg, dev, reps, compile, cmode, scope)
                                host = row["policy"]["p50_ms"] - row["p50_ms"]
                                row["policy"]["host_ms"] = round(host, 3)
                            except Exception as e:  # recorded; the bench goes on
                                row["policy"] = {"error": f"{type(e).__name__}: {e}"}
                                log(f"SKIP {sec}/{mode}_b{b}/policy: {type(e).__name__}: {e}")
                res.put(sec, f"{mode}_b{b}", row)
                log(f"{preset} {mode} b{b}: {row}")

            guarded(res, f"{sec}/{mode}_b{b}", run_mode)
    if compile_only:
        torch._dynamo.reset()


def policy_latency(
    model,
    cfg,
    dev: torch.device,
    reps: int,
    compile: bool,
    compile_mode: str | None = None,
    scope: str = "whole",
) -> dict:
    """``Policy.infer`` end to end at batch 1 on an already prepared model."""
    dtype = "bf16" if dev.type == "cuda" else None
    kw = {"compile_mode": compile_mode, "compile_scope": scope} if compile else {}
    policy = Policy(model, device=dev, dtype=dtype, fast=True, compile=compile, seed=0, **kw)
    obs = observations(cfg, 1)[0]
    out = {"warmup_s": first_call_s(lambda: policy.infer(obs), dev)}
    out.update(timed(lambda: policy.infer(obs), dev, reps))
    return out


# ----------------------------------------------------------------------------- training


def train_batch_fits(model, opt, cfg, b: int, dev: torch.device, precision: str):
    from vlastack.train.step import train_step

    batch = dummy_batch(cfg, b, train=True, seed=0, device=dev)
    train_step(model, opt, [batch], device_type=dev.type, precision=precision)
    return batch


def bench_training(res: Results, args, budget: Budget) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from vlastack.nn.lora import apply_lora
    from vlastack.train.optim import build_optimizer
    from vlastack.train.parallel import apply_activation_checkpointing, apply_compile
    from vlastack.train.step import train_step

    dev = torch.device(args.device)
    full = load_config("tiny" if args.smoke else "pi0")
    cfg = model_config("pi0", args.smoke)
    full = replace(full, model=cfg)
    precision = "bf16" if dev.type == "cuda" else "fp32"
    bf16 = precision == "bf16"
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in gpu), PEAK_BF16["H100"])
    sec = "train/pi0"

    def run(kind: str) -> None:
        torch.manual_seed(0)
        model = build_model(cfg, device=dev).train()
        if kind.startswith("lora"):
            t = full.train
            apply_lora(model, t.lora_targets, 16, t.lora_alpha)
        apply_activation_checkpointing(model)
        opt = build_optimizer(model, full.train)
        compiled = kind.endswith("-compile")
        batch = None
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        for b in args.train_batches:
            try:
                batch = train_batch_fits(model, opt, cfg, b, dev, precision)
                break
            except torch.OutOfMemoryError:
                log(f"train {kind}: batch {b} does not fit")
            # Freed here, outside the except block: while the exception lives, its traceback keeps
            # the failed step's activations alive, and every smaller batch then ran out of memory
            # too (the first H100 run: no batch of 32/16/8 fitted, though 8 needs 47 GiB alone).
            opt.zero_grad(set_to_none=True)
            gc.collect(), torch.cuda.empty_cache()
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
        if batch is None:
            raise RuntimeError(f"no batch in {args.train_batches} fits")
        b = batch["state"].shape[0]
        # FLOPs are linear in the batch: counted on one sample and scaled. Counting the timed batch
        # itself ran out of memory on the H100 at batch >= 12 (the counter holds more than a step).
        # Counted eagerly, before any compile: the compiled step computes the same FLOPs.
        one = dummy_batch(cfg, 1, train=True, seed=0, device=dev)
        with FlopCounterMode(display=False) as fc:
            train_step(model, opt, [one], device_type=dev.type, precision=precision)
        hw = fc.get_total_flops() * b
        with (
            FlopCounterMode(display=False) as fc,
            torch.no_grad(),
            torch.autocast(dev.type, torch.bfloat16, enabled=bf16),
        ):
            model(one)  # one forward alone: what checkpointing recomputes, at most
        fwd = fc.get_total_flops() * b
        step = lambda: train_step(model, opt, [batch], device_type=dev.type, precision=precision)  # noqa: E731
        row = {"batch": b, "precision": precision, "activation_checkpointing": True}
        if compiled:  # as train.compile=true does it: the whole model, fullgraph, static shapes
            apply_compile(model)
            row["compile"] = "fullgraph"
            row["warmup_s"] = first_call_s(step, dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        row.update(timed(step, dev, args.train_steps, warmup=1))
        row["samples_per_s"] = round(b * 1e3 / row["p50_ms"], 2)
        if dev.type == "cuda":
            row["peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
        row.update(hw_flops=hw, forward_flops=fwd, model_flops=hw - fwd, flops_counted_at_batch=1)
        if dev.type == "cuda":
            row["mfu_hw"] = round(hw / (row["p50_ms"] / 1e3) / peak, 4)
            row["mfu_model"] = round((hw - fwd) / (row["p50_ms"] / 1e3) / peak, 4)
            row["peak_flops"] = peak
        res.put(sec, kind, row)
        log(f"train {kind}: {row}")

    for kind in args.train_kinds:
        if budget.left() < (150 if kind.endswith("-compile") else 60):
            res.skip(f"{sec}/{kind}", f"budget: {budget.left():.0f} s left")
            continue
        guarded(res, f"{sec}/{kind}", lambda kind=kind: run(kind))


def bench_recipe_24gb(res: Results, args, budget: Budget) -> None:
    """``--preset pi05 --config pi05_lora_24gb`` as the trainer builds it (frozen vision, LoRA r=16,
    activation checkpointing, bf16 autocast, fused AdamW): the real peak and samples/s at each of
    ``--recipe-batches``, beside ``vla plan --target cuda``'s prediction (docs/gpu.md: 17.51 GiB at
    micro-batch 16, 30 the largest under 22 GiB)."""
    from vlastack.nn.lora import apply_lora
    from vlastack.train.optim import build_optimizer, freeze_parts
    from vlastack.train.parallel import apply_activation_checkpointing
    from vlastack.train.step import train_step

    dev = torch.device(args.device)
    cfg = load_config("tiny" if args.smoke else "pi05", "pi05_lora_24gb")
    if args.smoke:
        cfg = replace(cfg, model=model_config("pi05", True))
    t = cfg.train
    precision = "bf16" if dev.type == "cuda" else "fp32"
    sec = "train/pi05_lora_24gb"
    torch.manual_seed(0)
    model = build_model(cfg.model, device=dev).train()
    freeze_parts(model, t)
    apply_lora(model, t.lora_targets, t.lora_rank, t.lora_alpha, t.lora_dropout)
    freeze_parts(model, t)  # as the trainer: the frozen vision tower's adapters stay frozen
    apply_activation_checkpointing(model)
    opt = build_optimizer(model, t)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    for b in args.recipe_batches:
        if budget.left() < 40:
            res.skip(f"{sec}/b{b}", f"budget: {budget.left():.0f} s left")
            continue

        def one(b=b) -> None:
            batch = dummy_batch(cfg.model, b, train=True, seed=0, device=dev)
            step = lambda: train_step(model, opt, [batch], device_type=dev.type, precision=precision)  # noqa: E731
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            row = {"batch": b, "precision": precision, "weights_gib": round(weights / 2**30, 2)}
            row["trainable_params"] = trainable
            row.update(timed(step, dev, args.train_steps, warmup=1))
            row["samples_per_s"] = round(b * 1e3 / row["p50_ms"], 2)
            if dev.type == "cuda":
                row["peak_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
                row["reserved_gib"] = round(torch.cuda.max_memory_reserved(dev) / 2**30, 2)
            res.put(sec, f"b{b}", row)
            log(f"recipe24 b{b}: {row}")

        guarded(res, f"{sec}/b{b}", one)
        opt.zero_grad(set_to_none=True)


def install_wheels(wheels: list[Path], site: Path) -> None:
    """Carried wheels into ``site`` with no index and no dependency resolution (the GPU image
    reaches no registry)."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    proc = subprocess.run([*cmd, "--target", str(site), *map(str, wheels)], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"pip install of .gpu_wheels failed: {proc.stderr.strip()[-600:]}")


def serve_env() -> dict:
    """websockets and openpi-client for ``vla serve`` and its client: the GPU image has neither, so
    their wheels (scripts/gpu_wheels.sh) are installed with no index into /tmp/serve-site, put on
    this process's path and the server's PYTHONPATH. -> the server's environment."""
    env = dict(os.environ)
    try:
        import openpi_client.websocket_client_policy  # noqa: F401
        import websockets  # noqa: F401

        return env
    except ImportError:
        pass
    site = Path("/tmp/serve-site")
    wheels = [w for w in (ROOT / ".gpu_wheels").glob("*.whl") if w.name.startswith(("websockets", "openpi"))]
    if len(wheels) < 2:
        raise RuntimeError(
            "websockets/openpi-client wheels missing in .gpu_wheels: run scripts/gpu_wheels.sh"
        )
    install_wheels(wheels, site)
    sys.path.insert(0, str(site))
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def bench_serve(res: Results, args, budget: Budget) -> None:
    """``vla serve --fast`` (compiled, bf16, one CUDA graph) answering the real openpi client on
    loopback, against ``Policy.infer`` on the same folder in this process: the server's overhead
    (target <= 1 ms). pi0, 3 cameras, batch 1; the server runs first, then the in-process policy."""
    import tempfile

    dev, cuda = args.device, args.device == "cuda"
    env = serve_env()
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    sec = "serve/pi0"
    cfg = model_config("pi0", args.smoke)
    folder = Path(tempfile.mkdtemp(prefix="vla-serve-"))
    torch.manual_seed(0)
    model = build_model(cfg, device=dev)
    if cuda:
        model.to(torch.bfloat16)  # half the bytes to write; the fast path stores bf16 weights anyway
    model.save_pretrained(folder)
    del model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    obs = observations(cfg, 1)[0]
    # --warmup: the server compiles and captures each sampler (plain, RTC, BID) before listening
    flags = ["--fast", "--device", dev, "--warmup"] + (["--dtype", "bf16", "--compile"] if cuda else [])
    t0 = time.perf_counter()
    proc, port = start_server(folder, 1, extra=tuple(flags), env=env, timeout_s=min(420, budget.left()))
    row: dict = {"flags": " ".join(flags), "server_start_s": round(time.perf_counter() - t0, 2)}
    try:
        client = WebsocketClientPolicy("127.0.0.1", port)
        t0 = time.perf_counter()
        client.infer(obs)  # warm already (--warmup): the first request, compared with the rest
        row["server_first_request_s"] = round(time.perf_counter() - t0, 2)
        client.infer(obs)
        ms, server_ms = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = client.infer(obs)
            ms.append((time.perf_counter() - t0) * 1e3)
            server_ms.append(out["server_timing"]["infer_ms"])
        row.update(serve_p50_ms=round(percentile(ms, 50), 3), serve_p90_ms=round(percentile(ms, 90), 3))
        row["server_infer_p50_ms"] = round(percentile(server_ms, 50), 3)
    finally:
        proc.terminate()
        proc.wait(30)
    policy = Policy.from_pretrained(
        folder, device=dev, fast=True, compile=cuda, dtype="bf16" if cuda else None, seed=0
    )
    row["policy_warmup_s"] = first_call_s(lambda: policy.infer(obs), torch.device(dev))
    row.update(
        {
            f"policy_{k}": v
            for k, v in timed(lambda: policy.infer(obs), torch.device(dev), args.repeats).items()
        }
    )
    row["overhead_ms"] = round(row["serve_p50_ms"] - row["policy_p50_ms"], 3)
    res.put(sec, "b1", row)
    # Real-time chunking on the fast policy: training-time RTC (pi0) runs the static prefix
    # sampler and BID its K candidates through the plain one, each one CUDA graph; guided RTC (a
    # VJP per step, docs/rtc.md) runs the prepared model's generic path, eager and uncaptured
    prefix = np.zeros((cfg.action_horizon // 2, policy.action_dim), np.float32)
    for method in ("rtc_training", "rtc_inference", "bid"):
        if budget.left() < 30:
            break
        req = {**obs, "action_prefix": prefix, "inference_delay": 4, "rtc_method": method}
        row[f"policy_{method}_p50_ms"] = timed(lambda r=req: policy.infer(r), torch.device(dev), 5, 1)[
            "p50_ms"
        ]
        res.put(sec, "b1", row)
    log(f"serve: {row}")
    shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------------------- LeRobot


def lerobot_env(args) -> tuple[str, dict]:
    """lerobot 0.6.1 and its pure-Python needs from .gpu_wheels/ installed with no index into a
    folder put first on PYTHONPATH for LeRobot's process only (its transformers 5.5 then shadows
    the image's newer one). Not a venv: the image's python3 is itself a venv, and a venv made from
    it with --system-site-packages would see the base interpreter's packages, not its torch.
    -> (python, environment for the subprocess)."""
    env = dict(os.environ)
    if args.lerobot_python:
        return args.lerobot_python, env
    site = Path(args.lerobot_site)
    wheels = sorted((ROOT / ".gpu_wheels").glob("*.whl"))
    if not wheels:
        raise RuntimeError(
            "no wheels in .gpu_wheels: run scripts/gpu_wheels.sh where PyPI is reachable, carry it"
        )
    if not (site / "lerobot").is_dir():
        install_wheels(wheels, site)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["HF_HUB_OFFLINE"] = "1"
    return sys.executable, env


def bench_lerobot(res: Results, args, budget: Budget, compile: bool) -> None:
    """LeRobot's PI0Policy / PI05Policy at the same shapes, in its own process (its
    transformers 5.5 must not shadow ours); bench/lerobot_side.py writes a JSON after every figure."""
    sec = "lerobot"
    try:
        py, env = lerobot_env(args)
    except Exception as e:
        res.skip(f"{sec}/install", f"{type(e).__name__}: {e}")
        return
    out = Path(args.lerobot_out)
    out.unlink(missing_ok=True)
    seconds = max(0.0, budget.left() - 10)
    cmd = [py, str(ROOT / "bench" / "lerobot_side.py"), "--out", str(out), "--budget-s", str(int(seconds))]
    cmd += ["--batches", ",".join(map(str, args.batches)), "--repeats", str(args.repeats)]
    cmd += ["--train-batches", ",".join(map(str, args.train_batches)), "--device", args.device]
    cmd += ["--kinds", args.lerobot_kinds] + (["--compile"] if compile else [])
    cmd += ["--smoke"] if args.smoke else []
    log(f"LeRobot: {' '.join(cmd)}")
    try:
        proc = subprocess.run(cmd, timeout=seconds + 5, capture_output=True, text=True, env=env)
        print(proc.stdout[-6000:], proc.stderr[-6000:], sep="\n", flush=True)
        if proc.returncode:
            res.skip(f"{sec}/process", f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
    except subprocess.TimeoutExpired:
        res.skip(f"{sec}/process", f"killed at the budget ({seconds:.0f} s); rows written before are kept")
    if out.exists():
        side = json.loads(out.read_text())
        if "versions" in side:
            res.put(sec, "versions", side["versions"])
        for k, v in side.get("rows", {}).items():
            res.put(sec + ("-compile" if compile else ""), k, v)
        for k, v in side.get("skipped", {}).items():
            res.skip(f"{sec}/{k}", v)


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma list, in this order of priority: {PARTS}"
    )
    ap.add_argument("--presets", default="pi0,pi05")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument(
        "--compile-batches", default="1", help="batches for the compiled variant (one compile each)"
    )
    ap.add_argument(
        "--compile-variants",
        default="default",
        help="the compile part's variants, in order, each its own row: default (whole prefix pass and "
        "step), autotune (the same in max-autotune-no-cudagraphs), layers (one layer of each kind)",
    )
    ap.add_argument("--train-batches", default="32,24,16,8", help="tried in order until one fits")
    ap.add_argument(
        "--train-kinds",
        default="full,lora",
        help="from full, lora, full-compile, lora-compile (-compile: train.compile=true, the whole model)",
    )
    ap.add_argument("--recipe-batches", default="16,30", help="micro-batches of pi05_lora_24gb")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--train-steps", type=int, default=5)
    ap.add_argument(
        "--budget-s", type=float, default=510, help="wall budget; parts that do not fit are skipped"
    )
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script only")
    ap.add_argument("--lerobot", action="store_true", help="only the LeRobot side (= --parts lerobot)")
    ap.add_argument(
        "--lerobot-python", default=None, help="a python that imports lerobot already (skip the install)"
    )
    ap.add_argument("--lerobot-kinds", default="pi0,pi05", help="LeRobot policies to build, in order")
    ap.add_argument("--lerobot-site", default="/tmp/lerobot-site", help="where .gpu_wheels are installed")
    ap.add_argument("--lerobot-out", default="/tmp/lerobot_side.json")
    ap.add_argument("--out", default=None, help="results path (default bench/results/latency_cuda.json)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        raise SystemExit("no CUDA device: this bench measures a GPU (use --smoke to check it on a CPU)")
    args.device = "cuda" if cuda and not args.smoke else "cpu"
    args.batches = [int(b) for b in args.batches.split(",")]
    args.train_batches = [int(b) for b in args.train_batches.split(",")]
    args.compile_batches = [int(b) for b in args.compile_batches.split(",")]
    args.recipe_batches = [int(b) for b in args.recipe_batches.split(",")]
    args.train_kinds = args.train_kinds.split(",")
    args.compile_variants = args.compile_variants.split(",")
    if bad := set(args.compile_variants) - set(COMPILE_ROWS):
        raise SystemExit(f"unknown --compile-variants {sorted(bad)}; choose from {', '.join(COMPILE_ROWS)}")
    if bad := set(args.train_kinds) - {"full", "lora", "full-compile", "lora-compile"}:
        raise SystemExit(f"unknown --train-kinds {sorted(bad)}; choose from full, lora and their -compile")
    parts = ["lerobot"] if args.lerobot else args.parts.split(",")
    if bad := set(parts) - set(PARTS):
        raise SystemExit(f"unknown parts {sorted(bad)}; choose from {PARTS}")
    if args.smoke:
        args.batches, args.train_batches, args.compile_batches = [1, 2], [2], [1]
        args.recipe_batches = [2]
        args.repeats, args.train_steps = min(args.repeats, 3), min(args.train_steps, 2)
        torch.set_num_threads(min(2, torch.get_num_threads()))
    default = RESULTS / ("latency_gpu_smoke.json" if args.smoke else "latency_cuda.json")
    res = Results(Path(args.out) if args.out else default, args.smoke)
    res.data["command"] = " ".join(sys.argv)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 work in the baseline; bf16 unaffected
        res.data["environment"]["cuda"] = torch.version.cuda
    budget = Budget(args.budget_s)
    presets = args.presets.split(",")
    for part in parts:  # in the order --parts lists them: the caller sets the priority
        log(f"== {part} ({budget.left():.0f} s left)")
        if budget.left() < 30:
            res.skip(part, f"budget: {budget.left():.0f} s left")
            continue
        if part in ("infer", "compile"):
            for p in presets:
                guarded(
                    res,
                    f"infer/{p}",
                    lambda p=p, c=part == "compile": bench_inference(res, p, args, budget, c),
                )
        elif part == "train":
            bench_training(res, args, budget)
        elif part == "serve":
            guarded(res, "serve/pi0", lambda: bench_serve(res, args, budget))
        elif part == "recipe24":
            guarded(res, "train/pi05_lora_24gb", lambda: bench_recipe_24gb(res, args, budget))
        else:
            bench_lerobot(res, args, budget, compile=part == "lerobot-compile")
    res.data["wall_s"] = round(time.perf_counter() - T0, 1)
    res.save()
    log(f"wrote {res.path}")


if __name__ == "__main__":
    if os.environ.get("PYTHONUNBUFFERED") is None:
        sys.stdout.reconfigure(line_buffering=True)
    main()
