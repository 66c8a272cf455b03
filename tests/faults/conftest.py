"""Fixtures of the fault-injection suite (built once per session, copied before being broken)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.faults.helpers import write_small_dataset
from tests.faults.trials import outcome, run_training


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted 4-step run every interrupted one must match bit for bit."""
    run = tmp_path_factory.mktemp("reference") / "run"
    run_training(run)
    return outcome(run)


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    return write_small_dataset(tmp_path_factory.mktemp("data") / "ds")


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
