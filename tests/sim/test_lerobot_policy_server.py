"""`vla eval --policy ws://...` against stateful servers (scripts/lerobot_policy_server.py): the
protocol's reset on every episode, the server's identity in eval.json, and, where LeRobot's venv is
installed (scripts/setup_lerobot_venv.sh), a real LeRobot ACT policy scored by `vla eval`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from vlastack.infer.wire import packb, unpackb
from vlastack.sim.evaluate import evaluate

ROOT = Path(__file__).resolve().parents[2]
LEROBOT_PY = Path(os.environ.get("VLASTACK_LEROBOT_PYTHON", "/work/lrvenv/bin/python"))


class StatefulServer:
    """A stand-in with a LeRobot policy's shape: per-connection state, `needs_reset`, one-step chunks."""

    def __init__(self) -> None:
        from websockets.sync.server import serve

        self.resets, self.steps_since_reset = 0, []
        self.meta = {"camera_names": ["scene"], "replan_steps": 1, "needs_reset": True, "policy": "stand-in"}
        self.server = serve(self.handler, "127.0.0.1", 0)
        self.port = self.server.socket.getsockname()[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handler(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        steps = 0
        try:
            ws.send(packb(self.meta))
            for msg in ws:
                obs = unpackb(msg, 2**24)
                if obs.get("reset"):
                    self.resets += 1
                    self.steps_since_reset.append(steps)
                    steps = 0
                    ws.send(packb({"reset": True}))
                    continue
                steps += 1
                ws.send(packb({"actions": np.zeros((1, 4), np.float32)}))
        except ConnectionClosed:
            pass


def test_stateful_server_is_reset_every_episode_and_named_in_eval_json(tmp_path):
    srv = StatefulServer()
    try:
        res = evaluate(
            f"ws://127.0.0.1:{srv.port}", suite="builtin", tasks=("reach",), episodes=3, seed=0,
            num_workers=0, image_size=64, max_steps=5, out_dir=tmp_path / "eval", videos=0,
        )  # fmt: skip
    finally:
        srv.server.shutdown()
    assert res["overall"]["n"] == 3 and srv.resets == 3
    assert srv.steps_since_reset[1:] == [5, 5]  # each episode's steps come after its own reset
    saved = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert saved["server"]["policy"] == "stand-in" and saved["server"]["needs_reset"] is True


def test_a_served_policy_is_named_by_its_metadata_not_its_port():
    """A served evaluation resumes after its server restarts on a new port (bench/lerobot_served.py
    starts it with --port 0): the journal's policy identity is the host and the server's metadata."""
    from vlastack.sim.evaluate import policy_identity, served_metadata

    a, b, c = StatefulServer(), StatefulServer(), StatefulServer()
    c.meta = {**c.meta, "policy": "another checkpoint"}
    try:
        urls = [f"ws://127.0.0.1:{s.port}" for s in (a, b, c)]
        ids = [policy_identity(u, served_metadata(u)) for u in urls]
    finally:
        for s in (a, b, c):
            s.server.shutdown()
    assert a.port != b.port and ids[0] == ids[1] and ids[0] != ids[2]
    assert ids[0] == {"name": "ws://127.0.0.1", "server": a.meta}


@pytest.mark.slow
@pytest.mark.skipif(
    not LEROBOT_PY.exists(), reason="LeRobot's venv (scripts/setup_lerobot_venv.sh) is not installed"
)
def test_a_lerobot_act_policy_scored_by_vla_eval(tmp_path):
    """A randomly initialised LeRobot ACT policy (made by LeRobot's own classes, saved with its
    processors) served from LeRobot's venv, with ``--resize`` and ``--set``, and scored by `vla
    eval` on Meta-World."""
    pytest.importorskip("metaworld")
    folder = tmp_path / "act"
    subprocess.run(
        [str(LEROBOT_PY), str(ROOT / "scripts" / "make_lerobot_act_policy.py"), str(folder)], check=True
    )
    log = (tmp_path / "server.log").open("w")  # closed with the process below
    proc = subprocess.Popen(
        [str(LEROBOT_PY), str(ROOT / "scripts" / "lerobot_policy_server.py"), "--policy", str(folder),
         "--env", "metaworld", "--port", "0", "--threads", "1", "--resize", "48",
         "--set", "n_action_steps=3"],
        stderr=log, stdout=log,
    )  # fmt: skip
    try:
        port = None
        deadline = time.time() + 180
        while port is None and time.time() < deadline and proc.poll() is None:
            m = re.search(r"serving ws://127.0.0.1:(\d+)", (tmp_path / "server.log").read_text())
            port = int(m.group(1)) if m else time.sleep(0.5)
        assert port, (tmp_path / "server.log").read_text()[-2000:]
        res = evaluate(
            f"ws://127.0.0.1:{port}", suite="metaworld", tasks=("reach-v3",), episodes=2, seed=1000,
            seed_scheme="per_task", num_workers=0, image_size=64, max_steps=12, out_dir=tmp_path / "eval",
            videos=0,
        )  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    assert res["overall"]["n"] == 2 and all(e["steps"] == 12 for e in res["episodes"])
    assert res["server"]["policy"].startswith("lerobot act") and res["server"]["lerobot_version"] == "0.6.1"
    # the evaluator's 64 px frames went through fit_image to 48 px; the chunk setting was overridden
    assert res["server"]["resize"] == 48 and res["server"]["overrides"] == {"n_action_steps": 3}


def _server_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "lerobot_policy_server", ROOT / "scripts" / "lerobot_policy_server.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _onehot_dataset(root: Path, tasks: list[str]) -> Path:
    """The one file of a `vla data task-onehot` copy the server reads: info.json's names."""
    (root / "meta").mkdir(parents=True)
    names = [f"task={t}" for t in tasks]
    info = {
        "features": {
            "observation.environment_state": {"dtype": "float32", "shape": [len(tasks)], "names": names}
        }
    }
    (root / "meta" / "info.json").write_text(json.dumps(info))
    return root


def test_task_onehot_names_are_read_in_order_and_a_state_dataset_is_refused(tmp_path):
    server = _server_module()
    tasks = ["Push the puck to a goal", "Reach a goal position"]
    assert server.load_task_names(str(_onehot_dataset(tmp_path / "a", tasks))) == tasks
    sim = tmp_path / "b" / "meta"
    sim.mkdir(parents=True)
    sim.joinpath("info.json").write_text(
        json.dumps({"features": {"observation.environment_state": {"names": None}}})
    )
    with pytest.raises(ValueError, match="not a task one-hot"):
        server.load_task_names(str(tmp_path / "b"))


@pytest.mark.slow
@pytest.mark.skipif(
    not LEROBOT_PY.exists(), reason="LeRobot's venv is not installed (scripts/setup_lerobot_venv.sh)"
)
def test_a_task_onehot_act_policy_gets_the_prompts_task(tmp_path):
    """An ACT policy with a 2-d environment-state input, served with ``--task-onehot``: the prompt's
    task reaches the policy as its one-hot (the two tasks' actions differ on the same frames), a
    prompt outside the tasks is refused with an error frame, and the metadata names the tasks."""
    folder = tmp_path / "act"
    subprocess.run(
        [str(LEROBOT_PY), str(ROOT / "scripts" / "make_lerobot_act_policy.py"), str(folder), "32", "--env-state=2"],
        check=True,
    )  # fmt: skip
    tasks = ["Reach a goal position", "Push the puck to a goal"]
    data = _onehot_dataset(tmp_path / "data", tasks)
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [str(LEROBOT_PY), str(ROOT / "scripts" / "lerobot_policy_server.py"), "--policy", str(folder),
         "--port", "0", "--threads", "1", "--task-onehot", str(data)],
        stderr=log, stdout=log,
    )  # fmt: skip
    try:
        port = None
        deadline = time.time() + 180
        while port is None and time.time() < deadline and proc.poll() is None:
            m = re.search(r"serving ws://127.0.0.1:(\d+)", (tmp_path / "server.log").read_text())
            port = int(m.group(1)) if m else time.sleep(0.5)
        assert port, (tmp_path / "server.log").read_text()[-2000:]
        from websockets.sync.client import connect

        img = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
        with connect(f"ws://127.0.0.1:{port}", max_size=None) as ws:
            meta = unpackb(ws.recv(), 1 << 24)
            assert meta["task_onehot"] == {"dataset": str(data), "tasks": tasks}
            out = {}
            for prompt in tasks:
                ws.send(packb({"reset": True}))
                ws.recv()
                obs = {
                    "observation/image": img,
                    "observation/state": np.zeros(4, np.float32),
                    "prompt": prompt,
                }
                ws.send(packb(obs))
                out[prompt] = unpackb(ws.recv(), 1 << 24)["actions"]
            assert not np.allclose(out[tasks[0]], out[tasks[1]])
            ws.send(packb(obs | {"prompt": "Open a door"}))
            reply = ws.recv()
            assert isinstance(reply, str) and "not one of the policy's 2 tasks" in reply
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_the_served_evaluation_stops_its_children_on_sigterm():
    """bench/lerobot_served.py: SIGTERM becomes SystemExit (so its ``finally`` runs), and
    ``stop_children`` ends a child that exits on SIGTERM and kills one that ignores it, rather
    than leaving the LeRobot server and ``vla eval`` running after the script is gone."""
    import signal
    import sys

    from bench.lerobot_served import _stop, stop_children

    with pytest.raises(SystemExit, match="SIGTERM"):
        _stop(signal.SIGTERM, None)
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert stubborn.stdout.readline().strip() == "ready"  # its handler is in place
    t0 = time.monotonic()
    stop_children([polite, stubborn], timeout=2.0)
    assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL
    assert time.monotonic() - t0 < 30
    stubborn.stdout.close()
