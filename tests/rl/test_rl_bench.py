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
