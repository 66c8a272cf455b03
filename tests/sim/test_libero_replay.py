"""bench/libero.py's open-loop replay: one loop (bench/libero_replay.py), run in vlastack's env in
process and, as a script, under LeRobot's python (a stand-in ``lerobot.envs.libero`` plays LeRobot's
LiberoEnv here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

# LeRobot's LiberoEnv as the replay script uses it: the next initial state at each reset, success
# reported as ``is_success``; here success comes at step (resets + 1), so the count of resets shows.
FAKE_LEROBOT_LIBERO = """
import os, pathlib, yaml

def _get_suite(name):
    return "suite:" + name

class LiberoEnv:
    def __init__(self, suite, task, name, obs_type, episode_index, n_envs):
        cfg = yaml.safe_load((pathlib.Path(os.environ["LIBERO_CONFIG_PATH"]) / "config.yaml").read_text())
        assert pathlib.Path(cfg["benchmark_root"]).parent.name == "libero", cfg  # the package, not bench/libero.py
        assert (suite, task, name, obs_type) == ("suite:libero_object", 3, "libero_object", "pixels_agent_pos")
        self.resets, self.steps = 0, 0

    def reset(self, seed):
        assert seed == 1000 + self.resets
        self.resets += 1
        self.steps = 0

    def step(self, action):
        self.steps += 1
        return None, 0.0, False, False, {"is_success": self.steps == self.resets + 1}
"""


class FakeEnv:
    def __init__(self, succeed_at: int | None, key: str = "success") -> None:
        self.succeed_at, self.key, self.actions = succeed_at, key, []

    def step(self, a):
        self.actions.append(a)
        return None, 0.0, False, False, {self.key: len(self.actions) == self.succeed_at}


def test_replay_stops_at_success_and_counts_steps():
    from bench.libero_replay import replay

    actions = np.arange(14, dtype=float).reshape(7, 2)
    env = FakeEnv(3)
    assert replay(env, actions) == {"success": True, "steps": 3}
    assert len(env.actions) == 3
    assert replay(FakeEnv(None), actions) == {"success": False, "steps": 7}
    assert replay(FakeEnv(2, "is_success"), actions, "is_success") == {"success": True, "steps": 2}


def test_bench_libero_replay_runs_the_shared_loop(monkeypatch):
    """bench/libero.py's in-process replay: a fresh vlastack env, reset to the seed, the same loop."""
    import vlastack.sim.libero as vl
    from bench import libero as bl

    made = []

    class Env(FakeEnv):
        def __init__(self, suite, task):
            super().__init__(2)
            made.append(self)
            self.args, self.seed, self.closed = (suite, task), None, False

        def reset(self, seed):
            self.seed = seed

        def close(self):
            self.closed = True

    monkeypatch.setattr(vl, "LiberoEnv", Env)
    assert bl.replay("libero_object", 4, 1002, np.zeros((5, 7))) == {"success": True, "steps": 2}
    (env,) = made
    assert env.args == ("libero_object", 4) and env.seed == 1002 and env.closed


@pytest.mark.skipif(find_spec("libero") is None or find_spec("mujoco") is None, reason="LIBERO not installed")
def test_replay_script_in_lerobots_env(tmp_path):
    """bench/libero_replay.py run by path (as bench/libero.py runs it under each --lerobot-python):
    LIBERO's config points at the libero package (bench/libero.py does not shadow it), initial state
    ``seed - 1000`` is reached by resets, and one JSON line comes back with MuJoCo's version."""
    fake = tmp_path / "site" / "lerobot" / "envs"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "libero.py").write_text(FAKE_LEROBOT_LIBERO)
    np.save(tmp_path / "actions.npy", np.zeros((6, 7)))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "MUJOCO_GL": "egl"}
    cmd = [sys.executable, str(ROOT / "bench" / "libero_replay.py"), "libero_object", "3", "1002",
           str(tmp_path / "actions.npy")]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    import mujoco

    rep = json.loads(r.stdout.splitlines()[-1])
    assert rep == {"success": True, "steps": 4, "mujoco": mujoco.__version__}
