"""A tiny random policy folder shared by the inference tests (built once per session)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlastack.config import apply_overrides, tiny
from vlastack.data.stats import Normalizer
from vlastack.models import build_model

STATE_DIM, ACTION_DIM = 6, 7  # env dims, smaller than the model's 8: exercises padding


def micro_config():
    """The tiny preset cut to one layer and two denoise steps: same shapes, much faster."""
    over = [
        "model.vision.depth=1",
        "model.vlm.depth=1",
        "model.expert.depth=1",
        "model.head_options.num_denoise_steps=2",
    ]
    return apply_overrides(tiny(), over).model


def make_normalizer() -> Normalizer:
    stats = {
        "observation.state": {"mean": np.arange(STATE_DIM, dtype=np.float64), "std": np.full(STATE_DIM, 2.0)},
        "action": {"q01": -np.ones(ACTION_DIM), "q99": np.full(ACTION_DIM, 3.0)},
    }
    return Normalizer(stats, {"observation.state": "mean_std", "action": "quantiles"})


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("policy")
    build_model(micro_config()).save_pretrained(path)
    make_normalizer().save(path / "norm_stats.json")
    return path


def make_obs(seed: int = 0, size: tuple[int, int] = (48, 80)) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "images": {"scene": rng.integers(0, 256, (*size, 3), dtype=np.uint8)},
        "state": rng.standard_normal(STATE_DIM).astype(np.float32),
        "prompt": "pick up the red cube",
    }
