"""DataLoader construction and host-to-device transfer for training.

``build_dataloader`` applies ``cfg.data`` (workers, pinning, persistence, prefetch), seeds each
worker deterministically, and uses a ``DistributedSampler`` for map-style datasets when
``torch.distributed`` is initialized (streaming datasets shard themselves).
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from vlastack.batch import Batch, to_device
from vlastack.config import Config


def seed_worker(worker_id: int) -> None:
    """Give numpy/random in each worker a seed derived from torch's per-worker seed."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def build_dataloader(
    dataset: Dataset | IterableDataset,
    cfg: Config,
    batch_size: int | None = None,
    shuffle: bool = True,
    drop_last: bool = True,
    seed: int | None = None,
    num_workers: int | None = None,
) -> DataLoader:
    """A DataLoader over ``dataset`` with the loader settings of ``cfg.data``."""
    d = cfg.data
    nw = d.num_workers if num_workers is None else num_workers
    seed = cfg.train.seed if seed is None else seed
    g = torch.Generator().manual_seed(seed)
    sampler = None
    iterable = isinstance(dataset, IterableDataset)
    if not iterable and torch.distributed.is_available() and torch.distributed.is_initialized():
        sampler = DistributedSampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
    kw = {}
    if nw > 0:
        kw = {"persistent_workers": d.persistent_workers, "prefetch_factor": d.prefetch_factor}
    return DataLoader(
        dataset,
        batch_size=batch_size or cfg.train.batch_size,
        shuffle=shuffle and sampler is None and not iterable,
        sampler=sampler,
        num_workers=nw,
        pin_memory=d.pin_memory and torch.cuda.is_available(),
        drop_last=drop_last,
        worker_init_fn=seed_worker,
        generator=g,
        **kw,
    )


def batch_to_device(batch: Batch, device: torch.device | str) -> Batch:
    """Copy a batch to ``device``; non_blocking so pinned host memory overlaps with compute."""
    return to_device(batch, device, non_blocking=True)
