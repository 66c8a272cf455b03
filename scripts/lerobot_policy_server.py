"""Serve any LeRobot policy folder over vlastack's openpi-compatible websocket, from LeRobot's venv.

    /work/lrvenv/bin/python scripts/lerobot_policy_server.py --policy RUN/checkpoints/last/pretrained_model \
        --env metaworld --port 8765
    .venv/bin/vla eval --policy ws://127.0.0.1:8765 --config metaworld_mt10 --out runs/x/eval

So every row of a comparison is scored by the same ``vla eval`` (same renderer, seeds and trial
count), with the policy run exactly as ``lerobot-eval`` runs it. Per observation, the steps of
lerobot-eval 0.6.1's ``rollout`` for one environment:

1. the observation as LeRobot's env returns it (``pixels`` HWC uint8, or ``{camera: pixels}``;
   ``agent_pos``) through LeRobot's own ``preprocess_observation``, plus ``task`` (the prompt);
2. the env's processors (``EnvConfig.get_env_processors``, identity for Meta-World), the policy's
   preprocessor (``make_pre_post_processors`` from the folder: normalization, device);
3. ``policy.select_action`` under ``torch.inference_mode`` (and autocast where the policy's
   ``use_amp`` says), the postprocessor -> one action, sent as a one-step chunk ``[1, A]``.

LeRobot policies keep state across steps (ACT's and Diffusion Policy's action queues, Diffusion's
observation history), so each connection gets its own copy, and the metadata says
``needs_reset: true``: ``vla eval`` then sends ``{"reset": true}`` at every episode start, which
calls ``policy.reset()`` as lerobot-eval's rollout does. ``replan_steps`` is 1: the evaluator asks
every step and the policy's own queue decides when it recomputes a chunk.

``--resize R`` resizes every image to RxR with vlastack's ``fit_image`` before step 1, for a policy
trained on a ``vla data resize`` copy (LeRobot's ACT has no resize of its own); ``--set FIELD=JSON``
overrides policy config fields at load, for inference-time settings such as ACT's
``n_action_steps`` or ``temporal_ensemble_coeff``. ``--task-onehot DATASET``, for a policy trained
on a ``vla data task-onehot`` copy, sends the prompt's task as the one-hot
``observation.environment_state`` (by the copy's ``info.json`` names, ``task=<text>``); a prompt
that is not one of its tasks is refused. All three are in the metadata (``resize``, ``overrides``,
``task_onehot``), so ``eval.json`` records them.

Wire format: openpi's msgpack-numpy, decoded by vlastack's hardened reader (``vlastack/infer/wire.py``,
loaded by path: it needs only msgpack and numpy) — no pickle. Needs ``websockets`` and ``msgpack``
in LeRobot's venv (``scripts/setup_lerobot_venv.sh`` installs them). The metadata also carries the
policy type, LeRobot's version and the folder, so ``eval.json`` records what was scored.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("lerobot_policy_server")


def load_wire():
    """vlastack's msgpack-numpy reader/writer, by file path (LeRobot's venv has no vlastack)."""
    return _load("vlastack_wire", ROOT / "vlastack" / "infer" / "wire.py")


def load_transforms():
    """vlastack's image transforms (plain torch), by file path: ``--resize`` uses ``fit_image``, the
    function that made the resized dataset (``vla data resize``) and that vlastack's policy applies."""
    return _load("vlastack_transforms", ROOT / "vlastack" / "data" / "transforms.py")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_task_names(dataset: str) -> list[str]:
    """A ``vla data task-onehot`` copy's task texts, in one-hot order (its info.json names)."""
    info = json.loads((Path(dataset) / "meta" / "info.json").read_text())
    names = (info["features"].get("observation.environment_state") or {}).get("names") or []
    if not names or not all(isinstance(n, str) and n.startswith("task=") for n in names):
        raise ValueError(
            f"{dataset}: observation.environment_state is not a task one-hot (vla data task-onehot)"
        )
    return [n[len("task=") :] for n in names]


class LeRobotSide:
    """One LeRobot policy folder, loaded as lerobot-eval loads it; ``session()`` gives a connection
    its own copy (the policy's queues are per episode)."""

    def __init__(
        self,
        folder: str,
        env: str | None,
        device: str | None,
        resize: int | None = None,
        overrides: dict[str, Any] | None = None,
        task_onehot: str | None = None,
    ) -> None:
        import torch
        from lerobot.configs.policies import PreTrainedConfig
        from lerobot.policies import make_policy, make_pre_post_processors

        cfg = PreTrainedConfig.from_pretrained(folder)
        cfg.pretrained_path = Path(folder)
        if device:
            cfg.device = device
        for k, v in (overrides or {}).items():  # inference-time settings, e.g. ACT's n_action_steps
            if not hasattr(cfg, k):
                raise ValueError(f"--set {k}: {cfg.type}'s config has no field {k!r}")
            setattr(cfg, k, v)
        self.resize = resize
        self.tasks = load_task_names(task_onehot) if task_onehot else None
        self.fit_image = load_transforms().fit_image if resize else None
        self.env_cfg = None
        if env:
            from lerobot.envs.configs import EnvConfig

            self.env_cfg = EnvConfig.get_choice_class(env)()
            policy = make_policy(cfg=cfg, env_cfg=self.env_cfg)  # lerobot-eval's path
        else:
            from lerobot.policies.factory import get_policy_class

            policy = get_policy_class(cfg.type).from_pretrained(folder, config=cfg)
        policy.eval()
        self.policy, self.cfg = policy, cfg
        on_device = {"device_processor": {"device": str(policy.config.device)}}
        self.pre, self.post = make_pre_post_processors(
            policy_cfg=cfg, pretrained_path=folder, preprocessor_overrides=on_device
        )
        if self.env_cfg is not None:
            from lerobot.envs.factory import make_env_pre_post_processors

            self.env_pre, self.env_post = make_env_pre_post_processors(env_cfg=self.env_cfg, policy_cfg=cfg)
        else:
            self.env_pre = self.env_post = None
        visual = [k for k, ft in cfg.input_features.items() if getattr(ft.type, "name", "") == "VISUAL"]
        # observation.image -> "image" (LeRobot's single-camera key), observation.images.X -> "X"
        self.cameras = {
            k.split(".")[-1] if k.startswith("observation.images.") else "image": k for k in visual
        }
        env_ft = cfg.input_features.get("observation.environment_state")
        if self.tasks is not None and (env_ft is None or list(env_ft.shape) != [len(self.tasks)]):
            raise ValueError(
                f"--task-onehot: {len(self.tasks)} tasks, but the policy's environment state is "
                f"{None if env_ft is None else list(env_ft.shape)}"
            )
        action = cfg.output_features.get("action")
        self.action_dim = int(action.shape[0]) if action is not None else None
        self.torch = torch
        import lerobot

        self.metadata = {
            "camera_names": list(self.cameras),
            "replan_steps": 1,
            "action_horizon": 1,
            "action_dim": self.action_dim,
            "needs_reset": True,
            "policy": f"lerobot {cfg.type} ({Path(folder).resolve()})",
            "lerobot_version": getattr(lerobot, "__version__", "unknown"),
            "server": "scripts/lerobot_policy_server.py",
            "resize": resize,
            "overrides": dict(overrides or {}),
            "task_onehot": None
            if task_onehot is None
            else {"dataset": str(task_onehot), "tasks": self.tasks},
        }

    def session(self) -> Any:
        return copy.deepcopy(self.policy)

    def act(self, policy: Any, msg: dict) -> np.ndarray:
        """One openpi-style observation -> one action float32 [1, A] (see the module docstring)."""
        from lerobot.envs.utils import preprocess_observation

        torch = self.torch
        images = {}
        for cam in self.cameras:
            img = msg.get(f"observation/{cam}")
            if img is None:
                raise ValueError(f"missing 'observation/{cam}' (this policy reads {list(self.cameras)})")
            img = np.asarray(img)
            if img.dtype != np.uint8 or img.ndim != 3 or img.shape[-1] != 3:
                raise ValueError(f"'observation/{cam}' must be uint8 [H, W, 3], got {img.dtype} {img.shape}")
            if self.fit_image is not None:
                x = torch.from_numpy(np.array(img)).permute(2, 0, 1)  # a writable copy
                img = self.fit_image(x, self.resize).permute(1, 2, 0).numpy()
            images[cam] = img[None]
        raw: dict[str, Any] = {}
        if list(self.cameras) == ["image"]:
            raw["pixels"] = images["image"]
        else:
            raw["pixels"] = images
        if "observation/state" in msg:
            raw["agent_pos"] = np.asarray(msg["observation/state"], np.float32)[None]
        if self.tasks is not None:
            prompt = str(msg.get("prompt", ""))
            if prompt not in self.tasks:
                raise ValueError(f"prompt {prompt!r} is not one of the policy's {len(self.tasks)} tasks")
            raw["environment_state"] = np.eye(len(self.tasks), dtype=np.float32)[[self.tasks.index(prompt)]]
        obs = preprocess_observation(raw)
        obs["task"] = [str(msg.get("prompt", ""))]
        if self.env_pre is not None:
            obs = self.env_pre(obs)
        obs = self.pre(obs)
        amp = (
            torch.autocast(device_type=torch.device(self.cfg.device).type)
            if getattr(self.cfg, "use_amp", False)
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), amp:
            action = policy.select_action(obs)
        action = self.post(action)
        if self.env_post is not None:
            action = self.env_post({"action": action})["action"]
        out = action.to("cpu").float().numpy()
        if out.ndim != 2 or out.shape[0] != 1:
            raise RuntimeError(f"select_action gave shape {out.shape}, expected [1, A]")
        return out.astype(np.float32)


def serve(side: LeRobotSide, host: str, port: int, max_bytes: int) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.server import serve as ws_serve

    wire = load_wire()
    lock = threading.Lock()  # one forward pass at a time: torch threads are the parallelism

    def handler(ws) -> None:
        peer = ws.remote_address  # read now: after an abrupt close the socket has no peer left
        try:
            answer(ws)
        except ConnectionClosed:  # an eval worker that exits without a close frame
            log.info("client %s went away", peer)

    def answer(ws) -> None:
        policy = side.session()
        ws.send(wire.packb(side.metadata))
        for msg in ws:
            t0 = time.perf_counter()
            try:
                if isinstance(msg, str):
                    raise ValueError("expected a binary msgpack message, got text")
                obs = wire.unpackb(msg, max_bytes)
                if isinstance(obs, dict) and obs.get("reset"):
                    policy.reset()
                    ws.send(wire.packb({"reset": True}))
                    continue
                if not isinstance(obs, dict):
                    raise ValueError("an observation is a map")
                with lock:
                    actions = side.act(policy, obs)
                timing = {"infer_ms": (time.perf_counter() - t0) * 1e3}
                ws.send(wire.packb({"actions": actions, "server_timing": timing}))
            except Exception as e:  # a bad request gets an error frame; the connection stays usable
                log.warning("request refused: %s", e)
                ws.send(f"error: {type(e).__name__}: {e}"[:1000])

    with ws_serve(handler, host, port, max_size=max_bytes, compression=None) as server:
        port = server.socket.getsockname()[1]
        # the line vla eval's tests and bench scripts wait for
        print(f"serving ws://{host}:{port} ({side.metadata['policy']})", file=sys.stderr, flush=True)
        server.serve_forever()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--policy", required=True, help="a LeRobot policy folder (config.json, model.safetensors, ...)"
    )
    ap.add_argument(
        "--env", default=None, help="LeRobot env type (e.g. metaworld, libero): lerobot-eval's path"
    )
    ap.add_argument("--device", default=None, help="cpu | cuda (default: the policy config's)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765, help="0 = any free port (printed)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--max-message-mb", type=float, default=16.0)
    ap.add_argument(
        "--resize", type=int, default=None,
        help="resize every image to RxR with vlastack's fit_image first (a policy trained on `vla data resize` data)",
    )  # fmt: skip
    ap.add_argument(
        "--set", action="append", default=[], metavar="FIELD=JSON",
        help="override a policy config field at load (JSON value), e.g. n_action_steps=8; repeatable",
    )  # fmt: skip
    ap.add_argument(
        "--task-onehot", default=None, metavar="DATASET",
        help="a `vla data task-onehot` copy: send the prompt's task as its one-hot environment state",
    )  # fmt: skip
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    overrides = {}
    for item in args.set:
        k, sep, v = item.partition("=")
        if not sep:
            ap.error(f"--set wants FIELD=JSON, got {item!r}")
        try:
            overrides[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            overrides[k.strip()] = v  # a bare string
    side = LeRobotSide(args.policy, args.env, args.device, args.resize, overrides, args.task_onehot)
    serve(side, args.host, args.port, int(args.max_message_mb * 2**20))
    return 0


if __name__ == "__main__":
    sys.exit(main())
