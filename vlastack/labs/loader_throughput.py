"""L11 loader_throughput: workers vs samples/s on this host, start-up, memory, shared-memory transport.

Wall-clock figures (multi-process work cannot be measured in one thread's CPU time); the host may
be shared, so these are reported, not asserted, except the large transport effect in full mode.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time

import numpy as np
import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, Dataset

from vlastack.labs._core import Ctx, Finding, Lab, MiB

LAB = Lab(
    "loader_throughput",
    "num_workers vs throughput, start-up and memory; tensor vs pickle transport",
    slow=True,
)


class Busy(Dataset):
    """Samples that cost ``ms`` of CPU each (a Python loop), 3x32x32 float32."""

    def __init__(self, n: int, ms: float) -> None:
        self.n, self.loops = n, int(ms * 40_000)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        s = 0
        for k in range(self.loops):
            s += k
        return torch.full((3, 32, 32), float(s % 7))


def _calibrate(ds: Busy) -> float:
    t0 = time.thread_time()
    for i in range(5):
        ds[i]
    return (time.thread_time() - t0) / 5 * 1e3


def _epoch(loader: DataLoader) -> tuple[float, float]:
    """-> (ms to the first batch, samples/s over the epoch)."""
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    t_first = time.perf_counter() - t0
    n = len(first)
    for b in it:
        n += len(b)
    return t_first * 1e3, n / (time.perf_counter() - t0)


@LAB.check("S0-28", "S1-04", "S3-13", "S3-14")
def workers_vs_throughput(ctx: Ctx) -> Finding:
    cores = os.cpu_count() or 1
    workers = ctx.n([0, 1, 2, 4], [0, 1, 2])
    costs = ctx.n([0.5, 5.0], [0.5])
    rows, best = [], {}
    for ms in costs:
        ds = Busy(ctx.n(400, 240) if ms < 1 else ctx.n(80, 40), ms)
        per = round(_calibrate(ds), 2)
        runs: dict[int, list[tuple[float, float]]] = {w: [] for w in workers}
        for r in range(ctx.n(2, 1)):  # interleaved rounds, rotating the order; medians below
            for w in workers[r:] + workers[:r]:
                runs[w].append(_epoch(DataLoader(ds, batch_size=8, num_workers=w)))
        for w in workers:
            first, rate = (statistics.median(x) for x in zip(*runs[w]))
            rows.append({"sample ms": per, "workers": w, "first batch ms": first, "samples/s": rate})
        best[per] = max((r for r in rows if r["sample ms"] == per), key=lambda r: r["samples/s"])["workers"]
    rec = max(cores - 1, 0)
    return Finding(
        f"{cores} cores, load {os.getloadavg()[0]:.1f}: best num_workers per sample cost "
        + ", ".join(f"{ms} ms -> {w}" for ms, w in best.items())
        + f"; the note's rule (cores - 1) = {rec}",
        None,
        "Host-dependent (wall clock, medians of interleaved rounds, reported): workers pay process start-up (first batch) and IPC, "
        "and past the free cores they compete for CPU. Measure num_workers on the training host; "
        "neither 'cores - 1' nor 'cores or half' is a law. pin_memory does nothing without an accelerator.",
        data={"best_workers": {str(k): v for k, v in best.items()}, "cores": cores},
        rows=rows,
    )


def _pss_kib(pid: int) -> tuple[int, int]:
    """-> (Rss, Pss) in KiB from /proc/<pid>/smaps_rollup."""
    vals = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            k, _, rest = line.partition(":")
            if k in ("Rss", "Pss"):
                vals[k] = int(rest.split()[0])
    return vals["Rss"], vals["Pss"]


@LAB.check("S3-13")
def worker_startup_and_memory(ctx: Ctx) -> Finding:
    ds = Busy(64, 0.2)
    _, _ = _epoch(DataLoader(ds, batch_size=8, num_workers=2))  # warm the file cache
    rows = []
    for persistent in (False, True):
        loader = DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=persistent)
        _epoch(loader)
        first2, _ = _epoch(loader)
        rows.append({"persistent_workers": persistent, "epoch-2 first batch ms": first2})
    it = iter(DataLoader(ds, batch_size=8, num_workers=2))
    next(it)
    mem = [_pss_kib(w.pid) for w in it._workers] if os.path.exists("/proc/self/smaps_rollup") else []
    del it
    rss = [r / 1024 for r, _ in mem]
    pss = [p / 1024 for _, p in mem]
    return Finding(
        f"epoch-2 first batch: {rows[0]['epoch-2 first batch ms']:.0f} ms (workers restarted) vs "
        f"{rows[1]['epoch-2 first batch ms']:.0f} ms (persistent); per worker RSS "
        + "/".join(f"{x:.0f}" for x in rss)
        + " MiB, PSS "
        + "/".join(f"{x:.0f}" for x in pss)
        + " MiB",
        None,
        "True: each worker is a process (start-up per epoch unless persistent_workers) with its own "
        "memory; RSS counts pages shared with the parent after fork, PSS splits them, so PSS is the "
        "worker's real cost.",
        data={"rss_mib": rss, "pss_mib": pss},
        rows=rows,
    )


def _producer(q, done, items: int, numel: int, as_tensor: bool) -> None:
    for _ in range(items):
        a = np.ones(numel, dtype=np.float32)
        q.put(torch.from_numpy(a) if as_tensor else a)
    done.wait()  # keep the shared memory alive until the consumer has everything


def _transport_ms(as_tensor: bool, items: int, numel: int) -> float:
    ctxm = tmp.get_context("fork") if as_tensor else mp.get_context("fork")
    q, done = ctxm.Queue(), ctxm.Event()
    p = ctxm.Process(target=_producer, args=(q, done, items, numel, as_tensor))
    t0 = time.perf_counter()
    p.start()
    total = 0.0
    for _ in range(items):
        total += float(q.get()[0])
    dt = time.perf_counter() - t0
    done.set()
    p.join()
    assert total == items
    return dt * 1e3 / items


@LAB.check("S3-04", "S3-05")
def shared_memory_transport(ctx: Ctx) -> Finding:
    numel, items = 4 * 2**20, ctx.n(12, 8)  # 16 MiB per item
    t_tensor, t_pickle = [], []
    for _ in range(ctx.n(2, 1)):  # interleaved repeats
        t_tensor.append(_transport_ms(True, items, numel))
        t_pickle.append(_transport_ms(False, items, numel))
    tt, tp = float(np.median(t_tensor)), float(np.median(t_pickle))
    batch = next(iter(DataLoader(Busy(8, 0.0), batch_size=8, num_workers=1)))
    return Finding(
        f"16 MiB per item through a queue (wall): torch.multiprocessing tensor {tt:.1f} ms vs pickled "
        f"numpy {tp:.1f} ms ({tp / tt:.1f}x); a DataLoader worker's batch is_shared(): {batch.is_shared()}",
        None if ctx.quick else (tp / tt > 1.2 and batch.is_shared()),
        "True: torch.multiprocessing moves a tensor's storage to shared memory and sends a handle, "
        "not the bytes. Caveat: it is torch.multiprocessing's reduction, usable outside DataLoader; "
        "numpy from __getitem__ benefits because default_collate turns it into tensors in the worker.",
        data={"tensor_ms": tt, "pickle_ms": tp},
    )


@LAB.check("S3-16")
def dev_shm_capacity(ctx: Ctx) -> Finding:
    try:
        st = os.statvfs("/dev/shm")
        cap = st.f_frsize * st.f_blocks / MiB
    except OSError:
        cap = 0.0
    batch = 32 * 3 * 224 * 224 * 4 / MiB
    workers, prefetch = 4, 2
    in_flight = batch * workers * prefetch
    return Finding(
        f"/dev/shm {cap:,.0f} MiB; a batch of 32 fp32 224^2 images = {batch:.1f} MiB; 4 workers x "
        f"prefetch_factor 2 -> {in_flight:.0f} MiB in flight",
        None,
        "Docker's default /dev/shm is 64 MiB, below this in-flight total: the loader then dies with a "
        "bus error. Raise it (--shm-size / --ipc=host) or cut workers x prefetch x batch bytes.",
        data={"dev_shm_mib": cap, "in_flight_mib": in_flight},
    )
