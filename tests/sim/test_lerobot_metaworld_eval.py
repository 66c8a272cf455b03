"""bench/lerobot_metaworld.py eval: lerobot-eval in chunks of tasks, kept as they finish, so an
evaluation cut off midway continues (a stand-in for LeRobot's venv plays lerobot-eval)."""

from __future__ import annotations

import json
import sys

import pytest

FAKE = """#!{python}
import json, os, pathlib, subprocess, sys
if sys.argv[1] == "-c":  # version queries: answered by the real interpreter
    sys.exit(subprocess.call([{python!r}, *sys.argv[1:]]))
args = dict(a[2:].split("=", 1) for a in sys.argv[3:] if a.startswith("--"))
log = pathlib.Path({log!r})
with log.open("a") as f:
    f.write(args["env.task"] + os.environ.get("LP_NUM_THREADS", "") + "\\n")
if os.path.exists({fail!r}) and len(log.read_text().splitlines()) == 2:
    sys.exit(1)  # the second chunk dies (a machine taken back)
n = int(args["eval.n_episodes"])
if args["env.type"] == "libero":  # one suite, task ids: groups are the suite, task_id LIBERO's id
    with log.open("a") as f:
        f.write(" ".join(args[k] for k in ("env.task_ids", "env.observation_height")) + "\\n")
    ids = [int(i) for i in args["env.task_ids"].strip("[]").split(",")]
    groups = [(args["env.task"], i) for i in ids]
else:
    groups = [(t, 0) for t in args["env.task"].split(",")]
per_task = [{{"task_group": t, "task_id": i, "metrics": {{"successes": [j % 2 == i % 2 for j in range(n)],
             "sum_rewards": [0.0] * n, "max_rewards": [0.0] * n, "video_paths": []}}}}
            for t, i in groups]
out = pathlib.Path(args["output_dir"])
out.mkdir(parents=True, exist_ok=True)
(out / "eval_info.json").write_text(json.dumps({{"per_task": per_task, "overall": {{}}}}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a shebang stand-in for LeRobot's python")
def test_chunked_lerobot_eval_resumes_finished_chunks(tmp_path, monkeypatch):
    from bench import lerobot_metaworld as lm

    monkeypatch.setenv("MUJOCO_GL", "egl")  # no GL probe through the stand-in
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)  # set by any earlier rendering in this process
    log, fail = tmp_path / "calls.txt", tmp_path / "fail"
    fake = tmp_path / "python"
    fake.write_text(FAKE.format(python=sys.executable, log=str(log), fail=str(fail)))
    fake.chmod(0o755)
    run = tmp_path / "run"
    (run / lm.OUT / lm.LAST / "pretrained_model").mkdir(parents=True)
    (run / lm.OUT / lm.LAST / "pretrained_model" / "config.json").write_text("{}")
    argv = ["--lerobot-python", str(fake), "eval", "--run", str(run), "--tasks",
            "reach-v3,push-v3,pick-place-v3", "--episodes-per-task", "2", "--chunk-tasks", "2"]  # fmt: skip
    fail.touch()
    with pytest.raises(SystemExit, match="lerobot-eval failed"):
        lm.main(argv)
    assert not (run / "eval" / "eval.json").exists()
    fail.unlink()
    lm.main(argv)  # again: the first chunk is kept, only the second runs
    assert log.read_text().splitlines() == ["reach-v3,push-v3", "pick-place-v3", "pick-place-v3"]
    ev = json.loads((run / "eval" / "eval.json").read_text())
    assert list(ev["tasks"]) == ["reach-v3", "push-v3", "pick-place-v3"]
    assert [(e["task"], e["seed"], e["success"]) for e in ev["episodes"]][:2] == [
        ("reach-v3", 1000, True),
        ("reach-v3", 1001, False),
    ]
    assert ev["overall"]["n"] == 6 and ev["mean_task_success"] == 0.5
    lm.main([*argv[:-1], "3"])  # other chunks: another evaluation, the old one moved aside
    assert log.read_text().splitlines()[-1] == "reach-v3,push-v3,pick-place-v3"
    assert len(list((run / "eval").glob("lerobot.old-*"))) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a shebang stand-in for LeRobot's python")
def test_lerobot_eval_on_libero_runs_task_ids_at_the_data_size(tmp_path, monkeypatch):
    """``eval --env libero``: lerobot-eval's LiberoEnv gets the suite, the chunk's task ids and the
    image size; its per-task entries (group = suite, task_id = LIBERO's id) become SUITE/ID."""
    from bench import lerobot_metaworld as lm

    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)
    log, fake = tmp_path / "calls.txt", tmp_path / "python"
    fake.write_text(FAKE.format(python=sys.executable, log=str(log), fail=str(tmp_path / "never")))
    fake.chmod(0o755)
    run = tmp_path / "run"
    (run / lm.OUT / lm.LAST / "pretrained_model").mkdir(parents=True)
    (run / lm.OUT / lm.LAST / "pretrained_model" / "config.json").write_text("{}")
    lm.main(["--lerobot-python", str(fake), "eval", "--env", "libero", "--image-size", "128", "--run", str(run),
             "--tasks", "libero_object/1,libero_object/4,libero_object/7", "--episodes-per-task", "2",
             "--chunk-tasks", "2"])  # fmt: skip
    assert log.read_text().splitlines() == ["libero_object", "[1,4] 128", "libero_object", "[7] 128"]
    ev = json.loads((run / "eval" / "eval.json").read_text())
    assert ev["suite"] == "libero_object" and list(ev["tasks"]) == [f"libero_object/{i}" for i in (1, 4, 7)]
    assert [(e["task"], e["seed"], e["success"]) for e in ev["episodes"]][:2] == [
        ("libero_object/1", 1000, False),
        ("libero_object/1", 1001, True),
    ]
    assert ev["config"]["max_steps"] == 280 and ev["config"]["image_size"] == 128
    with pytest.raises(SystemExit, match="one LIBERO suite"):
        lm.main(["--lerobot-python", str(fake), "eval", "--env", "libero", "--run", str(run),
                 "--tasks", "libero_object/1,libero_goal/2"])  # fmt: skip


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a shebang stand-in for LeRobot's python")
def test_chunks_side_by_side(tmp_path, monkeypatch):
    """--parallel 2: chunks run two at a time, each rendering on its own core (LP_NUM_THREADS=0);
    the tasks keep their order in eval.json."""
    from bench import lerobot_metaworld as lm

    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)
    log = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(FAKE.format(python=sys.executable, log=str(log), fail=str(tmp_path / "never")))
    fake.chmod(0o755)
    run = tmp_path / "run"
    (run / lm.OUT / lm.LAST / "pretrained_model").mkdir(parents=True)
    (run / lm.OUT / lm.LAST / "pretrained_model" / "config.json").write_text("{}")
    tasks = "reach-v3,push-v3,pick-place-v3"
    lm.main(["--lerobot-python", str(fake), "eval", "--run", str(run), "--tasks", tasks,
             "--episodes-per-task", "1", "--chunk-tasks", "1", "--parallel", "2"])  # fmt: skip
    assert sorted(log.read_text().split()) == sorted(f"{t}0" for t in tasks.split(","))
    ev = json.loads((run / "eval" / "eval.json").read_text())
    assert list(ev["tasks"]) == tasks.split(",") and ev["config"]["parallel"] == 2


def test_train_finished(tmp_path):
    from bench import lerobot_metaworld as lm

    run = tmp_path / "run"
    assert not lm.train_finished(run)
    lm.write_json(run / lm.PLAN, {"steps": 10, "cpu_hours_budget": 1.0})
    lm.write_json(run / lm.LEDGER, [{"cpu_s": 100.0}])
    assert not lm.train_finished(run)  # no checkpoint yet
    lm.write_json(
        run / lm.OUT / "checkpoints" / "000006" / "training_state" / "training_step.json", {"step": 6}
    )
    (run / lm.OUT / lm.LAST).symlink_to("000006")
    assert not lm.train_finished(run)  # step 6 of 10, budget left
    lm.write_json(run / lm.LEDGER, [{"cpu_s": 100.0, "stopped_at_budget": True}])
    assert lm.train_finished(run)  # budget spent: the last checkpoint is the policy


def test_pipeline_lerobot_stage_budget_and_record(tmp_path, monkeypatch):
    """`pipeline --lerobot act`: LeRobot's run gets vlastack's measured CPU-hours, is scored in
    kept chunks, and its row lands beside vlastack's with the generator's seeds; then it is done."""
    from bench import lerobot_metaworld as lm
    from bench import lerobot_metaworld_eval as lme
    from bench import metaworld as bm

    monkeypatch.setattr(bm, "RESULTS", tmp_path / "metaworld.json")
    bm.save({"mt50": {"vlastack": {"cpu_hours": 2.5}}})
    data = tmp_path / "mt50"
    (data / "meta").mkdir(parents=True)
    info = [{"task": t, "seed": s} for t in ("reach-v3", "push-v3") for s in (0, 1, 3)]
    (data / "meta" / "vlastack_sim.json").write_text(json.dumps({"episode_info": info}))
    lr_run = tmp_path / "mt50.lerobot_act"
    calls = []

    def call(cmd):
        calls.append(cmd)
        if cmd[2] == "train":
            lm.write_json(lr_run / lm.PLAN, {"steps": 4, "cpu_hours_budget": 2.5})
            lm.write_json(lr_run / lm.LEDGER, [{"cpu_s": 3600.0}])
            step = lr_run / lm.OUT / lm.LAST / "training_state" / "training_step.json"
            lm.write_json(step, {"step": 4})
            lm.write_json(lr_run / lm.RUN_INFO, {"cpu_hours": 1.0, "versions": {"lerobot": "0.6.1"},
                                                 "commands": ["lerobot-train ..."], "plan": {"steps": 4},
                                                 "step_reached": 4, "non_default": {}, "segments": []})  # fmt: skip
        else:
            m = {"successes": [True, False], "sum_rewards": [0, 0], "max_rewards": [0, 0], "video_paths": []}
            per_task = [{"task_group": t, "task_id": 0, "metrics": m} for t in ("reach-v3", "push-v3")]
            ev = lme.convert(
                {"per_task": per_task}, ["reach-v3", "push-v3"], 1000, 2, {"command": "lerobot-eval"}
            )
            lm.write_json(lr_run / "eval" / "eval.json", ev)
        return 0

    monkeypatch.setattr(bm.subprocess, "call", call)
    bm.lerobot_stage("mt50", "act", data, tmp_path / "mt50", "vlastack", 2)
    train, ev = calls
    assert train[train.index("--cpu-hours") + 1] == "2.5000" and "local/mt50" in train
    assert ev[ev.index("--chunk-tasks") + 1] == "5" and ev[ev.index("--tasks") + 1] == "MT50"
    assert ev[ev.index("--parallel") + 1] == "2"
    row = bm.load()["mt50"]["lerobot_act"]
    assert row["cpu_hours"] == 1.0 and row["mean"] == 0.5 and row["eval_seeds"] == [1000, 1001]
    assert row["train_seeds"] == {"reach-v3": [0, 3, 3], "push-v3": [0, 3, 3]}
    assert row["train_episodes_per_task"] == 3  # derived from the seeds
    assert row["eval"]["command"] == "lerobot-eval"
    bm.lerobot_stage("mt50", "act", data, tmp_path / "mt50", "vlastack", 2)
    assert len(calls) == 2  # recorded: nothing left to run


def test_finish_survives_a_segment_whose_supervisor_died(tmp_path, monkeypatch):
    """A ledger row written before its supervisor died lacks ``rc``/``stopped_at_budget``:
    run.json is still written, with those fields None."""
    import argparse

    from bench import lerobot_metaworld as lm

    monkeypatch.setattr(lm, "machine", lambda: {"cpu": "test"})
    run = tmp_path / "run"
    plan = {"policy": "act", "data": str(tmp_path / "mt50"), "steps": 4, "save_freq": 1,
            "cpu_hours_budget": 1.0, "resize": None, "extra": []}  # fmt: skip
    ledger = [
        {"argv": ["lerobot-train", "--steps=4"], "started": "t0", "wall_s": 5.0, "cpu_s": 1800.0, "rc": 0,
         "stopped_at_budget": False},
        {"argv": ["lerobot-train", "--resume=true"], "started": "t1", "wall_s": 3.0, "cpu_s": 1800.0},
    ]  # fmt: skip
    lm.finish(run, argparse.Namespace(), {"lerobot": "0.6.1"}, plan, ledger)
    info = json.loads((run / lm.RUN_INFO).read_text())
    assert info["cpu_hours"] == 1.0 and info["step_reached"] is None
    assert info["segments"][1] == {"started": "t1", "wall_s": 3.0, "cpu_s": 1800.0, "rc": None,
                                   "stopped_at_budget": None, "supervisor_died": None}  # fmt: skip
    assert len(info["commands"]) == 2


def test_pipeline_reruns_train_for_a_finished_run_without_run_json(tmp_path, monkeypatch):
    """Training finished (budget spent) but run.json was never written (the supervisor died after
    the last segment): the pipeline calls ``train`` again, which only writes run.json."""
    from bench import lerobot_metaworld as lm
    from bench import metaworld as bm

    monkeypatch.setattr(bm, "RESULTS", tmp_path / "metaworld.json")
    bm.save({"mt10": {"vlastack": {"cpu_hours": 1.0}}})
    lr_run = tmp_path / "mt10.lerobot_act"
    lm.write_json(lr_run / lm.PLAN, {"steps": 10, "cpu_hours_budget": 1.0})
    lm.write_json(lr_run / lm.LEDGER, [{"cpu_s": 3600.0, "stopped_at_budget": True}])
    lm.write_json(lr_run / lm.OUT / lm.LAST / "training_state" / "training_step.json", {"step": 6})
    assert lm.train_finished(lr_run) and not (lr_run / lm.RUN_INFO).exists()
    calls = []

    def call(cmd):
        calls.append(cmd[2])
        if cmd[2] == "train":
            lm.write_json(lr_run / lm.RUN_INFO, {"cpu_hours": 1.0})
        return 0

    monkeypatch.setattr(bm.subprocess, "call", call)
    monkeypatch.setattr(bm, "record", lambda *a, **k: sys.exit("recorded"))
    with pytest.raises(SystemExit, match="recorded"):
        bm.lerobot_stage("mt10", "act", tmp_path / "mt10", tmp_path / "mt10", "vlastack", 1)
    assert calls == ["train", "eval"]


def test_input_features_take_a_task_onehot_never_a_simulator_state(tmp_path):
    """LeRobot's policies get observation.environment_state only where it is the task as a one-hot
    (a `vla data task-onehot` copy); a simulator's state stays out of their inputs."""
    from bench.lerobot_common import task_onehot
    from bench.lerobot_metaworld import data_features

    def dataset(name: str, names: list[str] | None) -> object:
        (tmp_path / name / "meta").mkdir(parents=True)
        feats = {
            "observation.image": {"dtype": "video", "shape": [128, 128, 3]},
            "observation.state": {"dtype": "float32", "shape": [4]},
            "observation.environment_state": {
                "dtype": "float32",
                "shape": [len(names or [0] * 39)],
                "names": names,
            },
        }
        (tmp_path / name / "meta" / "info.json").write_text(json.dumps({"features": feats}))
        return tmp_path / name

    sim, onehot = dataset("sim", None), dataset("onehot", ["task=a", "task=b"])
    assert not task_onehot(sim) and task_onehot(onehot) and not task_onehot(None)
    assert "observation.environment_state" not in data_features(sim)
    assert data_features(onehot)["observation.environment_state"] == {"type": "ENV", "shape": [2]}
    assert data_features(onehot)["observation.image"] == {"type": "VISUAL", "shape": [3, 128, 128]}
