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
