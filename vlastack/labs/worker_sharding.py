"""L10 worker_sharding: IterableDataset copies per worker, sharding, worker RNG, the spawn guard."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vlastack.labs._core import Ctx, Finding, Lab

LAB = Lab(
    "worker_sharding", "IterableDataset in workers: duplication, sharding by worker and rank, RNG state"
)


class Stream(IterableDataset):
    """Items 0..n-1, optionally sharded by (rank, world) and by DataLoader worker."""

    def __init__(self, n: int = 20, shard: bool = False, rank: int = 0, world: int = 1) -> None:
        self.n, self.shard, self.rank, self.world = n, shard, rank, world

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info and self.shard else (0, 1)
        k, stride = self.rank * nw + wid, self.world * nw  # global shard index
        for i in range(self.n):
            if not self.shard or i % stride == k:
                yield i


class Draws(IterableDataset):
    """Yields each worker's first draws from an __init__-time generator and from the global RNGs."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)  # copied into every worker as is

    def __iter__(self):
        info = get_worker_info()
        yield {
            "worker": info.id,
            "init_rng": float(self.rng.random()),
            "np_global": float(np.random.random()),
            "random": random.random(),
            "torch": torch.rand(()).item(),
        }


def _items(ds: IterableDataset, workers: int) -> list[int]:
    return [int(x) for x in DataLoader(ds, batch_size=None, num_workers=workers)]


@LAB.check("S3-02", "S3-18")
def iterable_copies_and_sharding(ctx: Ctx) -> Finding:
    dup = _items(Stream(20), 2)
    sharded = _items(Stream(20, shard=True), 2)
    ranks = [_items(Stream(20, shard=True, rank=r, world=2), 2) for r in range(2)]
    both = ranks[0] + ranks[1]
    rows = [
        {"setup": "2 workers, no sharding", "items": len(dup), "unique": len(set(dup))},
        {
            "setup": "2 workers, get_worker_info() sharding in __iter__",
            "items": len(sharded),
            "unique": len(set(sharded)),
        },
        {"setup": "2 ranks x 2 workers, rank*workers + id", "items": len(both), "unique": len(set(both))},
    ]
    ok = (
        len(dup) == 40
        and len(set(dup)) == 20
        and sorted(sharded) == list(range(20))
        and sorted(both) == list(range(20))
    )
    return Finding(
        f"20 items: unsharded with 2 workers -> {len(dup)} items ({len(set(dup))} unique); sharded -> "
        f"{len(sharded)}; 2 ranks x 2 workers -> {len(both)} ({len(set(both))} unique)",
        ok,
        "True: each worker iterates its own copy. Caveat: a worker_init_fn is not required; sharding "
        "inside __iter__ with get_worker_info() works too (vlastack/data/samples.py does), and under "
        "DDP the shard index must include the rank.",
        rows=rows,
    )


@LAB.check("S3-01")
def iterable_rejects_shuffle(ctx: Ctx) -> Finding:
    try:
        DataLoader(Stream(4), shuffle=True)
        err = "no error"
    except ValueError as e:
        err = str(e)
    return Finding(
        f"DataLoader(IterableDataset, shuffle=True) -> ValueError: '{err[:90]}'",
        err != "no error",
        "True and loud: samplers do not apply to iterable datasets, and asking for one raises instead "
        "of being ignored; shuffle inside the stream (e.g. a shuffle buffer).",
    )


@LAB.check("S3-17")
def worker_rng_state(ctx: Ctx) -> Finding:
    draws = sorted(DataLoader(Draws(), batch_size=None, num_workers=2), key=lambda d: d["worker"])
    rows = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()} for d in draws]
    same_init = draws[0]["init_rng"] == draws[1]["init_rng"]
    differ = {k: draws[0][k] != draws[1][k] for k in ("np_global", "random", "torch")}
    ok = same_init and all(differ.values())
    return Finding(
        f"generator made in __init__: same first draw in both workers {same_init}; global RNGs differ: {differ}",
        ok,
        "Caveat: PyTorch reseeds torch, random and numpy's *global* RNG per worker (base_seed + id), "
        "but generators and file handles created in __init__ are copied as is: seed them per worker "
        "(worker_init_fn or get_worker_info().seed).",
        rows=rows,
    )


_SCRIPT = """
import os, torch
from torch.utils.data import DataLoader
with open(os.environ["LAB_COUNT"], "a") as f:
    f.write("x")
loader = DataLoader(list(range(8)), batch_size=4, num_workers=1, multiprocessing_context="spawn")
print(sum(len(b) for b in loader))
"""


@LAB.check("S1-12", slow=True)
def spawn_needs_main_guard(ctx: Ctx) -> Finding:
    with tempfile.TemporaryDirectory() as d:
        script, count = os.path.join(d, "noguard.py"), os.path.join(d, "count")
        with open(script, "w") as f:
            f.write(textwrap.dedent(_SCRIPT))
        env = {**os.environ, "LAB_COUNT": count}
        p = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120, env=env)
        runs = len(Path(count).read_text()) if os.path.exists(count) else 0
    boot = "bootstrapping phase" in p.stderr
    return Finding(
        f"spawn, no __main__ guard: exit code {p.returncode}, module body ran {runs} times, "
        f"RuntimeError about the bootstrapping phase: {boot}",
        p.returncode != 0 and boot and runs >= 2,
        "Caveat: not a deadlock. Under spawn (Windows; macOS by default) each worker re-imports the "
        "script; without the guard the import starts another loader and Python raises a RuntimeError.",
    )
