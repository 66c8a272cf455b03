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
