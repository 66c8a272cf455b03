"""Fixtures of the fault-injection suite (built once per session, copied before being broken)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.faults.helpers import write_small_dataset
from tests.faults.trials import TRAIN_OV, cli, outcome, run_training

CLI_TRAIN = [
    "model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1", "model.vision.image_size=16",
    "model.max_text_len=8", "model.action_horizon=4", "eval.steps_per_chunk=4", "train.batch_size=4",
    "train.log_every=1", "train.warmup_steps=2", "data.num_workers=0", "train.num_threads=2", *TRAIN_OV,
]  # fmt: skip


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted 4-step run every interrupted one must match bit for bit."""
    run = tmp_path_factory.mktemp("reference") / "run"
    run_training(run)
    return outcome(run)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    return write_small_dataset(tmp_path_factory.mktemp("data") / "ds")


@pytest.fixture(scope="session")
def ckpt_run(tmp_path_factory, small_dataset) -> Path:
    """A `vla train` run folder with one complete checkpoint (step 2)."""
    run = tmp_path_factory.mktemp("ckpt") / "run"
    rc, err = cli(["train", "--data", str(small_dataset), "--out", str(run), *CLI_TRAIN, "train.steps=2"])
    assert rc == 0, err
    return run


def micro_policy(
    path: Path, nan: bool = False, state_dim: int | None = None, action_dim: int | None = None
) -> Path:
    """The tiny policy of tests/infer (with EMA weights), optionally with every weight NaN."""
    from tests.infer.conftest import micro_config
    from vlastack.data.stats import Normalizer
    from vlastack.models import build_model

    torch.manual_seed(0)
    model = build_model(micro_config())
    if nan:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
    model.save_pretrained(path)
    model.save_pretrained(path / "ema")
    s, a = state_dim or 6, action_dim or 7
    stats = {
        "observation.state": {"mean": np.zeros(s), "std": np.ones(s)},
        "action": {"q01": -np.ones(a), "q99": np.ones(a)},
    }
    Normalizer(stats, {"observation.state": "mean_std", "action": "quantiles"}).save(path / "norm_stats.json")
    return path


@pytest.fixture(scope="session")
def good_policy(tmp_path_factory) -> Path:
    return micro_policy(tmp_path_factory.mktemp("policy") / "p")


@pytest.fixture(scope="session")
def nan_policy(tmp_path_factory) -> Path:
    return micro_policy(tmp_path_factory.mktemp("nanpolicy") / "p", nan=True)
