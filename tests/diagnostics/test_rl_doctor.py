"""``vla doctor --run``: a vla rl run folder read back, each finding from the run's own numbers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from vlastack.cli import main
from vlastack.config import load_config, save_yaml
from vlastack.diagnostics.rl_doctor import diagnose


def _run(tmp_path, rows, **rl):
    cfg = load_config("tiny")
    rl = {"groups": 4, "eval_episodes": 60} | rl
    save_yaml(replace(cfg, rl=replace(cfg.rl, **rl)), tmp_path / "config.yaml")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def _row(it, success, informative=4, clip=0.0005, ratio=0.005, val=None, rollout_s=10.0, update_s=20.0):
    r = {"iteration": it, "success": success, "episodes": 32, "informative_groups": informative,
         "gradient_steps": 6, "clip_fraction": clip, "ratio_dev": ratio, "invalid_chunks": 0,
         "rollout_s": rollout_s, "update_s": update_s, "cpu_s": 30.0 * (it + 1)}  # fmt: skip
    if val is not None:
        r["val_success"] = val
    return r


def test_a_stalled_run_is_told_what_to_change(tmp_path):
    """Tiny updates, a validation peak inside its noise, flat rollouts: the pilot's pattern."""
    vals = {4: 0.717, 9: 0.85, 14: 0.717, 19: 0.767}
    rows = [_row(i, 0.45 - 0.001 * i, val=vals.get(i)) for i in range(20)]
    (tmp_path / "best.json").write_text(json.dumps({"iteration": 10, "val_success": 0.85}))
    d = diagnose(_run(tmp_path, rows))
    assert [f["id"] for f in d["findings"]] == [
        "tiny_updates",
        "validation_within_noise",
        "flat_rollout_success",
    ]
    assert d["findings"][0]["overrides"] == ["rl.epochs=2", "rl.lr=2e-05", "rl.minibatch=128"]
    assert d["summary"]["validation_noise"] == pytest.approx(0.147, abs=0.002)  # 60 episodes each
    assert d["validation"][1] == {"iteration": 10, "success": 0.85, "ci95": [0.739, 0.919]}
    assert d["best"]["iteration"] == 10


def test_a_learning_run_with_little_signal_and_slow_envs(tmp_path):
    """Updates that move, success rising, validation well past its noise; but few informative
    groups, and rollouts three times the update with the envs in the learner process."""
    rows = [_row(i, 0.2 + 0.03 * i, informative=1, clip=0.08, ratio=0.1, rollout_s=60.0) for i in range(20)]
    rows[4]["val_success"], rows[19]["val_success"] = 0.3, 0.8
    d = diagnose(_run(tmp_path, rows))
    assert [f["id"] for f in d["findings"]] == ["few_informative_groups", "rollouts_dominate"]
    assert d["findings"][1]["overrides"] == ["rl.env_workers=2"]
    d = diagnose(_run(tmp_path, rows, env_workers=2))
    assert [f["id"] for f in d["findings"]] == ["few_informative_groups"]


def test_a_validation_curve_that_never_beats_its_first_point(tmp_path):
    rows = [_row(i, 0.4, clip=0.02, ratio=0.05) for i in range(20)]
    rows[9]["val_success"], rows[19]["val_success"] = 0.62, 0.513
    d = diagnose(_run(tmp_path, rows, eval_episodes=150))
    assert [f["id"] for f in d["findings"]] == ["validation_not_rising", "flat_rollout_success"]
    assert "first 62.0% (iteration 10), last 51.3%" in d["findings"][0]["why"]


def test_the_start_is_the_curves_first_point(tmp_path, capsys):
    """vla rl's validation_start.json is iteration 0: later points are judged against the start."""
    rows = [_row(i, 0.4, clip=0.02, ratio=0.05) for i in range(20)]
    rows[9]["val_success"], rows[19]["val_success"] = 0.62, 0.66
    run = _run(tmp_path, rows, eval_episodes=150)
    (run / "validation_start.json").write_text(json.dumps({"val_success": 0.7, "val_by_task": {}}))
    d = diagnose(run)
    assert [v["iteration"] for v in d["validation"]] == [0, 10, 20]
    assert d["findings"][0]["id"] == "validation_not_rising"
    assert "the start 70.0% (iteration 0), last 66.0%" in d["findings"][0]["why"]
    assert main(["doctor", "--run", str(run)]) == 0
    assert "validation of the start: 70.0%" in capsys.readouterr().out


def test_cli_prints_and_writes_doctor_json(tmp_path, capsys):
    run = _run(tmp_path, [_row(i, 0.5) for i in range(3)])
    assert main(["doctor", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "3 iterations" in out and "The updates barely move the policy" in out
    assert json.loads((run / "doctor.json").read_text())["summary"]["iterations"] == 3


def test_refuses_a_folder_that_is_not_an_rl_run(tmp_path):
    with pytest.raises(ValueError, match="not a vla rl run folder"):
        diagnose(tmp_path)
    with pytest.raises(ValueError, match="no iteration rows"):
        diagnose(_run(tmp_path, []))
