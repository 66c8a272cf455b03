"""Scripted experts succeed on every built-in task, with and without action noise."""

from __future__ import annotations

import numpy as np
import pytest

from vlastack.sim.env import SUITES, make_env
from vlastack.sim.generate import rollout_expert


def _success_rate(task: str, episodes: int, noise: float, seed0: int) -> float:
    env = make_env(task, image_size=32, cameras=("scene",))
    ok = [rollout_expert(env, seed0 + s, noise)["success"] for s in range(episodes)]
    env.close()
    return float(np.mean(ok))


@pytest.mark.parametrize("task", SUITES["builtin"])
def test_expert_succeeds_fast(task):
    assert _success_rate(task, 6, 0.0, 500) == 1.0
    assert _success_rate(task, 4, 0.3, 600) == 1.0  # noisy demos still succeed


@pytest.mark.slow
@pytest.mark.parametrize("task", SUITES["builtin"])
def test_expert_success_rate_at_least_95_percent(task):
    assert _success_rate(task, 40, 0.0, 10_000) >= 0.95
    assert _success_rate(task, 40, 0.2, 20_000) >= 0.95


def test_rollout_arrays_are_aligned():
    env = make_env("stack", image_size=32)
    ep = rollout_expert(env, 3, 0.1)
    env.close()
    t = ep["length"]
    assert ep["success"] and 5 < t <= env.max_steps
    assert ep["images"]["scene"].shape == (t, 32, 32, 3) and ep["images"]["wrist"].shape == (t, 32, 32, 3)
    assert ep["state"].shape == (t, 5) and ep["action"].shape == (t, 4)
    assert ep["action"].dtype == np.float32 and np.abs(ep["action"]).max() <= 1.0
    assert (ep["action"][:, 3] > 0).any() and (ep["action"][:, 3] <= 0).any()  # grasps and releases


@pytest.mark.parametrize("task", ["reach", "push", "pick_place", "stack", "reach_moving", "carry"])
def test_distance_to_done_closes_as_the_expert_succeeds(task):
    """``info["distance"]`` (``Task.distance``, what ``rl.progress_reward`` shapes with) is far
    after the first step and near zero when the expert succeeds."""
    env = make_env(task, image_size=16, cameras=("scene",))
    for seed in (0, 1):
        env.reset(seed=seed)
        first = None
        while True:
            _, _, terminated, truncated, info = env.step(env.expert_action())
            first = info["distance"] if first is None else first
            if terminated or truncated:
                break
        assert info["success"] and first > 0.04 and info["distance"] < min(0.035, 0.5 * first)
    env.close()
