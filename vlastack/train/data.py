"""Training batches with a resumable position: a seeded batch sampler, an in-memory cache.

The sample order is a pure function of (seed, epoch): epoch ``e`` is ``randperm(N)`` from a
generator seeded with ``(seed, e)``, cut into global micro-batches of ``batch_size * world``
samples (the remainder is dropped); rank ``r`` takes slice ``r`` of each. The position is the
number of global micro-batches consumed so far, so a resumed run continues with exactly the
batches the uninterrupted run would have drawn, whatever the DataLoader prefetched.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from vlastack.batch import Batch


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

    def __init__(self, dataset: Dataset, num_workers: int = 0, batch_size: int = 256) -> None:
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
        parts: dict[str, list[torch.Tensor]] = {}
        for b in loader:
            for k, v in b.items():
                parts.setdefault(k, []).append(v)
        if not parts:
            raise ValueError("cannot preload an empty dataset")
        self.data = {k: torch.cat(v) for k, v in parts.items()}
        self.normalizer = getattr(dataset, "normalizer", None)

    def __len__(self) -> int:
        return next(iter(self.data.values())).shape[0]

    def gather(self, indices: list[int]) -> Batch:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return {k: v.index_select(0, idx) for k, v in self.data.items()}

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.data.items()}


def batch_iterator(
    dataset: Dataset,
    sampler: ResumableBatchSampler,
    num_workers: int = 0,
    prefetch_factor: int = 2,
    pin_memory: bool = False,
) -> Iterator[Batch]:
    """Endless batches following ``sampler``."""
    if isinstance(dataset, MemoryDataset):
        for idx in sampler:
            yield dataset.gather(idx)
        return
    kw = {}
    if num_workers > 0:  # spawn: see MemoryDataset
        kw = {
            "prefetch_factor": prefetch_factor,
            "persistent_workers": True,
            "multiprocessing_context": "spawn",
        }
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        # The loader draws its worker base seed from this, not from the global RNG (which must
        # stay untouched for exact resume).
        generator=torch.Generator().manual_seed(sampler.seed),
        **kw,
    )
    yield from loader
