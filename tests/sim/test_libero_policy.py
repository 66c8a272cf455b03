"""bench/libero_policy.py pipeline: each stage only if not done; LeRobot's runs get vlastack's
measured CPU-hours and are scored by lerobot-eval's LiberoEnv at the data's size; rows land in
libero.json with their interval, evaluator, seeds and data (stand-ins for the long stages)."""

from __future__ import annotations

import argparse
import json


def _eval_json(tasks, successes):
    from bench.lerobot_metaworld_eval import wilson

    eps = [{"task": t, "seed": 1000 + j, "success": s} for t in tasks for j, s in enumerate(successes)]
    per = {t: {"n": len(successes), "successes": sum(successes), "success_rate": sum(successes) / len(successes)}
           for t in tasks}  # fmt: skip
    k, n = sum(e["success"] for e in eps), len(eps)
    return {"tasks": per, "episodes": eps, "overall": {"n": n, "successes": k, "ci95": wilson(k, n)},
            "config": {"image_size": 128, "command": "lerobot-eval ..."}}  # fmt: skip


def test_pipeline_stages_budget_and_rows(tmp_path, monkeypatch):
    from bench import lerobot_metaworld as lm
    from bench import libero_policy as lp

    monkeypatch.setattr(lp, "RESULTS", tmp_path / "libero.json")
    monkeypatch.setattr(lp, "machine", lambda: {"cpu": "test"})
    data, run = tmp_path / "libero_object", tmp_path / "runs" / "libero_object"
    tasks = ["libero_object/0", "libero_object/1"]
    calls = []

    def call(cmd):
        calls.append(cmd)
        if cmd[3:5] == ["data", "generate"]:
            (data / "meta").mkdir(parents=True)
            info = [{"task": t, "seed": s} for t in tasks for s in (0, 1, 2)]
            (data / "meta" / "vlastack_sim.json").write_text(json.dumps({"episodes": 6, "frames": 600,
                                                                         "episode_info": info}))  # fmt: skip
        elif cmd[2] == "train":
            lr = run.with_name("libero_object.lerobot_act")
            step = lr / lm.OUT / lm.LAST / "training_state" / "training_step.json"
            lm.write_json(step, {"step": 4})
            lm.write_json(lr / lm.PLAN, {"steps": 4})
            lm.write_json(lr / lm.RUN_INFO, {"cpu_hours": 1.9, "versions": {"lerobot": "0.6.1"}, "commands": [],
                                             "plan": {"steps": 4}, "step_reached": 4, "non_default": {}})  # fmt: skip
        else:
            lr = run.with_name("libero_object.lerobot_act")
            lm.write_json(lr / "eval" / "eval.json", _eval_json(tasks, [True, False]))
        return 0

    def train(recipe, r, d, overrides):
        calls.append(["vla train", recipe])
        (r / "final").mkdir(parents=True)
        (r / "final" / "config.yaml").write_text("{}")
        (r / "train_summary.json").write_text("{}")
        (r / "cpu_ledger.json").write_text(
            json.dumps([{"started": "x", "wall_s": 1, "cpu_s": 7200.0, "rc": 0}])
        )
        return 0

    def vla(argv):
        calls.append(["vla", *argv[:1], argv[argv.index("--episodes-per-task") + 1]])
        (run / "eval").mkdir(parents=True)
        (run / "eval" / "eval.json").write_text(json.dumps(_eval_json(tasks, [True, True, False, True])))
        return 0

    monkeypatch.setattr(lp.subprocess, "call", call)
    monkeypatch.setattr(lp, "train_recipe", train)
    monkeypatch.setattr("vlastack.cli.main", vla)
    args = argparse.Namespace(suite="libero_object", data=str(data), run=str(run), workers=2, lerobot="act",
                              overrides=[])  # fmt: skip
    lp.cmd_pipeline(args)
    gen, tr, ev, lr_train, lr_eval = calls
    assert gen[gen.index("--image-size") + 1] == "128" and gen[gen.index("--episodes-per-task") + 1] == "50"
    assert tr == ["vla train", "libero_object"] and ev == ["vla", "eval", "50"]
    assert lr_train[lr_train.index("--cpu-hours") + 1] == "2.0000"  # vlastack's 7200 CPU-s
    assert (
        lr_eval[lr_eval.index("--env") + 1] == "libero"
        and lr_eval[lr_eval.index("--tasks") + 1] == "libero_object"
    )
    assert lr_eval[lr_eval.index("--image-size") + 1] == "128"
    rows = json.loads(lp.RESULTS.read_text())["policies"]["libero_object"]
    assert rows["vlastack"]["mean"] == 0.75 and rows["vlastack"]["cpu_hours"] == 2.0
    assert rows["vlastack"]["data"]["train_seeds"] == {t: [0, 2, 3] for t in tasks}
    assert rows["vlastack"]["eval_seeds"] == [1000, 1003] and not rows["vlastack"]["privileged_labels"]
    assert rows["lerobot_act"]["mean"] == 0.5 and rows["lerobot_act"]["cpu_hours"] == 1.9
    assert rows["lerobot_act"]["evaluator"].startswith("lerobot-eval")
    lp.cmd_pipeline(args)
    assert len(calls) == 5  # every stage done: nothing runs again


def test_status_reads_each_stage(tmp_path, monkeypatch, capsys):
    """`status`: episodes in finished blocks, training CPU-hours, episodes journaled, a LeRobot run's
    budget spent so far (from files alone)."""
    from bench import libero_policy as lp

    monkeypatch.setattr(lp, "RESULTS", tmp_path / "libero.json")
    row = {"mean": 0.5, "ci95": [0.4, 0.6], "cpu_hours": 2.0}
    lp.RESULTS.write_text(json.dumps({"policies": {"libero_object": {"vlastack": row}}}))
    data, run = tmp_path / "libero_object", tmp_path / "runs" / "libero_object"
    for block, n in (("0/000", 10), ("0/001", 10), ("1/000", 0)):
        meta = tmp_path / "libero_object.parts" / "libero_object" / block / "meta"
        meta.mkdir(parents=True)
        if n:  # 1/000 is under way
            (meta / "info.json").write_text(json.dumps({"total_episodes": n}))
            (meta / "vlastack_sim.json").write_text("{}")
    run.mkdir(parents=True)
    (run / "cpu_ledger.json").write_text(json.dumps([{"cpu_s": 5400.0}]))
    (run / "eval").mkdir()
    (run / "eval" / "eval.partial.jsonl").write_text('{"fingerprint": 1}\n{"result": {}}\n{"result": {}}\n')
    lr = tmp_path / "runs" / "libero_object.lerobot_act"
    lr.mkdir()
    (lr / "cpu_ledger.json").write_text(json.dumps([{"cpu_s": 3600.0}]))
    lp.cmd_status(argparse.Namespace(suite="libero_object", data=str(data), run=str(run)))
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["data", "20", "of", "500", "episodes", "written"]
    assert "training under way, 1.50 CPU-h" in out[1] and "2 of 500 episodes evaluated" in out[2]
    assert out[3].startswith("vlastack") and "50.0% [40.0%, 60.0%], 2.00 CPU-h" in out[3]
    assert out[4].startswith("lerobot_act") and "training: 1.00 of 2.00 CPU-h spent" in out[4]
