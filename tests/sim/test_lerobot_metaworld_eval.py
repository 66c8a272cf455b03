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
    f.write(args["env.task"] + "\\n")
if os.path.exists({fail!r}) and len(log.read_text().splitlines()) == 2:
    sys.exit(1)  # the second chunk dies (a machine taken back)
n = int(args["eval.n_episodes"])
per_task = [{{"task_group": t, "task_id": 0, "metrics": {{"successes": [j % 2 == 0 for j in range(n)],
             "sum_rewards": [0.0] * n, "max_rewards": [0.0] * n, "video_paths": []}}}}
            for t in args["env.task"].split(",")]
out = pathlib.Path(args["output_dir"])
out.mkdir(parents=True, exist_ok=True)
(out / "eval_info.json").write_text(json.dumps({{"per_task": per_task, "overall": {{}}}}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a shebang stand-in for LeRobot's python")
def test_chunked_lerobot_eval_resumes_finished_chunks(tmp_path, monkeypatch):
    from bench import lerobot_metaworld as lm

    monkeypatch.setenv("MUJOCO_GL", "egl")  # no GL probe through the stand-in
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
