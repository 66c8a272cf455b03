"""Meta-World adapter. Meta-World pins mujoco==3.3.0, as vlastack does; it is the optional extra
``vlastack[metaworld]`` (part of the dev extras), so these tests run in CI. The env test is skipped
only where the extra is absent."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from vlastack.sim.env import suite_tasks
from vlastack.sim.metaworld import MT10, describe

HAS_MW = importlib.util.find_spec("metaworld") is not None
needs_mw = pytest.mark.skipif(
    not HAS_MW, reason="metaworld not installed (optional extra; pins mujoco==3.3.0, install in its own venv)"
)


def test_descriptions_and_suite():
    assert describe("door-open-v3") == "open the door"
    assert describe("coffee-pull-v3") == "coffee pull"  # fallback from the task name
    assert suite_tasks("metaworld") == MT10 and len(MT10) == 10


def test_missing_metaworld_gives_install_hint(monkeypatch):
    import sys

    from vlastack.sim.env import make_env

    monkeypatch.setitem(sys.modules, "metaworld", None)  # makes `import metaworld` fail
    with pytest.raises(ImportError, match=r"\[metaworld\]"):
        make_env("reach-v3", suite="metaworld")


@needs_mw
def test_metaworld_env_and_expert():
    from vlastack.sim.env import make_env
    from vlastack.sim.generate import rollout_expert

    env = make_env("reach-v3", suite="metaworld", image_size=32, cameras=("scene", "wrist"))
    obs, _ = env.reset(seed=0)
    assert obs["images"]["scene"].shape == (32, 32, 3) and obs["state"].shape == (4,)
    assert obs["prompt"] == "reach the goal position"
    ep = rollout_expert(env, seed=1)
    assert ep["success"] and ep["action"].shape[1] == 4
    goals = []
    for seed in (1, 2, 1):
        env.reset(seed=seed)
        goals.append(env._raw[-3:].copy())  # the goal position, part of the privileged state
    assert not np.allclose(goals[0], goals[1]) and np.allclose(goals[0], goals[2])
    env.close()
