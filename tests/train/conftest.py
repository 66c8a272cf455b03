"""Fixtures shared by the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def sim_data(tmp_path_factory):
    """Four scripted built-in demos (a LeRobot v3 dataset), made once per test module."""
    from vlastack.sim.generate import generate

    root = tmp_path_factory.mktemp("sim") / "data"
    generate(root, episodes=4, workers=0, seed=0, progress=False)
    return root
