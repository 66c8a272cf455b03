"""Meta-World tasks behind the built-in suite's interface, as LeRobot runs them (extra ``vlastack[metaworld]``).

    env = make_env("push-v3", suite="metaworld")   # LeRobot's camera, 480x480 frames, 500 steps
    evaluate("expert", suite="metaworld", tasks=("MT10",), episodes=50, seed=1000, seed_scheme="per_task")

This follows LeRobot 0.6.1's ``MetaworldEnv`` (``lerobot/envs/metaworld.py``, tag v0.6.1) so data made
here and policies scored here carry over to ``lerobot-eval``:

- ``images["image"]`` (aliases ``scene`` = ``corner2``, ``wrist`` = ``gripperPOV``): the ``corner2``
  camera moved to ``LEROBOT_CORNER2_POS``, rendered at 480x480 with Meta-World's own render settings,
  both image axes flipped (the camera is mounted upside down). Resizing to the model's input is the
  policy's preprocessing, the same in training, ``vla eval`` and serving. ``image_size`` other than
  480 renders natively at that size (fast, but not LeRobot's pixels).
- ``state`` = float32 [4]: hand xyz and gripper opening (``raw_obs[:4]``, LeRobot's ``agent_pos``).
- ``prompt``: LeRobot's task description (``metaworld_tasks.DESCRIPTIONS``).
- Actions: Meta-World's float32 [4] (dx, dy, dz, grip effort), clipped to [-1, 1].
- Layouts: ``reset(seed=s)`` seeds Meta-World's RNG, which draws the object and goal positions, as
  LeRobot does since its seeding fix (lerobot PR #3727). Episodes end at Meta-World's ``success``
  flag or after ``max_steps`` (500, Meta-World's and lerobot-eval's limit); 80 steps per second.
- Reward: Meta-World's own shaped reward for the step, as LeRobot's environment returns it (what
  ``vla data generate`` stores as ``next.reward``); success is ``info["success"]``.

The expert is Meta-World's official scripted policy for the task (``metaworld.policies``), fed the
fully observable state vector. ``raw_state()`` is that 39-dim vector (LeRobot's dataset stores it
as ``observation.environment_state``).
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from vlastack.sim.camera import pinhole_uv
from vlastack.sim.metaworld_tasks import DESCRIPTIONS, MT10, MT50
from vlastack.sim.render import close_at_exit, ensure_gl_backend

__all__ = ["MT10", "MT50", "MetaWorldEnv", "describe", "fixed_camera", "points_uv"]

CAMERA_ALIASES = {"image": "corner2", "scene": "corner2", "wrist": "gripperPOV"}
# LeRobot's MetaworldEnv moves corner2 here before rendering (lerobot/envs/metaworld.py, v0.6.1).
LEROBOT_CORNER2_POS = (0.75, 0.075, 0.7)
LEROBOT_IMAGE_SIZE = 480  # gymnasium MujocoEnv's default render size, which LeRobot keeps
LEROBOT_MAX_STEPS = 500  # Meta-World's max_path_length; lerobot-eval runs episodes to it
# Render settings. "lerobot": Meta-World's own (4x multisampling, a 4096 px shadow map), what LeRobot
# renders; ~141 ms per 480 px frame on one core here. "fast": no multisampling, a 1024 px shadow
# map: ~50 ms, and 0.16/255 mean (8/255 max) pixel difference once resized to 64 px (measured on
# pick-place-v3; docs/metaworld.md). Shadows stay: dropping them changes 7.4/255 at 64 px.
RENDER_QUALITY = {"lerobot": None, "fast": (0, 1024)}  # (offsamples, shadowsize) overrides
# The grounding points in the 39-dim state: the task's first object (4:7) and the goal (36:39), the
# positions the metaworld recipes' grounding head regresses (``model.grounding.state_index``).
GROUNDING_INDEX = (4, 5, 6, 36, 37, 38)
INSTALL_HINT = (
    "Meta-World is not installed: `pip install -e '.[metaworld]'` (vlastack pins the same "
    "mujoco==3.3.0 that Meta-World 3.1 requires; `make setup` installs it with the dev extras)"
)


def describe(task: str) -> str:
    """LeRobot's instruction for a Meta-World task, e.g. 'door-open-v3' -> 'Open a door with a revolving joint'."""
    if task in DESCRIPTIONS:
        return DESCRIPTIONS[task]
    words = task.rsplit("-v", 1)[0].split("-")
    return " ".join(words).capitalize()


def _import_metaworld():
    ensure_gl_backend()
    try:
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS
        from metaworld.policies import ENV_POLICY_MAP
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return ALL_V3_ENVIRONMENTS, ENV_POLICY_MAP


class MetaWorldEnv(gym.Env):
    """One Meta-World v3 task with vlastack's observation dict (see the module docstring)."""

    metadata: ClassVar[dict] = {"render_modes": ["rgb_array"], "render_fps": 80}  # 0.0125 s per step

    def __init__(
        self,
        task: str,
        image_size: int = LEROBOT_IMAGE_SIZE,
        cameras: tuple[str, ...] | list[str] = ("image",),
        max_steps: int = LEROBOT_MAX_STEPS,
        render_quality: str = "lerobot",
    ):
        if render_quality not in RENDER_QUALITY:
            raise ValueError(
                f"render_quality must be one of {sorted(RENDER_QUALITY)}, got {render_quality!r}"
            )
        envs, policies = _import_metaworld()
        task = task.replace("metaworld-", "")
        if task not in envs:
            raise ValueError(
                f"unknown Meta-World task {task!r}; e.g. {', '.join(MT10[:4])} (MT50 has {len(MT50)})"
            )
        if not 1 <= max_steps <= LEROBOT_MAX_STEPS:
            raise ValueError(
                f"max_steps must be in 1..{LEROBOT_MAX_STEPS} (Meta-World's limit), got {max_steps}"
            )
        import mujoco

        self.task_name, self.max_steps = task, max_steps
        self.env = envs[task]()
        # Meta-World's set_task() unpickles a task blob; we need none of it (no pickle on our
        # paths): flag the task as set and randomize the layout from the env's seeded RNG.
        self.env._set_task_called = True
        self.env._partially_observable = False  # the scripted policies read the goal from obs
        with contextlib.suppress(AttributeError):
            del self.env.sawyer_observation_space  # cached for the partially observable layout
        self.env._freeze_rand_vec = False
        self.env.seeded_rand_vec = True  # layouts come from env.np_random, i.e. from our seed
        self.env.max_path_length = LEROBOT_MAX_STEPS
        self.expert = policies[task]()
        self.cameras = tuple(cameras)
        self._cam_names = [CAMERA_ALIASES.get(c, c) for c in self.cameras]
        m = self.env.model
        for c in self._cam_names:
            if mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, c) < 0:
                raise ValueError(f"unknown Meta-World camera {c!r}")
        corner2 = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, "corner2")
        m.cam_pos[corner2] = LEROBOT_CORNER2_POS
        if RENDER_QUALITY[render_quality]:
            m.vis.quality.offsamples, m.vis.quality.shadowsize = RENDER_QUALITY[render_quality]
        m.vis.global_.offwidth = max(m.vis.global_.offwidth, image_size)
        m.vis.global_.offheight = max(m.vis.global_.offheight, image_size)
        self._renderer = mujoco.Renderer(m, image_size, image_size)
        close_at_exit(self)  # before MuJoCo's EGL teardown (render.close_at_exit)
        img = spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        self.observation_space = spaces.Dict(
            {
                "images": spaces.Dict({c: img for c in self.cameras}),
                "state": spaces.Box(-np.inf, np.inf, (4,), np.float32),
                "prompt": spaces.Text(256),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.prompt = describe(task)
        self._raw = None
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.env.seed(int(seed))
        self._raw, _ = self.env.reset()
        self.t = 0
        return self._obs(), {"task": self.task_name, "success": False}

    def step(self, action):
        a = np.asarray(action, dtype=np.float32).reshape(-1)
        if a.shape != (4,) or not np.all(np.isfinite(a)):
            raise ValueError(f"action must be 4 finite floats, got {np.asarray(action)!r}")
        self._raw, reward, _, _, info = self.env.step(np.clip(a, -1.0, 1.0))
        self.t += 1
        ok = bool(info.get("success", 0.0) > 0.5)
        truncated = self.t >= self.max_steps and not ok
        out = {"task": self.task_name, "success": ok}
        if "obj_to_target" in info:  # Meta-World's own distance to done (the reach tasks: the hand's)
            out["distance"] = float(info["obj_to_target"])
        return self._obs(), float(reward), ok, truncated, out

    def expert_action(self) -> np.ndarray:
        """Meta-World's official scripted policy on the full state (privileged)."""
        return np.clip(self.expert.get_action(self._raw), -1.0, 1.0).astype(np.float32)

    def raw_state(self) -> np.ndarray:
        """Meta-World's full 39-dim observation (hand, gripper, objects, previous frame, goal), float32."""
        return np.asarray(self._raw, np.float32)

    def _obs(self) -> dict:
        images = {}
        for c, name in zip(self.cameras, self._cam_names):
            self._renderer.update_scene(self.env.data, camera=name)
            img = self._renderer.render()
            # Meta-World's corner cameras are mounted upside down: rotate to an upright view.
            images[c] = (img[::-1, ::-1] if name.startswith("corner") else img).copy()
        return {"images": images, "state": self._raw[:4].astype(np.float32), "prompt": self.prompt}

    def privileged_state(self) -> np.ndarray:
        """The object's and the goal's positions (``GROUNDING_INDEX`` of the state), float32 [6]."""
        return self.raw_state()[list(GROUNDING_INDEX)]

    def privileged_uv(self) -> dict[str, np.ndarray]:
        """Where each world-fixed camera images the object and the goal, {camera: float32 [4]}
        (object u, v, goal u, v as fractions of the upright image; ``points_uv``)."""
        return {c: points_uv(self.raw_state(), c) for c in self.cameras if fixed_camera(c)}

    def close(self) -> None:
        if self._renderer is not None:  # closing twice (by hand, then at exit) is harmless
            self._renderer.close()
            self._renderer = None
            self.env.close()


_CAMERA_POSES: dict[str, tuple[np.ndarray, np.ndarray, float] | None] = {}


def _camera_pose(camera: str) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(cam_xpos [3], cam_xmat [3, 3], fovy) of a Meta-World camera as ``MetaWorldEnv`` renders it
    (corner2 at LeRobot's position), or None for a camera that moves with the robot
    (``gripperPOV``). Every task shares the cameras of ``xyz_base.xml``, and the world-fixed ones
    do not move, so one reset of one task gives them all."""
    name = CAMERA_ALIASES.get(camera, camera)
    if name not in _CAMERA_POSES:
        envs, _ = _import_metaworld()  # first: it picks the GL backend before mujoco loads
        import mujoco

        env = envs["reach-v3"]()
        m = env.model
        cid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, name)
        if cid < 0:
            env.close()
            raise ValueError(f"unknown Meta-World camera {camera!r}")
        m.cam_pos[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, "corner2")] = LEROBOT_CORNER2_POS
        mujoco.mj_forward(m, env.data)
        fixed = m.cam_bodyid[cid] == 0 and m.cam_mode[cid] == mujoco.mjtCamLight.mjCAMLIGHT_FIXED
        _CAMERA_POSES[name] = (
            (
                env.data.cam_xpos[cid].copy(),
                env.data.cam_xmat[cid].reshape(3, 3).copy(),
                float(m.cam_fovy[cid]),
            )
            if fixed
            else None
        )
        env.close()
    return _CAMERA_POSES[name]


def fixed_camera(camera: str) -> bool:
    """Whether a Meta-World camera is fixed in the world (so ``points_uv`` applies to it)."""
    return _camera_pose(camera) is not None


def points_uv(env_state: np.ndarray, camera: str = "image") -> np.ndarray:
    """Meta-World states [..., 39] (``observation.environment_state``) -> float32 [..., 4]: where
    ``camera`` images the object and the goal (``GROUNDING_INDEX``), (u, v) as fractions of the
    image as ``MetaWorldEnv`` returns it (corner cameras flipped upright). A pure function of the
    state, so a dataset recorded without it (e.g. LeRobot's ``lerobot/metaworld_mt50``) can get it
    afterwards (``vla data add-uv``)."""
    state = np.asarray(env_state, np.float64)
    if state.shape[-1] != 39:
        raise ValueError(f"Meta-World states are 39 wide, got shape {state.shape}")
    pts = state[..., list(GROUNDING_INDEX)].reshape(*state.shape[:-1], 2, 3)
    return project(pts, camera).reshape(*state.shape[:-1], 4)


def project(points: np.ndarray, camera: str = "image") -> np.ndarray:
    """World points [..., 3] -> float32 [..., 2]: (u, v) where the fixed ``camera`` images them,
    as fractions of the image as ``MetaWorldEnv`` returns it (corner cameras flipped upright)."""
    pose = _camera_pose(camera)
    if pose is None:
        raise ValueError(f"Meta-World camera {camera!r} moves with the robot: no fixed projection")
    pos, mat, fovy = pose
    uv = pinhole_uv(np.asarray(points, np.float64), pos, mat, fovy)
    if CAMERA_ALIASES.get(camera, camera).startswith("corner"):  # rendered upside down, flipped upright
        uv = np.where(uv >= 0, 1.0 - uv, uv)
    return uv.astype(np.float32)
