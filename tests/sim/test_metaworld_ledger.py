"""bench/metaworld.py's CPU ledger counts a training tree's CPU while it runs (a killed segment still counts)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

SCRIPT = """
import subprocess, sys, time
def spin(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
if len(sys.argv) == 1:
    q = subprocess.Popen([sys.executable, __file__, "child"])  # a live grandchild, as data workers are
    spin(0.6)
    time.sleep(30)
else:
    spin(0.6)
    time.sleep(30)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_tree_cpu_counts_live_descendants(tmp_path):
    from bench.metaworld import tree_cpu_s

    script = tmp_path / "busy.py"
    script.write_text(SCRIPT)
    p = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.time() + 20
        while tree_cpu_s(p.pid) < 1.2 and time.time() < deadline:  # both spins done: >= 1.2 CPU-s
            time.sleep(0.2)
        assert tree_cpu_s(p.pid) >= 1.2
    finally:
        subprocess.run(["pkill", "-P", str(p.pid)], check=False)
        p.kill()
        p.wait()


def test_segment_cpu_leaves_out_earlier_children(tmp_path, monkeypatch):
    """The pipeline runs `vla data generate` before training in the same process: its CPU time
    (in getrusage(RUSAGE_CHILDREN) once reaped) must not be billed to the training segment."""
    import argparse
    import json

    from bench import metaworld as bm

    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass"
    subprocess.run([sys.executable, "-c", spin.format(1.5)], check=True)  # the earlier child: 1.5 CPU-s
    real = subprocess.Popen
    monkeypatch.setattr(bm.subprocess, "Popen", lambda cmd: real([sys.executable, "-c", spin.format(0.3)]))
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as done:  # cmd_train exits with the training's status
        bm.cmd_train(argparse.Namespace(suite="mt10", run=str(run), data=str(tmp_path), overrides=[]))
    assert done.value.code == 0
    row = json.loads((run / bm.LEDGER).read_text())[-1]
    assert row["rc"] == 0 and 0.25 <= row["cpu_s"] < 1.0, row


def test_status_reports_each_stage(tmp_path, monkeypatch, capsys):
    """`bench/metaworld.py status` says how far each stage of a half-done pipeline is, from its
    files alone: episodes written (finished blocks only), the saved step with its CPU-hours and time left, episodes journaled
    (a half-written last line left out), and the LeRobot rows."""
    import argparse
    import json

    from bench import metaworld as bm
    from vlastack.config import load_yaml, save_yaml

    monkeypatch.setattr(bm, "RESULTS", tmp_path / "metaworld.json")
    rows = {"vlastack": {"cpu_hours": 7.5}, "lerobot_diffusion": {"mean": 0.1, "cpu_hours": 7.4}}
    bm.RESULTS.write_text(json.dumps({"mt50": rows}))
    data, run = tmp_path / "mt50", tmp_path / "runs" / "mt50"
    for block, n in (("reach-v3/000", 10), ("reach-v3/001", 10), ("push-v3/000", 5), ("push-v3/001", 0)):
        (tmp_path / "mt50.parts" / block / "meta").mkdir(parents=True)
        if n:  # push-v3/001 is under way: no closing record yet
            (tmp_path / "mt50.parts" / block / "meta/info.json").write_text(json.dumps({"total_episodes": n}))
            (tmp_path / "mt50.parts" / block / "meta/vlastack_sim.json").write_text("{}")
    (tmp_path / "mt50.parts/settings.json").write_text(json.dumps({"episodes_per_task": 50}))
    run.mkdir(parents=True)
    save_yaml(load_yaml("metaworld_mt50"), run / "config.yaml")  # 48,000 steps at batch 32
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("step_0012000")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 12000, "train/samples_per_s": 128.0}) + "\n")
    (run / bm.LEDGER).write_text(json.dumps([{"cpu_s": 3600.0}, {"cpu_s": 1800.0}]))
    (run / "eval").mkdir()
    ep = [json.dumps({"result": {"episode": i, "success": i % 2 == 0}}) for i in range(3)]
    (run / "eval" / "eval.partial.jsonl").write_text(
        "\n".join(['{"fingerprint": "x"}', *ep, '{"resu']) + "\n"
    )
    lr = tmp_path / "runs" / "mt50.lerobot_act"
    lr.mkdir()
    (lr / "cpu_ledger.json").write_text(json.dumps([{"cpu_s": 7200.0}]))

    bm.cmd_status(argparse.Namespace(suite="mt50", data=str(data), run=str(run), episodes_per_task=10,
                                     row="vlastack", lerobot="act,diffusion"))  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["data", "25", "of", "2500", "episodes", "written,", "then", "the", "merge"]
    # 36,000 steps x 32 samples at 128 samples/s = 2.5 h
    assert "step 12000 of 48000 saved, 1.50 CPU-h so far, ~2.5 h left" in lines[1]
    assert "3 of 500 episodes journaled, 2 successes so far" in lines[2]
    assert "training: 2.00 of 7.50 CPU-h spent" in lines[3] and lines[3].startswith("lerobot_act ")
    assert "done: mean 10.0%, 7.40 CPU-h" in lines[4]


def test_merge_evals_equals_one_evaluation_over_all_seeds(tmp_path):
    """Seeds 1000-1001 and 1002-1003 evaluated apart, merged == the statistics of one run over 1000-1003."""
    import json

    from bench.metaworld import merge_evals
    from vlastack.sim.evaluate import summarize

    tasks = ("reach-v3", "push-v3")
    won = {("reach-v3", 1000), ("reach-v3", 1003), ("push-v3", 1001)}

    def episodes(seeds):
        eps = [{"task": t, "seed": s, "success": (t, s) in won, "steps": 50 if (t, s) in won else 500}
               for t in tasks for s in seeds]  # fmt: skip
        return [{**e, "episode": i} for i, e in enumerate(eps)]

    def write(name, seeds):
        res = summarize(episodes(seeds), tasks, "p", "metaworld", 10.0)
        res["config"] = {
            "seed": seeds[0],
            "episodes": len(seeds),
            "seed_scheme": "per_task",
            "max_steps": 500,
        }
        (tmp_path / name).write_text(json.dumps(res))
        return tmp_path / name

    a, b = write("a.json", [1000, 1001]), write("b.json", [1002, 1003])
    merged = merge_evals([b, a], tmp_path / "m" / "eval.json")
    whole = summarize(episodes([1000, 1001, 1002, 1003]), tasks, "p", "metaworld", 20.0)
    for key in ("tasks", "overall", "groups", "mean_task_success", "episodes", "wall_s"):
        assert merged[key] == whole[key], key
    assert merged["config"]["seed"] == 1000 and merged["config"]["episodes"] == 4
    assert json.loads((tmp_path / "m" / "eval.json").read_text())["tasks"] == whole["tasks"]
    with pytest.raises(ValueError, match="two of the evaluations"):
        merge_evals([a, a], tmp_path / "x.json")
    c = json.loads(b.read_text())
    c["config"]["max_steps"] = 200
    (tmp_path / "c.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match="other settings"):
        merge_evals([a, tmp_path / "c.json"], tmp_path / "x.json")
