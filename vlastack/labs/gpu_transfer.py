"""L20 gpu_transfer: host-to-device copies, pinned memory, non_blocking, syncs, CUDA graphs, the allocator.

Every check needs CUDA and is skipped with a line saying so on a CPU-only machine. Timings use CUDA
events (device time) or host wall clock for "when does the call return".
"""

from __future__ import annotations

import time

import torch
from torch import nn

from vlastack.labs._core import Ctx, Finding, Lab, MiB

LAB = Lab(
    "gpu_transfer", "pinned vs pageable copies, non_blocking, overlap, syncs, CUDA graphs, allocator peaks"
)


def _events_ms(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


@LAB.check("S0-06", "S0-07", "S3-07", "S3-15", requires="cuda")
def pinned_vs_pageable_bandwidth(ctx: Ctx) -> Finding:
    n = 64 * MiB // 4
    pageable = torch.randn(n)
    pinned = torch.randn(n).pin_memory()
    dst = torch.empty(n, device="cuda")
    t_page = _events_ms(lambda: dst.copy_(pageable))
    t_pin = _events_ms(lambda: dst.copy_(pinned, non_blocking=True))
    gbs = {k: 64 * MiB / 1e9 / (v / 1e3) for k, v in (("pageable", t_page), ("pinned", t_pin))}
    return Finding(
        f"{torch.cuda.get_device_name()}: 64 MiB host->device: pageable {gbs['pageable']:.1f} GB/s, pinned "
        f"{gbs['pinned']:.1f} GB/s ({t_page / t_pin:.2f}x); pinned buffer is_pinned {pinned.is_pinned()}",
        t_page / t_pin >= 1.1,
        "Pinned (page-locked) pages cannot be swapped, so the GPU DMAs straight from them; pageable copies "
        "are DMA too, through a pinned staging buffer (one extra host memcpy) - that is the gap. Pinned "
        "memory is taken from the OS for as long as it lives, so pin only what is in flight.",
        data=gbs,
    )


@LAB.check("S0-08", "S0-09", requires="cuda")
def non_blocking_and_overlap(ctx: Ctx) -> Finding:
    n = 64 * MiB // 4
    pageable, pinned = torch.randn(n), torch.randn(n).pin_memory()
    torch.cuda.synchronize()
    ret = {}
    for name, src in (("pageable", pageable), ("pinned", pinned)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        src.to("cuda", non_blocking=True)
        ret[name] = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
    copy_ms = _events_ms(lambda: pinned.to("cuda", non_blocking=True))
    a = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()
    dst = torch.empty(n, device="cuda")

    def serial() -> None:
        dst.copy_(pinned, non_blocking=True)
        a @ a

    def overlapped() -> None:
        with torch.cuda.stream(side):
            dst.copy_(pinned, non_blocking=True)
        a @ a
        torch.cuda.current_stream().wait_stream(side)

    t_serial, t_overlap = _events_ms(serial), _events_ms(overlapped)
    return Finding(
        f"non_blocking .to('cuda') returns after {ret['pageable']:.2f} ms (pageable) vs {ret['pinned']:.3f} ms "
        f"(pinned) for a {copy_ms:.2f} ms copy; copy + 4096^2 matmul: same stream {t_serial:.2f} ms, copy "
        f"on a side stream {t_overlap:.2f} ms",
        ret["pinned"] < 0.5 * copy_ms,
        "Caveat: non_blocking returns early only from pinned memory. The host thread is then free to queue "
        "more work; copy/compute *overlap* needs the copy on another CUDA stream. The next batch is "
        "prepared by DataLoader workers either way.",
        data={"return_ms": ret, "copy_ms": copy_ms, "serial_ms": t_serial, "overlap_ms": t_overlap},
    )


@LAB.check("S1-05", requires="cuda")
def many_small_vs_one_big_copy(ctx: Ctx) -> Finding:
    parts = [torch.randn(4096).pin_memory() for _ in range(256)]
    big = torch.cat(parts).pin_memory()
    t_small = _events_ms(lambda: [p.to("cuda", non_blocking=True) for p in parts], reps=5)
    t_big = _events_ms(lambda: big.to("cuda", non_blocking=True), reps=5)
    return Finding(
        f"256 copies of 16 KiB {t_small:.2f} ms vs one 4 MiB copy {t_big:.3f} ms ({t_small / t_big:.1f}x)",
        t_small > 2 * t_big,
        "True: each copy pays a fixed launch/DMA-setup latency; batch small tensors into one transfer.",
    )


@LAB.check("S1-13", requires="cuda")
def item_forces_a_sync(ctx: Ctx) -> Finding:
    x = torch.randn(1024, device="cuda")

    def no_sync() -> None:
        y = x
        for _ in range(100):
            y = y * 1.0001

    def with_item() -> None:
        y = x
        for _ in range(100):
            y = y * 1.0001
            y.sum().item()

    def wall(fn) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    a, b = wall(no_sync), wall(with_item)
    return Finding(
        f"100 tiny kernels: {a:.2f} ms queued freely vs {b:.2f} ms with .item() each step ({b / a:.1f}x)",
        b > 1.5 * a,
        "True: .item(), print(tensor), .cpu() and Python `if` on a CUDA value wait for the GPU, so the "
        "host can no longer run ahead and the GPU idles between kernels.",
    )


@LAB.check("S2-24", requires="cuda")
def reduce_overhead_is_cuda_graphs(ctx: Ctx) -> Finding:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(8)]).cuda().eval()
    x = torch.randn(1, 256, device="cuda")
    default = torch.compile(model)
    graphs = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            default(x)
            graphs(x)
        t = {
            k: _events_ms(lambda f=f: f(x), reps=50)
            for k, f in (("eager", model), ("default", default), ("reduce-overhead", graphs))
        }
    return Finding(
        f"batch-1 8-layer MLP: eager {t['eager']:.3f} ms, compile default {t['default']:.3f} ms, "
        f"reduce-overhead (CUDA graphs) {t['reduce-overhead']:.3f} ms",
        t["reduce-overhead"] < t["eager"],
        "True: reduce-overhead records the kernels once as a CUDA graph and replays them with one launch; "
        "it needs static shapes and does nothing on CPU.",
        data=t,
    )


@LAB.check("S4-25", "S0-30", requires="cuda")
def allocator_peaks(ctx: Ctx) -> Finding:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    new = torch.randn(1, 8, 1, 64, device="cuda")
    cache = torch.empty(1, 8, 0, 64, device="cuda")
    for _ in range(2048):
        cache = torch.cat([cache, new], dim=2)
    alloc, reserved = torch.cuda.memory_allocated() - base, torch.cuda.memory_reserved()
    peak_a, peak_r = torch.cuda.max_memory_allocated() - base, torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    after_reset = torch.cuda.max_memory_allocated() - base
    return Finding(
        f"after 2048 cat appends: allocated {alloc / MiB:.1f} MiB, reserved {reserved / MiB:.1f} MiB "
        f"(cached, not in use: {(reserved - alloc - base) / MiB:.1f} MiB); peaks allocated {peak_a / MiB:.1f}, "
        f"reserved {peak_r / MiB:.1f} MiB; peak after reset_peak_memory_stats {after_reset / MiB:.1f} MiB",
        peak_r >= peak_a and after_reset <= alloc + 1,
        "Caveat: max_memory_reserved is the peak of the caching allocator's pool since the last reset "
        "(not real time, and it includes cached free blocks); max_memory_allocated is the tensor peak. "
        "Growing tensors with cat leaves the pool fragmented into blocks of many sizes.",
    )
