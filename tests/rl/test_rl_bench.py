"""bench/rl.py's bookkeeping: a row's sampling choice comes from its own validation trials, never
from the test seeds."""

from __future__ import annotations

import argparse
import json

import pytest

import bench.rl as rl_bench


def test_each_row_samples_as_its_best_validation_trial(tmp_path, monkeypatch):
    results = tmp_path / "rl.json"
    monkeypatch.setattr(rl_bench, "RESULTS", results)
    trials = [{"policy": "a", "decoding": {}, "success": 0.80}, {"policy": "a", "decoding": {"step_noise": "0.3"}, "success": 0.84},
              {"policy": "b", "decoding": {}, "success": 0.83}, {"policy": "b", "decoding": {"step_noise": "0.15"}, "success": 0.83},
              {"policy": "c", "decoding": {"step_noise": "0.3"}, "success": 0.5}]  # fmt: skip
    results.write_text(json.dumps({"runs": {}, "validation_trials": trials}))
    pick = argparse.Namespace(decode=[], decode_from_validation=True)
    assert rl_bench._decoding(pick, "a") == (("step_noise", "0.3"),)
    assert rl_bench._decoding(pick, "b") == ()  # a tie: the least noise
    assert rl_bench._decoding(pick, "c") == (("step_noise", "0.3"),)
    with pytest.raises(SystemExit, match="no validation trial of d"):
        rl_bench._decoding(pick, "d")
    fixed = argparse.Namespace(decode=["step_noise=0.2"], decode_from_validation=False)
    assert rl_bench._decoding(fixed, "a") == (("step_noise", "0.2"),)
    assert rl_bench._decoding(argparse.Namespace(), "a") == ()  # record-recap: as configured


def test_a_later_stage_counts_the_cpu_its_start_took(tmp_path):
    """A run started from another run's best/ owes that run's CPU up to the picked iteration."""
    from vlastack.config import Config, save_yaml

    run = tmp_path / "stage1"
    run.mkdir()
    save_yaml(Config(), run / "config.yaml")
    rows = [{"iteration": i, "cpu_s": 100.0 * (i + 1), "episodes": 64} for i in range(6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "best.json").write_text(json.dumps({"iteration": 4, "val_success": 0.5}))  # counted from 1
    prior = rl_bench._prior_stage(run)
    assert (prior["iteration"], prior["cpu_s"], prior["rollout_episodes"]) == (4, 400.0, 256)
    assert (prior["run_iterations"], prior["run_cpu_s"]) == (6, 600.0)
    assert prior["rl"]["method"] == "grpo"


def test_paired_by_task_splits_the_seeds():
    a = {"episodes": [{"task": "push", "seed": 1, "success": True}, {"task": "stack", "seed": 2, "success": False},
                      {"task": "push", "seed": 3, "success": True}, {"task": "stack", "seed": 4, "success": True}]}  # fmt: skip
    b = {"episodes": [{**e, "success": not e["success"]} for e in a["episodes"]]}
    d = rl_bench.paired_by_task(a, b)
    assert list(d) == ["push", "stack"]
    assert (d["push"]["n"], d["push"]["difference"]) == (2, 1.0)
    assert (d["stack"]["difference"], d["stack"]["only_first"], d["stack"]["only_second"]) == (0.0, 1, 1)
