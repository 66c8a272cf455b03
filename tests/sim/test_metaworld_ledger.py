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
