"""Simulation worker pools die with their parent (vlastack/sim/pool.py): a `vla eval` or `vla data
generate` stopped by SIGTERM or kill -9 leaves no worker behind inside an episode."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

PARENT = """
import sys, time
from vlastack.sim.pool import worker_pool

def job(path):
    import os, time
    open(path, "w").write(str(os.getpid()))
    time.sleep(120)  # an episode nobody will read

if __name__ == "__main__":
    ex = worker_pool(2)
    futs = [ex.submit(job, sys.argv[1] + str(i)) for i in range(2)]
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_workers_die_with_their_parent(tmp_path, sig):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path / "pid")])
    try:
        files = [tmp_path / f"pid{i}" for i in range(2)]
        deadline = time.monotonic() + 120
        while not all(f.is_file() and f.read_text() for f in files) and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [int(f.read_text()) for f in files]
        assert all(_alive(p) for p in pids)
        parent.send_signal(sig)
        parent.wait(30)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), f"workers outlived their parent ({signal.Signals(sig).name})"
    finally:
        parent.kill()
        for f in tmp_path.glob("pid*"):
            if f.read_text():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(f.read_text()), signal.SIGKILL)
