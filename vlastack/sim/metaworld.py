"""Meta-World tasks behind the built-in suite's interface (optional extra ``vlastack[metaworld]``).

    env = make_env("push-v3", suite="metaworld", image_size=64)   # same obs/action format
    evaluate("expert", suite="metaworld", tasks=MT10, episodes=100)

Observations: ``images`` from Meta-World cameras (``scene`` = ``corner2``, ``wrist`` =
``gripperPOV``; raw Meta-World camera names work too), ``state`` = float32 [4] (hand xyz, gripper
opening), ``prompt`` from the task description. Actions are Meta-World's own float32 [4]
(dx, dy, dz, grip effort in [-1, 1]). Each reset draws a fresh object/goal layout from the seed.
The expert is Meta-World's official scripted policy for the task (``metaworld.policies``), fed
the fully observable state vector; episodes terminate on Meta-World's ``success`` flag.

Meta-World 3.1 pins ``mujoco==3.3.0`` while vlastack runs on mujoco 4, so install it in its own
environment: ``pip install -e '.[metaworld]'`` in a fresh venv (see docs/sim.md).
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from vlastack.sim.render import ensure_gl_backend

MT10 = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
DESCRIPTIONS = {
    "reach-v3": "reach the goal position",
    "push-v3": "push the puck to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "door-open-v3": "open the door",
    "drawer-open-v3": "open the drawer",
    "drawer-close-v3": "close the drawer",
    "button-press-topdown-v3": "press the button from the top",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}
CAMERA_ALIASES = {"scene": "corner2", "wrist": "gripperPOV"}
INSTALL_HINT = (
    "Meta-World is not installed: `pip install -e '.[metaworld]'` (vlastack pins the same "
    "mujoco==3.3.0 that Meta-World 3.1 requires; `make setup` installs it with the dev extras)"
)


def describe(task: str) -> str:
    """Instruction for a Meta-World task name, e.g. 'door-open-v3' -> 'open the door'."""
    if task in DESCRIPTIONS:
        return DESCRIPTIONS[task]
    words = task.rsplit("-v", 1)[0].split("-")
    return " ".join(words)


def _import_metaworld():
    ensure_gl_backend()
    try:
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS
        from metaworld.policies import ENV_POLICY_MAP
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return ALL_V3_ENVIRONMENTS, ENV_POLICY_MAP


class MetaWorldEnv(gym.Env):
    """One Meta-World v3 task with vlastack's observation dict. ``max_steps`` defaults to 200."""

    metadata: ClassVar[dict] = {
        "render_modes": ["rgb_array"],
        "render_fps": 12,
    }  # ~ Meta-World's control rate

    def __init__(
        self,
        task: str,
        image_size: int = 64,
        cameras: tuple[str, ...] | list[str] = ("scene",),
        max_steps: int = 200,
    ):
        envs, policies = _import_metaworld()
        if task not in envs:
            raise ValueError(f"unknown Meta-World task {task!r}; e.g. {', '.join(MT10[:4])}")
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
        self.env.max_path_length = max_steps + 1
        self.expert = policies[task]()
        self.cameras = tuple(cameras)
        self._cam_names = [CAMERA_ALIASES.get(c, c) for c in self.cameras]
        m = self.env.model
        for c in self._cam_names:
            if mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, c) < 0:
                raise ValueError(f"unknown Meta-World camera {c!r}")
        m.vis.quality.offsamples, m.vis.quality.shadowsize = 0, 0
        m.light_castshadow[:] = 0
        m.vis.global_.offwidth = max(m.vis.global_.offwidth, image_size)
        m.vis.global_.offheight = max(m.vis.global_.offheight, image_size)
        self._renderer = mujoco.Renderer(m, image_size, image_size)
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
        self._raw, _, _, _, info = self.env.step(np.clip(a, -1.0, 1.0))
        self.t += 1
        ok = bool(info.get("success", 0.0) > 0.5)
        truncated = self.t >= self.max_steps and not ok
        return self._obs(), float(ok), ok, truncated, {"task": self.task_name, "success": ok}

    def expert_action(self) -> np.ndarray:
        """Meta-World's official scripted policy on the full state (privileged)."""
        return np.clip(self.expert.get_action(self._raw), -1.0, 1.0).astype(np.float32)

    def _obs(self) -> dict:
        images = {}
        for c, name in zip(self.cameras, self._cam_names):
            self._renderer.update_scene(self.env.data, camera=name)
            img = self._renderer.render()
            # Meta-World's corner cameras are mounted upside down: rotate to an upright view.
            images[c] = (img[::-1, ::-1] if name.startswith("corner") else img).copy()
        return {"images": images, "state": self._raw[:4].astype(np.float32), "prompt": self.prompt}

    def close(self) -> None:
        self._renderer.close()
        self.env.close()
