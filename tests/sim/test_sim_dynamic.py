"""Dynamic task families (sim/dynamic.py) and evaluation under simulated inference delay."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from vlastack.config import EXECUTION_METHODS, EvalConfig, ExecutionConfig
from vlastack.sim.dynamic import BELT_SPEED, DYNAMIC_TASKS
from vlastack.sim.env import SUITES, make_env, suite_tasks
from vlastack.sim.evaluate import evaluate
from vlastack.sim.generate import rollout_expert

# sha256 of the static families' expert episodes (state, action, privileged positions, prompt;
# seeds 0-1, DART noise 0.1), measured on main before the dynamic families existed: adding them
# must not change the demo's data.
STATIC_GOLDEN = "e4f4201bef35d81a0d6ae11f69a72813baf1581e654d646acd828fcfbb3038f2"


def test_default_suite_is_unchanged_and_dynamic_tasks_are_selectable():
    assert suite_tasks("builtin") == ("reach", "push", "pick_place", "stack") == SUITES["builtin"]
    assert suite_tasks("dynamic") == tuple(DYNAMIC_TASKS) == ("reach_moving", "reach_switch")
    assert suite_tasks("builtin", ["reach", "reach_moving"]) == ("reach", "reach_moving")
    with pytest.raises(ValueError, match="unknown task"):
        suite_tasks("dynamic", ["push"])


def test_static_expert_episodes_are_bit_identical_to_before():
    h = hashlib.sha256()
    for task in ("reach", "push", "pick_place", "stack"):
        env = make_env(task, image_size=16, cameras=("scene",))
        for seed in (0, 1):
            ep = rollout_expert(env, seed, 0.1, privileged=True)
            for k in ("state", "action", "privileged"):
                h.update(np.ascontiguousarray(ep[k]).round(5).tobytes())
            h.update(ep["prompt"].encode())
        env.close()
    assert h.hexdigest() == STATIC_GOLDEN


@pytest.mark.parametrize("task", sorted(DYNAMIC_TASKS))
def test_dynamic_experts_succeed(task):
    env = make_env(task, image_size=16, cameras=("scene",), suite="dynamic")
    eps = [rollout_expert(env, seed, 0.1, privileged=True) for seed in range(6)]
    env.close()
    assert all(e["success"] for e in eps), [e["length"] for e in eps]


def test_settle_records_expert_steps_after_the_success():
    env = make_env("reach_moving", image_size=16, cameras=("scene",))
    base = rollout_expert(env, 2, 0.1)
    more = rollout_expert(env, 2, 0.1, settle=5)
    env.close()
    assert base["success"] and more["success"] and more["length"] == base["length"] + 5
    np.testing.assert_array_equal(more["action"][: base["length"]], base["action"])
    # next.success / next.reward: the success is the step that ended the base episode.
    n = base["length"]
    assert base["next_success"][-1] and not base["next_success"][:-1].any()
    np.testing.assert_array_equal(more["next_success"][:n], base["next_success"])
    np.testing.assert_array_equal(more["reward"][:n], base["reward"])
    assert len(more["reward"]) == len(more["next_success"]) == more["length"]


def test_the_belt_moves_the_target_and_the_switch_moves_the_color():
    env = make_env("reach_moving", image_size=16, cameras=("scene",), seed=3)
    x0 = env.privileged_state()[0]
    hold = np.array([0, 0, 0, -1], np.float32)
    for _ in range(5):
        env.step(hold)
    assert env.privileged_state()[0] == pytest.approx(x0 + 5 * BELT_SPEED, abs=1e-6)
    assert not env.task.success()  # holding still never touches it
    env = make_env("reach_switch", image_size=16, cameras=("scene",), seed=3)
    first = env.privileged_state()[:2].copy()
    for _ in range(env.task.switch_at):
        _, _, done, _, _ = env.step(hold)
        assert not done
    assert np.linalg.norm(env.privileged_state()[:2] - first) > 0.1  # the target is the other block


class ExpertChunks:
    """The scripted expert replanned as a chunk (its next action repeated): an open-loop policy
    that suffers from delay, for testing the evaluation path without a network."""

    needs_env = True

    def bind_env(self, env):
        self.env = env

    def reset(self):
        pass

    def infer(self, obs):
        return {"actions": np.repeat(self.env.expert_action()[None], 8, 0).astype(np.float32)}


@pytest.mark.parametrize("method", EXECUTION_METHODS)
def test_every_method_evaluates_under_delay(method):
    cfg = EvalConfig(
        suite="dynamic", episodes=2, num_workers=0, steps_per_chunk=2, temporal_ensemble=0.1, videos=0,
        image_size=16, execution=ExecutionConfig(method=method, delay=2),
    )  # fmt: skip
    res = evaluate(ExpertChunks(), cfg, cameras=("scene",))
    assert res["config"]["execution"]["method"] == method
    ep = res["episodes"][0]
    assert ep["paused_steps"] >= 2 and ep["starved_steps"] == 0 and ep["boundaries"] >= 1
    assert "max_jump" in res["overall"] and "mean_jump" in res["overall"]


def test_a_flow_policy_runs_every_method_in_the_simulator():
    from tests.infer.conftest import micro_config
    from vlastack.data.stats import Normalizer
    from vlastack.infer.policy import Policy
    from vlastack.models import build_model

    stats = {"observation.state": {"mean": np.zeros(5), "std": np.ones(5)},
             "action": {"mean": np.zeros(4), "std": np.ones(4)}}  # fmt: skip
    torch.manual_seed(0)
    model = build_model(micro_config())
    policy = Policy(model, Normalizer(stats, {"observation.state": "mean_std", "action": "mean_std"}), seed=0)
    for method in ("naive_async", "rtc_inference", "rtc_training", "bid"):
        cfg = EvalConfig(
            suite="dynamic", tasks=("reach_moving",), episodes=1, num_workers=0, steps_per_chunk=4, videos=0,
            image_size=64, execution=ExecutionConfig(method=method, delay=3, bid_samples=3),
        )  # fmt: skip
        res = evaluate(policy, cfg)
        assert res["episodes"][0]["steps"] == 30 and res["episodes"][0]["requests"] >= 5
