"""Tiny configs and in-memory datasets for the training tests (no simulator needed)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from vlastack.batch import dummy_batch
from vlastack.config import load_config

TINY = [
    "model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1", "model.vision.image_size=16",
    "model.max_text_len=8", "model.action_horizon=4", "eval.steps_per_chunk=4", "train.batch_size=4",
    "train.log_every=1", "train.warmup_steps=2", "data.num_workers=0", "train.num_threads=2",
]  # fmt: skip


def tiny_cfg(*overrides: str):
    return load_config("tiny", overrides=[*TINY, *overrides])


class FakeDataset(Dataset):
    """``n`` fixed random samples in the batch format (unbatched)."""

    def __init__(self, cfg, n: int = 24, seed: int = 0, nan_actions: bool = False) -> None:
        b = dummy_batch(cfg.model, n, seed=seed)
        if nan_actions:
            b["actions"][:] = float("nan")
        self.b = b
        self.normalizer = None

    def __len__(self) -> int:
        return self.b["state"].shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.b.items()}
