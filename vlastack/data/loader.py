"""The one DataLoader builder, a resumable batch sampler, an in-memory cache, host-to-device copy.

``build_dataloader`` applies ``cfg.data`` (workers, pinning, persistence, prefetch), seeds each
worker deterministically, and uses a ``DistributedSampler`` for map-style datasets when
``torch.distributed`` is initialized (streaming datasets shard themselves); given a
``batch_sampler`` (training: ``ResumableBatchSampler``) it follows that instead.

Training order is a pure function of (seed, epoch): epoch ``e`` is ``randperm(N)`` from a
generator seeded with ``(seed, e)``, cut into global micro-batches of ``batch_size * world``
samples (the remainder is dropped); rank ``r`` takes slice ``r`` of each. The position is the
number of global micro-batches consumed so far, so a resumed run continues with exactly the
batches the uninterrupted run would have drawn, whatever the DataLoader prefetched.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler

from vlastack.batch import Batch, to_device
from vlastack.config import Config, to_dict
from vlastack.progress import Progress


def seed_worker(worker_id: int) -> None:
    """Give numpy/random in each worker a seed derived from torch's per-worker seed."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


class ResumableBatchSampler(Sampler[list[int]]):
    """Endless per-rank micro-batches of indices, starting at global micro-batch ``start``."""

    def __init__(
        self, n: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1, start: int = 0
    ) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world_size, self.start = rank, world_size, start
        self.per_epoch = n // (batch_size * world_size)
        if self.per_epoch == 0:
            raise ValueError(
                f"the dataset has {n} samples, fewer than one global micro-batch "
                f"(train.batch_size {batch_size} x {world_size} ranks); lower train.batch_size"
            )

    def order(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g)

    def __iter__(self) -> Iterator[list[int]]:
        pos = self.start
        g = self.batch_size * self.world_size
        while True:
            epoch, k = divmod(pos, self.per_epoch)
            perm = self.order(epoch)
            for j in range(k, self.per_epoch):
                lo = j * g + self.rank * self.batch_size
                yield perm[lo : lo + self.batch_size].tolist()
            pos = (epoch + 1) * self.per_epoch


class MemoryDataset(Dataset):
    """All samples of a dataset stacked into tensors (uint8 images stay uint8): indexing is a gather.

    For small datasets (the demo's ~10k frames of 2x64x64 images are ~250 MB) this removes video
    decoding from the training loop entirely.
    """

    def __init__(
        self,
        dataset: Dataset,
        num_workers: int = 0,
        batch_size: int = 256,
        progress: bool = True,
        cache: str | Path | None = None,
    ) -> None:
        """``cache``: a safetensors file of exactly these samples (``preload_key`` names it): read,
        memory-mapped, when it exists, else written once decoded. MT50's ~205k samples take ~21 min
        to decode on 2 cores and seconds to map, so a resumed run skips the decoding."""
        self.normalizer = getattr(dataset, "normalizer", None)
        cache = Path(cache) if cache is not None else None
        if cache is not None and cache.is_file():
            self.data = load_file(str(cache))
            if self.data and len(self) == len(dataset):  # else a stale or foreign file: decode again
                if progress:
                    print(f"preload: {len(self)} samples mapped from {cache}", flush=True)
                return
        self._decode(dataset, num_workers, batch_size, progress)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            # one cache per run (the last data's), and no half-written leftover of a killed write
            for old in [*cache.parent.glob("*.safetensors"), *cache.parent.glob("*.safetensors.tmp")]:
                old.unlink()
            tmp = cache.with_name(cache.name + ".tmp")
            save_file({k: v.contiguous() for k, v in self.data.items()}, str(tmp))
            tmp.replace(cache)  # atomic: a reader never maps a half-written file

    def _decode(self, dataset: Dataset, num_workers: int, batch_size: int, progress: bool) -> None:
        # spawn, not fork: a dataset that already opened video decoders in this process can
        # deadlock in forked workers.
        ctx = "spawn" if num_workers > 0 else None
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=False,
            num_workers=num_workers,
            multiprocessing_context=ctx,
        )
        # Filled in place, batch by batch: stacking a list of batches needed the data twice at
        # once (the parts and the concatenated copy), 19 GiB for MT50's ~200k frames at 128 px.
        n, at = len(dataset), 0
        self.data: dict[str, torch.Tensor] = {}
        # Decoding the demo's 30k frames takes about a minute: never a silent minute.
        with Progress(n, "preload", "frame", enabled=progress) as bar:
            for b in loader:
                m = len(next(iter(b.values())))
                if not self.data:
                    self.data = {k: torch.empty((n, *v.shape[1:]), dtype=v.dtype) for k, v in b.items()}
                if set(b) != set(self.data) or any(
                    v.shape[1:] != self.data[k].shape[1:] for k, v in b.items()
                ):
                    raise ValueError(
                        "cannot preload a dataset whose samples change keys or shapes: "
                        f"{ {k: tuple(v.shape[1:]) for k, v in b.items()} } after "
                        f"{ {k: tuple(v.shape[1:]) for k, v in self.data.items()} }"
                    )
                for k, v in b.items():
                    self.data[k][at : at + m] = v
                at += m
                bar.update(m)
        if not self.data:
            raise ValueError("cannot preload an empty dataset")
        assert at == n, (at, n)

    def __len__(self) -> int:
        return next(iter(self.data.values())).shape[0]

    def gather(self, indices: list[int]) -> Batch:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return {k: v.index_select(0, idx) for k, v in self.data.items()}

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.data.items()}


# Loader settings that change how samples are decoded, not what they are.
_LOADER_ONLY = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


def preload_key(cfg: Config, root: str | Path, extra: bytes = b"") -> str:
    """A name for the preloaded samples of the dataset at ``root`` under ``cfg``: a hash of the
    model and data settings, the bytes of ``meta/`` and the size and mtime of every other file
    (``extra``: anything else the samples depend on, e.g. kept normalisation statistics). Any
    change gives another name, so a cache is never read for other samples."""
    h = hashlib.sha256()
    settings = {"model": to_dict(cfg.model), "data": to_dict(cfg.data)}
    for k in _LOADER_ONLY:
        settings["data"].pop(k, None)
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    root = Path(root)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            rel = p.relative_to(root)
            st = p.stat()
            h.update(f"{rel.as_posix()}:{st.st_size}:{st.st_mtime_ns}\n".encode())
            if rel.parts[0] == "meta":
                h.update(p.read_bytes())
    h.update(extra)
    return h.hexdigest()[:20]


def build_dataloader(
    dataset: Dataset | IterableDataset,
    cfg: Config,
    batch_size: int | None = None,
    shuffle: bool = True,
    drop_last: bool = True,
    seed: int | None = None,
    num_workers: int | None = None,
    batch_sampler: Sampler[list[int]] | None = None,
    multiprocessing_context: str | None = None,
    pin_memory: bool | None = None,
) -> DataLoader:
    """A DataLoader over ``dataset`` with the loader settings of ``cfg.data``.

    ``batch_sampler``: yields the index lists (then ``batch_size``, ``shuffle`` and ``drop_last``
    are its business). ``pin_memory`` defaults to ``data.pin_memory`` where CUDA exists.
    ``multiprocessing_context="spawn"`` for datasets that may already hold open
    video decoders in this process (forked workers can deadlock on them)."""
    d = cfg.data
    nw = d.num_workers if num_workers is None else num_workers
    seed = cfg.train.seed if seed is None else seed
    kw: dict = {}
    if nw > 0:
        kw = {"persistent_workers": d.persistent_workers, "prefetch_factor": d.prefetch_factor,
              "multiprocessing_context": multiprocessing_context}  # fmt: skip
    if batch_sampler is not None:
        kw["batch_sampler"] = batch_sampler
    else:
        sampler = None
        iterable = isinstance(dataset, IterableDataset)
        if not iterable and torch.distributed.is_available() and torch.distributed.is_initialized():
            sampler = DistributedSampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
        kw.update(
            batch_size=batch_size or cfg.train.batch_size, shuffle=shuffle and sampler is None and not iterable,
            sampler=sampler, drop_last=drop_last,
        )  # fmt: skip
    return DataLoader(
        dataset,
        num_workers=nw,
        pin_memory=d.pin_memory and torch.cuda.is_available() if pin_memory is None else pin_memory,
        worker_init_fn=seed_worker,
        # Workers draw their base seed from this, not from the global RNG (which must stay
        # untouched for exact resume).
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )


def training_batches(
    dataset: Dataset, sampler: ResumableBatchSampler, cfg: Config, pin_memory: bool = False
) -> Iterator[Batch]:
    """Endless training batches following ``sampler``: gathered from a ``MemoryDataset``, else
    through ``build_dataloader`` (spawned workers)."""
    if isinstance(dataset, MemoryDataset):
        for idx in sampler:
            yield dataset.gather(idx)
        return
    yield from build_dataloader(
        dataset, cfg, batch_sampler=sampler, multiprocessing_context="spawn", pin_memory=pin_memory
    )


def batch_to_device(batch: Batch, device: torch.device | str) -> Batch:
    """Copy a batch to ``device``; non_blocking so pinned host memory overlaps with compute."""
    return to_device(batch, device, non_blocking=True)
