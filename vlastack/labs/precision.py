"""L12 precision: fp16/bf16 ranges, underflow and loss scaling, GradScaler, autocast memory and speed."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from vlastack.labs._core import Ctx, Finding, Lab, MiB, SavedTensors, compare, cpu_flags, native_bf16

LAB = Lab("precision", "fp16 vs bf16 range, underflow, loss scaling, GradScaler, autocast memory and speed")


@LAB.check("S0-22", "S4-06")
def ranges_and_round_trips(ctx: Ctx) -> Finding:
    vals = [1e-5, 1e-6, 1e-7, 1e-8, 7e4]
    rt = {dt: torch.tensor(vals).to(dt).float().tolist() for dt in (torch.float16, torch.bfloat16)}
    rows = [
        {"value": f"{v:g}", "fp16": f"{h:.4g}", "bf16": f"{b:.4g}"} for v, h, b in zip(vals, *rt.values())
    ]
    h, b = torch.finfo(torch.float16), torch.finfo(torch.bfloat16)
    for name in ("max", "smallest_normal", "eps"):
        rows.append(
            {"value": f"finfo.{name}", "fp16": f"{getattr(h, name):.4g}", "bf16": f"{getattr(b, name):.4g}"}
        )
    h16 = dict(zip(vals, rt[torch.float16]))
    ok = (
        torch.finfo(torch.float16).max == 65504
        and abs(torch.finfo(torch.float16).smallest_normal - 6.1035e-5) < 1e-8
        and h16[1e-5] > 0
        and h16[1e-7] > 0
        and h16[1e-8] == 0
        and h16[7e4] == float("inf")
        and rt[torch.bfloat16][3] > 0
        and rt[torch.bfloat16][4] < float("inf")
    )
    return Finding(
        f"fp16 max 65504, smallest normal 6.1e-5, but 1e-5 -> {h16[1e-5]:.4g}, 1e-7 -> {h16[1e-7]:.3g} "
        f"(subnormals down to 6e-8), 1e-8 -> 0, 7e4 -> inf; bf16 keeps 1e-8 and 7e4 (max 3.4e38) with 8 bits of precision",
        ok,
        "Caveat: fp16's *normal* range is 6e-5..6.5e4, but subnormals reach 6e-8 (with lost precision); "
        "bf16 has fp32's exponent range and far less precision.",
        rows=rows,
    )


def _fp16_zero_grad_share(dtype: torch.dtype, scale: float) -> float:
    torch.manual_seed(0)
    lin = nn.Linear(64, 64).to(dtype)
    x = torch.randn(32, 64).to(dtype)
    loss = lin(x).float().sum() * 1e-8  # fp32 loss; dL/dy = 1e-8, cast back to the layer's dtype
    (loss * scale).backward()
    return (lin.weight.grad == 0).float().mean().item()


@LAB.check("S0-23", "S4-07")
def underflow_and_loss_scaling(ctx: Ctx) -> Finding:
    unscaled = _fp16_zero_grad_share(torch.float16, 1.0)
    scaled = _fp16_zero_grad_share(torch.float16, 65536.0)
    bf16 = _fp16_zero_grad_share(torch.bfloat16, 1.0)
    ok = unscaled == 1.0 and scaled == 0.0 and bf16 == 0.0
    return Finding(
        f"pure-fp16 Linear, upstream gradient 1e-8: weight grads that are 0: {unscaled:.0%} unscaled, "
        f"{scaled:.0%} with loss x 65536, {bf16:.0%} in bf16 unscaled",
        ok,
        "True with a caveat on the number: 1e-5 survives in fp16 (subnormal); values below ~3e-8 flush "
        "to 0. Scaling the loss lifts them into range; bf16's wide exponent needs no scaler.",
    )


@LAB.check("S0-24", "S1-11")
def grad_scaler_skips_and_backs_off(ctx: Ctx) -> Finding:
    w = nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", growth_interval=2)
    init = scaler.get_scale()
    before = w.detach().clone()
    loss = (w * torch.tensor([1.0, 1.0, 1.0, float("inf")])).sum()  # an overflowing step
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    skipped = torch.equal(w.detach(), before)
    after_inf = scaler.get_scale()
    for _ in range(2):  # two good steps -> growth x2
        opt.zero_grad()
        scaler.scale(w.sum()).backward()
        scaler.step(opt)
        scaler.update()
    grown = scaler.get_scale()
    moved = not torch.equal(w.detach(), before)
    ok = init == 65536.0 and skipped and after_inf == 32768.0 and grown == 65536.0 and moved
    return Finding(
        f"GradScaler('cpu'): initial scale {init:.0f}; inf step: weights unchanged {skipped}, scale -> "
        f"{after_inf:.0f}; after 2 good steps (growth_interval=2) -> {grown:.0f}, weights updated {moved}",
        ok,
        "True: scale, unscale, skip the step on inf/NaN and halve the scale. The note leaves out the "
        "other half: after growth_interval (default 2000) good steps the scale doubles again.",
    )


@LAB.check("S1-02")
def cuda_amp_namespace_deprecated(ctx: Ctx) -> Finding:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        scaler = torch.cuda.amp.GradScaler()
        with torch.cuda.amp.autocast():
            pass
    future = [str(x.message).split(" Please")[0] for x in w if issubclass(x.category, FutureWarning)]
    ok = len(future) == 2 and all("deprecated" in m for m in future)
    return Finding(
        f"FutureWarnings: {future}; without CUDA the scaler is enabled: {scaler.is_enabled()}",
        ok,
        "Caveat: both spellings are deprecated; use torch.amp.GradScaler('cuda') and "
        "torch.amp.autocast('cuda', dtype=...). Without CUDA they disable themselves with only a warning.",
    )


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))


@LAB.check("S1-10", "S4-05")
def autocast_memory(ctx: Ctx) -> Finding:
    model = _mlp()
    x = torch.randn(2048, 256)
    saved = {}
    for name, dt in (("fp32", None), ("bf16 autocast", torch.bfloat16)):
        autocast = torch.autocast("cpu", dtype=dt or torch.bfloat16, enabled=dt is not None)
        with autocast, SavedTensors(exclude=model.parameters()) as meter:
            y = model(x)
        saved[name] = meter.alive_bytes() / MiB
        out_dtype = y.dtype
        del y
    params = {p.dtype for p in model.parameters()}
    ratio = saved["bf16 autocast"] / saved["fp32"]
    return Finding(
        f"saved for backward, MLP 256-1024-256 b2048: fp32 {saved['fp32']:.1f} MiB, bf16 autocast "
        f"{saved['bf16 autocast']:.1f} MiB ({ratio:.2f}x, incl. the bf16 weight copies); parameters "
        f"stay {params}; output {out_dtype}",
        ratio < 0.7 and params == {torch.float32},
        "Caveat: autocast halves saved activations, not the model: parameters, grads and optimizer "
        "state stay fp32 (so a 3B model still needs 12 GB of fp32 weights; see optimizer_memory).",
    )


@LAB.check("S1-10", timed=True)
def low_precision_speed_on_this_cpu(ctx: Ctx) -> Finding:
    n = ctx.n(512, 256)
    a, b = torch.randn(n, n), torch.randn(n, n)
    ab, bb, ah, bh = a.bfloat16(), b.bfloat16(), a.half(), b.half()
    # One thread and the fastest of the repeats: on a shared CPU (the test suite's other worker) a
    # multi-threaded matmul's calling thread spins while its sibling waits for a core, and the
    # thread clock counts the spin; a 0.37x native ratio read 0.72x that way.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fns = {"fp32": lambda: a @ b, "bf16": lambda: ab @ bb, "fp16": lambda: ah @ bh}
        mm = compare(fns, reps=ctx.n(7, 5), inner=ctx.n(4, 4), stat=min)
    finally:
        torch.set_num_threads(threads)
    model = _mlp()
    x = torch.randn(64, 256)

    def step(dt):
        def go() -> None:
            with torch.autocast("cpu", dtype=dt or torch.bfloat16, enabled=dt is not None):
                y = model(x).float().pow(2).mean()
            y.backward()

        return go

    st = compare(
        {"fp32": step(None), "bf16": step(torch.bfloat16), "fp16": step(torch.float16)}, reps=ctx.n(5, 3)
    )
    native = native_bf16()
    r_mm, r_st = mm["bf16"] / mm["fp32"], st["bf16"] / st["fp32"]
    rows = [
        {"work": f"{n}^2 matmul", "fp32 ms": mm["fp32"], "bf16 ms": mm["bf16"], "fp16 ms": mm["fp16"]},
        {
            "work": "MLP train step (autocast)",
            "fp32 ms": st["fp32"],
            "bf16 ms": st["bf16"],
            "fp16 ms": st["fp16"],
        },
    ]
    # The expected direction follows the CPU: native bf16 (avx512_bf16 / AMX) -> faster; else far slower.
    # Asserted on the matmul, where the instructions decide (0.16-0.37x native, 40-60x emulated): the
    # small MLP step is reported only, its casts and fp32 losses put it at 0.64-1.13x on native CPUs.
    ok = r_mm < 0.7 if native else r_mm > 3.0
    verdict = "T on this CPU (native bf16)" if native else "F on this CPU (no native bf16: emulated, slower)"
    return Finding(
        f"flags {','.join(cpu_flags())}: bf16/fp32 time: matmul {r_mm:.2f}x, train step {r_st:.2f}x; "
        f"fp16/fp32 train step {st['fp16'] / st['fp32']:.1f}x",
        ok,
        "Throughput depends on the hardware: with avx512_bf16/AMX (or a GPU) bf16 is faster; on an "
        "AVX2-only CPU it is emulated and many times slower; fp16 on a CPU without avx512_fp16/AMX-FP16 "
        "is slow either way. Asserted on the matmul, in the direction this CPU's flags (and a capped "
        "ONEDNN_MAX_CPU_ISA) predict; the small train step is reported, not asserted.",
        verdict=verdict,
        data={"bf16_matmul_x": r_mm, "bf16_step_x": r_st, "native_bf16": native},
        rows=rows,
    )


@LAB.check("S0-24", "S1-10", requires="cuda")
def fp16_grad_scaler_on_cuda(ctx: Ctx) -> Finding:
    dev = "cuda"
    model = _mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(64, 256, device=dev)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    a, b = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev)
    ah, ab, bh, bb = a.half(), a.bfloat16(), b.half(), b.bfloat16()

    def timed(fn) -> float:
        fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / 10

    t = {
        "fp32": timed(lambda: a @ b),
        "fp16": timed(lambda: ah @ bh),
        "bf16": timed(lambda: ab @ bb),
    }
    ok = all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    return Finding(
        f"{torch.cuda.get_device_name()}: 20 fp16 autocast steps with GradScaler('cuda'), loss "
        f"{losses[0]:.4f} -> {losses[-1]:.4f}, scale {scaler.get_scale():.0f}; 4096^2 matmul fp32 "
        f"{t['fp32']:.2f} ms, fp16 {t['fp16']:.2f} ms, bf16 {t['bf16']:.2f} ms",
        ok,
        "On a GPU with tensor cores, fp16/bf16 matmuls are several times faster than fp32.",
        data=t,
    )
