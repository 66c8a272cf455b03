"""The fair Meta-World protocol's bookkeeping (bench/metaworld_protocol.py): the fields on every row
of bench/results/metaworld.json and validation trials kept apart from the table."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bench.metaworld_protocol import (
    FIELDS,
    TEST_SEED,
    VALIDATION_SEED,
    agreement,
    backfill,
    protocol_fields,
    record_validation,
)

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "metaworld.json"


def _row(points: int, steps: int = 100, batch: int = 32, cpu_hours: float = 1.0, overrides=()) -> dict:
    tc = {"recipe": "metaworld_mt10", "steps": steps, "batch_size": batch, "grad_accum": 1,
          "model.grounding": {"points": points}, "overrides": list(overrides)}  # fmt: skip
    return {"per_task": {"reach-v3": 0.5}, "episodes_per_task": 50, "cpu_hours": cpu_hours, "train_config": tc,
            "render_quality": "fast", "train_seeds": {"reach-v3": [0, 49, 50]}}  # fmt: skip


def test_fields_say_what_a_row_is():
    rows = {"vlastack": _row(2, cpu_hours=2.0), "nolabels": _row(0, steps=200, cpu_hours=8.0)}
    f = protocol_fields("mt10", "nolabels", rows["nolabels"], rows)
    assert set(FIELDS) <= set(f)
    assert (
        f["privileged_labels"] is False
        and protocol_fields("mt10", "vlastack", rows["vlastack"], rows)["privileged_labels"]
    )
    assert f["samples_seen"] == 200 * 32 and f["budget_multiple"] == 4.0 and f["demos_per_task"] == 50
    assert f["trials_per_task"] == 50 and f["evaluator"].startswith("vla eval")
    # A row recorded before the config carried model.grounding ran a Meta-World recipe with it on.
    legacy = _row(2)
    del legacy["train_config"]["model.grounding"]
    assert protocol_fields("mt10", "x", legacy, rows)["privileged_labels"] is True
    # LeRobot rows: lerobot-train's default batch of 8; their evaluator as recorded.
    lr = {"per_task": {}, "episodes_per_task": 2, "cpu_hours": 1.0, "eval": {"evaluator": "lerobot-eval (...)"},
          "train_config": {"trainer": "lerobot-train ...", "steps_reached": 10}}  # fmt: skip
    f = protocol_fields("mt10", "lerobot_act", lr, rows)
    assert f["samples_seen"] == 80 and f["evaluator"] == "lerobot-eval (...)" and not f["privileged_labels"]


def test_agreement_is_mcnemar_at_95():
    assert agreement(30, 27, 0.9, 0.8667)["agree"] is True  # 3 discordant, 2 vs 1
    assert agreement(50, 30, 0.9, 0.5)["agree"] is False  # 20 discordant, all one way


def test_validation_trials_stay_off_the_table_and_off_the_test_seeds():
    ev = {"tasks": {"reach-v3": {"n": 2, "success_rate": 0.5}}, "overall": {"ci95": [0.1, 0.9]},
          "episodes": [{"seed": VALIDATION_SEED}, {"seed": VALIDATION_SEED + 1}]}  # fmt: skip
    res: dict = {"mt10": {}}
    record_validation(res, "mt10", "nolabels", ev, {"trial": "a"})
    record_validation(res, "mt10", "nolabels", ev, {"trial": "b"})
    record_validation(res, "mt10", "nolabels", ev, {"trial": "a"})  # re-scored: replaced, not doubled
    assert [t["trial"] for t in res["mt10"]["tuning"]["nolabels"]] == ["b", "a"]
    assert res["mt10"]["tuning"]["nolabels"][0]["seeds"] == [VALIDATION_SEED, VALIDATION_SEED + 1]
    ev["episodes"] = [{"seed": TEST_SEED}]
    with pytest.raises(ValueError, match="test seeds"):
        record_validation(res, "mt10", "nolabels", ev, {"trial": "c"})


def test_every_recorded_row_carries_the_protocol_fields():
    res = json.loads(RESULTS.read_text())
    rows = [(s, n, r) for s in ("mt10", "mt50") for n, r in res[s].items() if "per_task" in r]
    assert rows and all(set(FIELDS) <= set(r) for _, _, r in rows)
    assert backfill(copy.deepcopy(res)) == res  # the file is what backfill writes (idempotent)
    grounding = [(s, n) for s, n, r in rows if r["privileged_labels"]]
    assert ("mt10", "vlastack") in grounding and ("mt50", "vlastack") in grounding


def test_a_rows_lerobot_env_check_is_read_from_its_file(tmp_path, monkeypatch):
    import bench.metaworld_protocol as mp

    monkeypatch.setattr(mp, "RESULTS", tmp_path)
    rows = {"vlastack": _row(2)}
    row = _row(2) | {"lerobot_env_check": None}  # stored before the check ran
    assert protocol_fields("mt10", "vlastack_hindsight", row, rows)["lerobot_env_check"] is None
    summary = {"compared": 30, "same_outcome": 28, "success_vla_eval": 0.9, "success_lerobot_env": 0.8667}
    (tmp_path / mp.LEROBOT_ENV_CHECKS[("mt10", "vlastack_hindsight")]).write_text(
        json.dumps({"summary": summary})
    )
    check = protocol_fields("mt10", "vlastack_hindsight", row, rows)["lerobot_env_check"]
    assert check["episodes"] == 30 and check["same_outcome"] == 28 and check["agree"] is True
    assert protocol_fields("mt10", "unknown_row", row, rows)["lerobot_env_check"] is None


def test_a_stopped_trial_is_kept_unscored_beside_the_scored_ones():
    from bench.metaworld_protocol import record_stopped_trial

    res = {"mt10": {"tuning": {"act": [{"trial": "t1", "mean": 0.17}]}}}
    e = record_stopped_trial(res, "mt10", "act", {"trial": "t2", "cpu_hours": 0.5}, "loss flat")
    assert e["mean"] is None and e["stopped"] == "loss flat" and e["cpu_hours"] == 0.5
    record_stopped_trial(res, "mt10", "act", {"trial": "t2"}, "again")  # the same trial replaces itself
    assert [(t["trial"], t["mean"]) for t in res["mt10"]["tuning"]["act"]] == [("t1", 0.17), ("t2", None)]


def test_a_tuned_lerobot_row_is_its_best_validation_trial_scored_on_the_test_seeds(tmp_path, monkeypatch):
    """bench/lerobot_served.py --row: the table row of a LeRobot recipe carries the trials it was
    chosen from and their validation seeds; a run that is not the best validation trial is refused."""
    from bench import metaworld as bm
    from bench.metaworld_protocol import chosen_recipe
    from vlastack.sim.evaluate import summarize

    monkeypatch.setattr(bm, "RESULTS", tmp_path / "metaworld.json")
    t3, t4 = tmp_path / "lr_act_t3", tmp_path / "lr_act_t4"
    trials = [{"trial": "t2", "run": str(tmp_path / "t2"), "mean": None, "stopped": "loss flat"},
              {"trial": "t3", "run": str(t3), "mean": 0.35, "seeds": [2000, 2009]},
              {"trial": "t4", "run": str(t4), "mean": 0.43, "seeds": [2000, 2009]}]  # fmt: skip
    bm.save({"mt10": {"vlastack": {"cpu_hours": 1.7}, "tuning": {"lerobot_act": trials}}})
    with pytest.raises(ValueError, match="below"):
        chosen_recipe(bm.load(), "mt10", "lerobot_act", t3)
    with pytest.raises(ValueError, match="not a scored trial"):
        chosen_recipe(bm.load(), "mt10", "lerobot_act", tmp_path / "t2")
    chosen = chosen_recipe(bm.load(), "mt10", "lerobot_act", t4)
    assert chosen == {"validation_seeds": [2000, 2009], "tuning_trials": 3, "chosen_trial": "t4",
                      "validation_mean": 0.43}  # fmt: skip

    t4.mkdir()
    info = {"policy": "act", "data": str(tmp_path / "data"), "cpu_hours": 1.71, "step_reached": 2905,
            "plan": {"steps": 3316}, "commands": ["lerobot-train ..."], "non_default": {}, "train_module": "m",
            "versions": {"lerobot": "0.6.1"}, "segments": []}  # fmt: skip
    (t4 / "run.json").write_text(json.dumps(info))
    eps = [
        {"task": "reach-v3", "seed": 1000 + j, "success": j < 3, "steps": 100, "episode": j} for j in range(4)
    ]
    ev = summarize(eps, ("reach-v3",), "ws://127.0.0.1", "metaworld", 1.0)
    ev["config"] = {"seed": 1000, "episodes": 4, "seed_scheme": "per_task", "render_quality": "lerobot"}
    (tmp_path / "eval.json").write_text(json.dumps(ev))
    bm.record_lerobot(
        "mt10",
        "lerobot_act_tuned",
        tmp_path / "eval.json",
        t4,
        "test",
        tmp_path / "data",
        {"evaluator": "vla eval"},
        chosen,
    )
    row = bm.load()["mt10"]["lerobot_act_tuned"]
    assert row["mean"] == 0.75 and row["eval_seeds"] == [1000, 1001, 1002, 1003] and row["cpu_hours"] == 1.71
    assert row["validation_seeds"] == [2000, 2009] and row["tuning_trials"] == 3 and "tuning_note" not in row
    assert (
        row["evaluator"] == "vla eval" and row["samples_seen"] == 2905 * 8 and row["budget_multiple"] == 1.006
    )
    assert row["privileged_labels"] is False and row["train_config"]["steps_planned"] == 3316


def test_a_vlastack_row_with_validation_trials_takes_its_chosen_recipe(tmp_path):
    """bench/metaworld.py record: a run's protocol.json wins; else a row whose name has validation
    trials gets chosen_recipe's fields (a run that is not the best trial is refused); else none."""
    from bench.metaworld import PROTOCOL, run_protocol

    a, b = tmp_path / "mt10_fast", tmp_path / "other"
    trials = [{"trial": "t1", "run": str(a), "mean": 0.84, "seeds": [2000, 2009]},
              {"trial": "t2", "run": str(b), "mean": 0.5, "seeds": [2000, 2009]}]  # fmt: skip
    res = {"mt10": {"tuning": {"vlastack_hindsight_fast": trials}}}
    got = run_protocol(res, "mt10", "vlastack_hindsight_fast", a)
    assert got == {"validation_seeds": [2000, 2009], "tuning_trials": 2, "chosen_trial": "t1",
                   "validation_mean": 0.84}  # fmt: skip
    with pytest.raises(ValueError, match="below"):
        run_protocol(res, "mt10", "vlastack_hindsight_fast", b)
    assert run_protocol(res, "mt10", "no_trials_row", a) == {}
    a.mkdir()
    (a / PROTOCOL).write_text(json.dumps({"validation_seeds": [2000, 2019], "tuning_trials": 3}))
    assert run_protocol(res, "mt10", "vlastack_hindsight_fast", a)["tuning_trials"] == 3
