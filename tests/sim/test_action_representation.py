"""Absolute end-effector targets as an action representation (issue 38): the env, the expert, the
generator's record, training carrying it into the policy, and the evaluator and real-time runner
acting in it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vlastack.config import EvalConfig, ExecutionConfig, ModelConfig
from vlastack.infer.realtime import RealtimeRunner, hold_action
from vlastack.sim.env import make_env
from vlastack.sim.generate import rollout_expert
from vlastack.sim.scene import EE_HIGH, EE_LOW, MAX_DELTA

TASKS = ("reach", "push", "pick_place", "stack", "reach_moving", "reach_switch")


@pytest.mark.parametrize("task", TASKS)
def test_absolute_expert_replays_the_delta_expert(task):
    """The same seeds give the same trajectory and outcome in both representations, and every
    absolute action is where the delta would move the gripper (noise included: the same draw)."""
    eps = {}
    for rep in ("delta", "absolute"):
        env = make_env(task, image_size=16, cameras=("scene",), action_representation=rep)
        eps[rep] = rollout_expert(env, 3, noise=0.1, settle=2)
        env.close()
    d, a = eps["delta"], eps["absolute"]
    assert d["success"] and a["success"] and d["length"] == a["length"]
    np.testing.assert_allclose(a["state"], d["state"], atol=1e-6)
    ee = d["state"][:, :3]
    want = np.clip(ee + np.clip(d["action"][:, :3], -1, 1) * MAX_DELTA, EE_LOW, EE_HIGH)
    np.testing.assert_allclose(a["action"][:, :3], want, atol=1e-6)
    np.testing.assert_array_equal(a["action"][:, 3], d["action"][:, 3])


def test_absolute_env_action_space_and_speed_limit():
    env = make_env("reach", image_size=16, cameras=("scene",), seed=0, action_representation="absolute")
    assert env.action_space.shape == (4,) and env.action_space.low[2] > 0  # a position box, not [-1, 1]
    start = env.core.ee_pos
    far = np.append(start + np.array([0.5, 0.0, 0.0]), -1.0).astype(np.float32)
    env.step(far)  # a target 50 cm away moves the gripper by the speed limit
    assert env.core.ee_pos[0] - start[0] == pytest.approx(MAX_DELTA, abs=1e-9)
    here = np.append(env.core.ee_pos, -1.0).astype(np.float32)
    before = env.core.ee_pos
    env.step(here)  # the current position holds still
    np.testing.assert_allclose(env.core.ee_pos, before, atol=1e-9)


def test_only_the_builtin_suites_take_absolute_actions():
    with pytest.raises(ValueError, match="delta actions only"):
        make_env("reach-v3", suite="metaworld", action_representation="absolute")
    with pytest.raises(ValueError, match="must be one of delta, absolute"):
        make_env("reach", action_representation="joint")
    with pytest.raises(ValueError, match="action_representation"):
        ModelConfig(action_representation="relative")
    with pytest.raises(ValueError, match="action_representation"):
        EvalConfig(action_representation="joint")


def test_hold_action_by_representation():
    last = np.array([0.1, 0.2, 0.3, 1.0], np.float32)
    np.testing.assert_array_equal(hold_action(last, 4), [0, 0, 0, 1])
    state = np.array([0.01, -0.08, 0.14, 1.0, 0.0], np.float32)  # ee xyz, opening, holding
    np.testing.assert_array_equal(hold_action(last, 4, "absolute", state), np.append(state[:3], 1.0))
    with pytest.raises(ValueError, match="current position"):
        hold_action(last, 4, "absolute", None)
    with pytest.raises(ValueError, match="representation"):
        RealtimeRunner(None, ExecutionConfig(), 4, 4, representation="joint")


class Slow:
    """Always the same chunk: the gripper's target 10 cm along +x of the start."""

    def __init__(self, target):
        self.chunk = np.tile(np.append(target, -1.0).astype(np.float32), (8, 1))

    def infer(self, obs):
        return {"actions": self.chunk}


def test_sync_waits_hold_the_arm_still_with_absolute_actions():
    """While the first chunk computes (delay 3), an absolute-action robot stays where it is (a
    zero action would send it to the origin), then moves toward the chunk's target."""
    env = make_env("reach", image_size=16, cameras=("scene",), action_representation="absolute")
    obs, _ = env.reset(seed=5)
    start = env.core.ee_pos
    path = []

    def step(a):
        o, _, term, trunc, _ = env.step(a)
        path.append(env.core.ee_pos)
        return o, term or trunc

    runner = RealtimeRunner(Slow(start + np.array([0.1, 0.0, 0.0])), ExecutionConfig(method="sync", delay=3), 4, 4,
                            representation="absolute")  # fmt: skip
    stats = runner.run(obs, step, max_steps=6)
    runner.close()
    np.testing.assert_allclose(path[2], start, atol=1e-6)  # held for the 3 steps of the delay
    assert path[5][0] - start[0] == pytest.approx(3 * MAX_DELTA, abs=1e-6) and stats.paused_steps == 3


@pytest.fixture(scope="module")
def absolute_data(tmp_path_factory):
    from vlastack.sim.generate import generate

    root = tmp_path_factory.mktemp("abs") / "data"
    generate(
        root,
        tasks=("reach",),
        episodes=2,
        workers=0,
        seed=0,
        progress=False,
        action_representation="absolute",
    )
    return root


def test_generator_records_the_representation(absolute_data):
    from vlastack.data.format import action_representation

    meta = json.loads((absolute_data / "meta" / "vlastack_sim.json").read_text())
    info = json.loads((absolute_data / "meta" / "info.json").read_text())
    assert meta["action_representation"] == "absolute" == action_representation(absolute_data)
    assert info["features"]["action"]["names"] == ["x", "y", "z", "grip"]
    assert action_representation(None) is None


def test_training_carries_the_representation_to_policy_server_and_eval(absolute_data, tmp_path, capsys):
    from vlastack.cli import main
    from vlastack.infer.policy import Policy
    from vlastack.sim.evaluate import evaluate

    ov = ["model.vision.patch_size=16", "model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1",
          "model.head_options.num_denoise_steps=2", "train.batch_size=4", "train.steps=1", "data.num_workers=0",
          "train.num_threads=2"]  # fmt: skip
    run = tmp_path / "run"
    assert main(["train", "--data", str(absolute_data), "--out", str(run), *ov]) == 0
    final = run / "final"
    assert json.loads((final / "config.json").read_text())["model"]["action_representation"] == "absolute"
    policy = Policy.from_pretrained(final)
    assert policy.action_representation == "absolute" == policy.metadata["action_representation"]
    res = evaluate(str(final), EvalConfig(tasks=("reach",), episodes=1, num_workers=0, videos=0))
    assert res["config"]["action_representation"] == "absolute"
    with pytest.raises(ValueError, match="wrong representation"):
        evaluate(
            str(final), EvalConfig(tasks=("reach",), episodes=1, num_workers=0, action_representation="delta")
        )
    # Contradicting the data's record is refused before anything trains.
    rc = main(["train", "--data", str(absolute_data), "--out", str(tmp_path / "r2"), *ov,
               "model.action_representation=delta"])  # fmt: skip
    assert rc == 2 and "records absolute actions" in capsys.readouterr().err


def test_a_run_saved_before_the_record_resumes(absolute_data, tmp_path):
    """A checkpoint whose config.yaml predates model.action_representation (no key: auto) resumes on
    the same data: taking the data's record is not a change of model."""
    from vlastack.cli import main

    ov = ["model.vision.patch_size=16", "model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1",
          "train.batch_size=4", "data.num_workers=0", "train.num_threads=2", "train.save_every=1"]  # fmt: skip
    run = tmp_path / "run"
    assert main(["train", "--data", str(absolute_data), "--out", str(run), *ov, "train.steps=1"]) == 0
    for f in run.rglob("config.yaml"):  # as written before the field existed
        f.write_text(f.read_text().replace("  action_representation: absolute\n", ""))
    assert "action_representation: absolute" not in (run / "config.yaml").read_text()
    assert (
        main(["train", "--data", str(absolute_data), "--out", str(run), *ov, "train.steps=2", "--resume"])
        == 0
    )
