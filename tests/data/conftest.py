"""Shared fixtures for the data tests: tiny LeRobot datasets written with our writer."""

from __future__ import annotations

import numpy as np
import pytest

from vlastack.data.lerobot import LeRobotWriter

FEATURES = {
    "observation.images.scene": {
        "dtype": "video",
        "shape": [32, 32, 3],
        "names": ["height", "width", "channels"],
    },
    "observation.images.wrist": {
        "dtype": "image",
        "shape": [16, 16, 3],
        "names": ["height", "width", "channels"],
    },
    "observation.state": {"dtype": "float32", "shape": [5], "names": None},
    "action": {"dtype": "float32", "shape": [3], "names": None},
}


def episode(t: int, ep: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Frame f of episode ep has scene pixel value (10 * f + ep) % 256 in its top-left 8x8 block."""
    scene = np.full((t, 32, 32, 3), 40, np.uint8)
    scene[:, :8, :8] = ((np.arange(t) * 10 + ep) % 256)[:, None, None, None]
    return {
        "observation.images.scene": scene,
        "observation.images.wrist": rng.integers(0, 255, (t, 16, 16, 3), dtype=np.uint8),
        "observation.state": rng.normal(size=(t, 5)).astype(np.float32),
        "action": (np.arange(t)[:, None] + ep * 1000 + np.zeros((1, 3))).astype(np.float32),
    }


def write_dataset(root, lengths=(12, 20, 9), features=FEATURES, seed=0):
    rng = np.random.default_rng(seed)
    w = LeRobotWriter(root, fps=10, features=features, robot_type="test")
    data = []
    for ep, t in enumerate(lengths):
        d = episode(t, ep, rng)
        d = {k: v for k, v in d.items() if k in features}
        w.add_episode(d, task=f"task {ep % 2}")
        data.append(d)
    w.finalize()
    return data


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot") / "ds"
    data = write_dataset(root)
    return root, data
