"""Fragile-payload families (sim/fragile.py): the dynamic reaches carrying a cup that spills on an
abrupt change of velocity."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.sim.test_sim_dynamic import ExpertChunks
from vlastack.config import EvalConfig, ExecutionConfig
from vlastack.sim.env import SUITES, make_env, suite_tasks
from vlastack.sim.evaluate import evaluate
from vlastack.sim.fragile import EXPERT_ACCEL, FRAGILE_TASKS, SPILL_ACCEL
from vlastack.sim.generate import rollout_expert
from vlastack.sim.scene import MAX_DELTA


def test_fragile_suite_is_separate():
    assert suite_tasks("fragile") == tuple(FRAGILE_TASKS) == ("carry_moving", "carry_switch", "carry")
    assert "carry_moving" not in SUITES["builtin"] and "carry_moving" not in SUITES["dynamic"]


@pytest.mark.parametrize("rep", ["delta", "absolute"])
@pytest.mark.parametrize("task", sorted(FRAGILE_TASKS))
def test_fragile_experts_succeed_without_spilling(task, rep):
    env = make_env(task, image_size=16, cameras=("scene",), action_representation=rep)
    for seed in range(5):
        ep = rollout_expert(env, seed, 0.03, privileged=True, settle=4)
        assert ep["success"], (seed, ep["length"])
        assert not env.task.spilled and env.task.peak_accel <= EXPERT_ACCEL + 0.004
    env.close()


def test_an_abrupt_stop_spills_and_ends_the_episode():
    env = make_env("carry_moving", image_size=16, cameras=("scene",), seed=0, action_representation="delta")
    step = np.array([1.0, 0.0, 0.0, -1.0], np.float32)  # 3 cm per step from rest: 3 cm/step^2 at once
    _, _, done, truncated, info = env.step(step)
    assert info["spilled"] and info["peak_accel"] == pytest.approx(MAX_DELTA, abs=1e-6)
    assert MAX_DELTA > SPILL_ACCEL
    assert truncated and not done and not info["success"]
    env = make_env("carry_moving", image_size=16, cameras=("scene",), seed=0, action_representation="delta")
    for k in range(1, 4):  # speeding up by 0.5 cm/step^2 is gentle enough
        _, _, _, truncated, info = env.step(np.array([k / 6, 0, 0, -1], np.float32))
        assert not info["spilled"] and not truncated


def test_the_evaluator_records_spills_under_delay():
    cfg = EvalConfig(
        suite="fragile", episodes=2, num_workers=0, steps_per_chunk=2, videos=0, image_size=16,
        execution=ExecutionConfig(method="naive_async", delay=2),
    )  # fmt: skip
    res = evaluate(ExpertChunks(), cfg, cameras=("scene",))
    for ep in res["episodes"]:
        assert isinstance(ep["spilled"], bool) and ep["peak_accel"] >= 0.0
    static = evaluate(ExpertChunks(), EvalConfig(suite="builtin", tasks=("reach",), episodes=1, num_workers=0,
                                                  videos=0, image_size=16), cameras=("scene",))  # fmt: skip
    assert "spilled" not in static["episodes"][0]  # other tasks' records are unchanged


def test_fragile_data_records_the_velocity_and_cannot_mix_state_sizes(tmp_path):
    import pyarrow.parquet as pq

    from vlastack.sim.generate import OWN_SUITES, generate

    assert tuple(SUITES) == OWN_SUITES
    generate(tmp_path / "d", suite="fragile", tasks=("carry_moving",), episodes=2, workers=0, image_size=16,
             cameras=("scene",), progress=False, action_representation="absolute")  # fmt: skip
    info = json.loads((tmp_path / "d" / "meta" / "info.json").read_text())
    names = info["features"]["observation.state"]["names"]
    assert names[-3:] == ["ee_vx", "ee_vy", "ee_vz"] and len(names) == 8
    assert info["features"]["next.success"] == {"dtype": "bool", "shape": [1], "names": None}
    ok = pq.read_table(tmp_path / "d" / "data/chunk-000/file-000.parquet", columns=["next.success"])
    assert ok.column(0).to_pylist().count(True) == 2  # each episode's last step, spill-free
    with pytest.raises(ValueError, match="different sizes"):
        generate(tmp_path / "e", suite="builtin", tasks=("reach", "carry"), episodes=2, workers=0,
                 image_size=16, cameras=("scene",), progress=False)  # fmt: skip
