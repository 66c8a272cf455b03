"""train.preload: MemoryDataset holds every sample once, equal to the dataset's own samples."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from vlastack.data.loader import MemoryDataset


class _Samples(Dataset):
    def __init__(self, n: int, grow_at: int | None = None) -> None:
        self.n, self.grow_at = n, grow_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        width = 5 if self.grow_at is not None and i >= self.grow_at else 4
        return {
            "images": torch.randint(0, 256, (1, 3, 8, 8), generator=g, dtype=torch.uint8),
            "state": torch.randn(width, generator=g),
        }


def test_preload_is_the_samples_filled_in_place():
    ds = _Samples(37)
    mem = MemoryDataset(ds, batch_size=8, progress=False)
    assert len(mem) == 37 and mem.data["images"].dtype == torch.uint8
    for i in (0, 7, 8, 36):
        for k, v in ds[i].items():
            assert torch.equal(mem[i][k], v)
    batch = mem.gather([3, 30])
    assert torch.equal(batch["state"][1], ds[30]["state"])
    # one tensor per key, sized for the whole dataset: nothing kept per batch
    assert all(v.shape[0] == 37 and v.is_contiguous() for v in mem.data.values())


def test_preload_refuses_samples_that_change_shape():
    with pytest.raises(ValueError, match="change keys or shapes"):
        MemoryDataset(_Samples(20, grow_at=16), batch_size=8, progress=False)
    with pytest.raises(ValueError, match="empty"):
        MemoryDataset(_Samples(0), batch_size=8, progress=False)
