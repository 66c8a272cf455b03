"""Tiny configs and seeded-fault datasets for the diagnostics tests."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset

from vlastack.batch import dummy_batch
from vlastack.config import load_config

MICRO = [
    "model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1", "model.vision.image_size=16",
    "model.max_text_len=8", "model.action_horizon=4", "eval.steps_per_chunk=4", "train.batch_size=4",
    "train.warmup_steps=2", "data.num_workers=0", "train.num_threads=1",
]  # fmt: skip


def micro_cfg(*overrides: str):
    return load_config("tiny", overrides=[*MICRO, *overrides])


class SlowDataset(Dataset):
    """Well-formed samples that take ``delay`` seconds each, like decoding video in the loader."""

    def __init__(self, cfg, n: int = 32, delay: float = 0.0) -> None:
        self.b = dummy_batch(cfg.model, n)
        self.delay = delay
        self.normalizer = None

    def __len__(self) -> int:
        return self.b["state"].shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        return {k: v[i] for k, v in self.b.items()}
