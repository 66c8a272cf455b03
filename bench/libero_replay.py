"""Open-loop replay of a LIBERO action sequence, the one loop bench/libero.py runs in vlastack's env
(in its own process) and in LeRobot's ``LiberoEnv`` (here, as a script under each LeRobot python):

    LEROBOT_PYTHON bench/libero_replay.py SUITE TASK SEED ACTIONS.npy   # prints one JSON line

As a script it runs in LeRobot's venv, which has neither vlastack nor bench/'s other modules: it
imports numpy, yaml and LeRobot (and libero, mujoco) only, and those inside the functions that need
them, so that importing ``replay`` from vlastack's side needs numpy alone.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


def replay(env, actions, success_key: str = "success") -> dict:
    """Step ``env`` (already reset) through ``actions`` until ``info[success_key]``: vlastack's
    LiberoEnv says ``success``, LeRobot's ``is_success``."""
    ok, steps = False, 0
    for a in actions:
        steps += 1
        if env.step(a)[4][success_key]:
            ok = True
            break
    return {"success": ok, "steps": steps}


def lerobot_replay(suite: str, task: int, seed: int, actions) -> dict:
    """The replay in LeRobot's own ``LiberoEnv`` (lerobot.envs.libero), initial state ``seed - 1000``
    as lerobot-eval reaches it: that env moves to the next initial state at each reset."""
    from importlib.util import find_spec

    import yaml

    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    cfg = Path(tempfile.mkdtemp())
    os.environ["LIBERO_CONFIG_PATH"] = str(cfg)
    root = Path(find_spec("libero").submodule_search_locations[0]) / "libero"
    (cfg / "config.yaml").write_text(yaml.safe_dump({
        "benchmark_root": str(root), "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"), "datasets": "/tmp", "assets": str(root / "assets"),
    }))  # fmt: skip
    from lerobot.envs.libero import LiberoEnv, _get_suite

    env = LiberoEnv(_get_suite(suite), task, suite, obs_type="pixels_agent_pos", episode_index=0, n_envs=1)
    for j in range(seed - 1000 + 1):
        env.reset(seed=1000 + j)
    out = replay(env, actions, "is_success")
    import mujoco

    return {**out, "mujoco": mujoco.__version__}


def main(argv: list[str]) -> None:
    import numpy as np

    suite, task, seed, path = argv
    print(json.dumps(lerobot_replay(suite, int(task), int(seed), np.load(path))))


if __name__ == "__main__":
    # Run by path, bench/ is first on sys.path, where bench/libero.py would shadow the libero package.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    main(sys.argv[1:])
