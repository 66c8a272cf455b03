"""The demo's demonstrations are imitable by a policy with perfect perception; heavy noise is not."""

from __future__ import annotations

import numpy as np
import pytest

from vlastack.apps.demo import DATA_NOISE
from vlastack.sim.env import make_env
from vlastack.sim.imitability import oracle_bc


def test_privileged_state_names_the_prompted_objects():
    env = make_env("reach", image_size=16, cameras=("scene",))
    env.reset(seed=3)
    goal = env.privileged_state()
    assert goal.shape == (6,) and goal.dtype == np.float32
    np.testing.assert_allclose(goal[:2], env.core.pos(env.task.target)[:2], atol=1e-6)
    env.close()
    env = make_env("stack", image_size=16, cameras=("scene",))
    env.reset(seed=3)
    key = env.privileged_state()
    np.testing.assert_allclose(key[:3], env.core.pos("block0"), atol=1e-6)  # the block named first
    np.testing.assert_allclose(key[3:], env.core.pos("block1"), atol=1e-6)  # the block to stack on
    env.close()


@pytest.mark.slow  # two 1500-step behaviour-cloning runs (~80 s); a science check of DATA_NOISE
def test_demo_noise_keeps_experts_imitable_and_heavy_noise_does_not():
    small = dict(episodes=100, steps=1500, eval_episodes=20)
    ok = oracle_bc(noise=DATA_NOISE, **small)
    assert ok["oracle_mean"] >= 0.9, ok
    # At noise 0.3 the gripper and phase switches are scattered by the noise and regression averages
    # them (the oracle hovers over the bowl, gripper command stuck near +0.4): grasping tasks fail.
    bad = oracle_bc(noise=0.3, **small)
    assert bad["oracle_success"]["pick_place"] <= 0.2 and bad["oracle_mean"] <= 0.5, bad
