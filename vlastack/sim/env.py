"""Gymnasium environments for the built-in suite, and the suite registry.

    env = make_env("pick_place", image_size=64, cameras=("scene", "wrist"), seed=0)
    obs, info = env.reset(seed=0)   # obs = {"images": {"scene": uint8 [H,W,3], ...},
                                    #        "state": float32 [5], "prompt": str}
    obs, reward, terminated, truncated, info = env.step(np.zeros(4, np.float32))

Actions are float32 [4] = (dx, dy, dz, grip): dx..dz are clipped to [-1, 1] and move the gripper
by up to ``MAX_DELTA`` = 3 cm per step (10 Hz control, 20 physics substeps); grip > 0 closes.
With ``action_representation="absolute"`` they are (x, y, z, grip) instead: the gripper's target
position in metres, approached by at most ``MAX_DELTA`` per axis each step (a position-controlled
arm with a speed limit; ``ACTION_REPRESENTATIONS``). The scripted expert answers in the env's
representation, and its absolute target is exactly where its delta would move the gripper, so
both representations replay the same trajectories.
An episode terminates on success (reward 1) and is truncated at the task's step limit, or as soon
as it can no longer succeed (``Task.failed``: a fragile family's cup spilled, ``info["spilled"]``).
``info["distance"]`` is how far the scene is from done, in metres (``Task.distance``).

Privileged hooks: ``env.expert_action()`` is the scripted expert's next action, and
``env.privileged_state()`` the task's key object and goal positions (see ``sim/imitability.py``).
Policies that set ``needs_env = True`` (``ExpertPolicy``) receive the env from the evaluator.
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from vlastack.config import ACTION_REPRESENTATIONS
from vlastack.sim.dynamic import DYNAMIC_TASKS
from vlastack.sim.fragile import FRAGILE_TASKS
from vlastack.sim.scene import ACTION_DIM, CONTROL_HZ, EE_HIGH, EE_HOME, EE_LOW, STATE_DIM, SimCore
from vlastack.sim.tasks import TASKS

# The ``builtin`` suite's default task list stays the four static families (the demo's data and
# results); the dynamic families (sim/dynamic.py) are named explicitly or run as ``dynamic``, the
# fragile ones (sim/fragile.py: the dynamic reaches carrying a cup that spills) as ``fragile``.
SUITES: dict[str, tuple[str, ...]] = {
    "builtin": ("reach", "push", "pick_place", "stack"),
    "dynamic": tuple(DYNAMIC_TASKS),
    "fragile": tuple(FRAGILE_TASKS),
}
ALL_TASKS = {**TASKS, **DYNAMIC_TASKS, **FRAGILE_TASKS}
LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
ALL_SUITES = (*SUITES, "metaworld", *LIBERO_SUITES)


def check_representation(representation: str, suite: str = "builtin") -> str:
    """``representation`` if ``suite`` takes it, else a ``ValueError`` saying what it takes."""
    if representation not in ACTION_REPRESENTATIONS:
        raise ValueError(
            f"action representation must be one of {', '.join(ACTION_REPRESENTATIONS)}, got {representation!r}"
        )
    if representation != "delta" and suite not in SUITES:
        raise ValueError(
            f"suite {suite!r} takes delta actions only (as LeRobot's environment does); absolute "
            f"targets exist for the {' and '.join(SUITES)} suites"
        )
    return representation


def suite_tasks(suite: str, tasks: tuple[str, ...] | list[str] = ()) -> tuple[str, ...]:
    """Task names of ``suite`` (all of them, or the named subset, checked)."""
    if suite == "metaworld":
        from vlastack.sim.metaworld_tasks import MT10, expand_tasks

        return expand_tasks(tasks) if tasks else MT10  # names, MT10, MT50 or difficulty groups
    if suite.startswith("libero"):
        from vlastack.sim.libero import task_keys

        return task_keys(suite, tasks)  # "libero_spatial/0", ...: ids or LIBERO's task names
    if suite in SUITES:
        known = tuple(ALL_TASKS) if suite == "builtin" else SUITES[suite]
    else:
        raise ValueError(f"unknown suite {suite!r}; choose from {', '.join(ALL_SUITES)}")
    if not tasks:
        return SUITES.get(suite, tuple(known))
    bad = [t for t in tasks if t not in known]
    if bad:
        raise ValueError(f"unknown task(s) {bad} in suite {suite!r}; known: {', '.join(known)}")
    return tuple(tasks)


class BuiltinEnv(gym.Env):
    """One task family of the built-in suite (see module docstring for the interface)."""

    metadata: ClassVar[dict] = {"render_modes": ["rgb_array"], "render_fps": CONTROL_HZ}

    def __init__(
        self,
        task: str,
        image_size: int = 64,
        cameras: tuple[str, ...] | list[str] = ("scene", "wrist"),
        max_steps: int | None = None,
        action_representation: str = "delta",
    ):
        self.action_representation = check_representation(action_representation)
        if task not in ALL_TASKS:
            raise ValueError(f"unknown built-in task {task!r}; choose from {', '.join(ALL_TASKS)}")
        if image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {image_size}")
        self.task_name = task
        self.core = SimCore(image_size, tuple(cameras))
        self.task = ALL_TASKS[task](self.core)
        self.max_steps = int(max_steps or self.task.max_steps)
        img = spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        self.observation_space = spaces.Dict(
            {
                "images": spaces.Dict({c: img for c in self.core.cameras}),
                "state": spaces.Box(-np.inf, np.inf, (STATE_DIM + self.task.extra_state_dim,), np.float32),
                "prompt": spaces.Text(256),
            }
        )
        if self.action_representation == "absolute":
            low, high = np.append(EE_LOW, -1.0), np.append(EE_HIGH, 1.0)
            self.action_space = spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
        else:
            self.action_space = spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.prompt = ""
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        self.core.reset(EE_HOME + rng.uniform([-0.03, -0.03, -0.02], [0.03, 0.03, 0.02]))
        self.prompt = self.task.reset(rng)
        self.core.step(np.array([0, 0, 0, -1], np.float32))  # let objects settle on the table
        self.t = 0
        return self._obs(), {"task": self.task_name, "success": False}

    def step(self, action):
        a = np.asarray(action, dtype=np.float32).reshape(-1)
        if a.shape != (ACTION_DIM,) or not np.all(np.isfinite(a)):
            raise ValueError(f"action must be {ACTION_DIM} finite floats, got {np.asarray(action)!r}")
        self.task.advance()  # dynamic families move their objects (a no-op for static ones)
        self.core.step(a, absolute=self.action_representation == "absolute")
        self.task.after_step()  # fragile families: the step's acceleration, a spill
        self.t += 1
        ok = self.task.success()
        truncated = (self.t >= self.max_steps or self.task.failed()) and not ok
        info = {
            "task": self.task_name,
            "success": ok,
            "distance": self.task.distance(),
            **self.task.step_info(),
        }
        return self._obs(), float(ok), ok, truncated, info

    def expert_action(self) -> np.ndarray:
        """The scripted expert's next action (privileged: reads simulator state), in the env's
        representation: absolute = the position its delta would move the gripper to."""
        a = np.asarray(self.task.expert(), np.float32)
        if self.action_representation == "absolute":
            return self.to_absolute(a)
        return a

    def to_absolute(self, delta: np.ndarray) -> np.ndarray:
        """A delta action [4] -> the absolute action [4] that moves the gripper the same way from
        where it is now (the target ``SimCore.step`` would compute)."""
        d = np.asarray(delta, np.float64)
        return np.append(self.core.target(d), d[3]).astype(np.float32)

    def privileged_state(self) -> np.ndarray:
        """The task's two key points (object, goal) as float32 [6] (privileged, for oracle checks)."""
        return np.concatenate(self.task.key_positions()).astype(np.float32)

    def privileged_uv(self) -> dict[str, np.ndarray]:
        """Where each camera images the two key points: {camera: float32 [4]} = (object u, v, goal
        u, v), fractions of the image (``SimCore.project``; privileged, for grounding supervision)."""
        pts = np.stack(self.task.key_positions())
        return {c: self.core.project(pts, c).reshape(-1) for c in self.core.cameras}

    def render(self) -> np.ndarray:
        return self.core.render()[self.core.cameras[0]]

    def _obs(self) -> dict:
        state = self.core.state()
        if self.task.extra_state_dim:  # fragile families: + the gripper's velocity
            state = np.concatenate([state, self.task.extra_state()]).astype(np.float32)
        return {"images": self.core.render(), "state": state, "prompt": self.prompt}

    def close(self) -> None:
        self.core.close()


def default_cameras(suite: str) -> tuple[str, ...]:
    """The cameras a suite renders unless told otherwise (Meta-World: LeRobot's one ``image``;
    LIBERO: LeRobot's ``image`` (agentview) and ``image2`` (wrist))."""
    if suite in LIBERO_SUITES:
        return ("image", "image2")
    return ("image",) if suite == "metaworld" else ("scene", "wrist")


def make_env(
    task_name: str,
    image_size: int | None = None,
    cameras: tuple[str, ...] | list[str] | None = None,
    seed: int | None = None,
    suite: str = "builtin",
    render_quality: str = "lerobot",
    max_steps: int = 0,
    camera_map: dict[str, str | None] | None = None,
    action_representation: str = "delta",
    lerobot_batch_size: int = 1,
    init_states: bool = True,
):
    """Build one env of ``suite``. ``seed`` seeds the first ``reset`` if given. ``image_size`` and
    ``cameras`` default to the suite's own (builtin: 64 px, scene + wrist; Meta-World: LeRobot's
    480 px ``image``; LIBERO: LeRobot's 360 px ``image`` + ``image2``). ``render_quality``: Meta-World
    only (``metaworld.RENDER_QUALITY``); ``max_steps``: the episode limit, 0 = the task's own
    (builtin: per task, Meta-World 500, LIBERO per suite); ``camera_map``: LIBERO only, policy
    camera -> ``agentview`` / ``wrist`` / None where the names do not say (``libero.match_cameras``);
    ``action_representation``: ``delta`` or ``absolute`` (builtin and dynamic suites only; see the
    module docstring); ``lerobot_batch_size``: LIBERO only, the envs per task of the lerobot-eval
    run to match (``libero.LiberoEnv``); ``init_states``: LIBERO only, False places the objects at
    random (seeded) instead of LIBERO's fixed initial states (demonstrations)."""
    if lerobot_batch_size != 1 and suite not in LIBERO_SUITES:
        raise ValueError(f"lerobot_batch_size applies to the LIBERO suites, not {suite!r}")
    if not init_states and suite not in LIBERO_SUITES:
        raise ValueError(f"init_states applies to the LIBERO suites, not {suite!r}")
    check_representation(action_representation, suite if suite in ALL_SUITES else "builtin")
    cameras = tuple(cameras) if cameras is not None else default_cameras(suite)  # () = render nothing
    if suite == "metaworld":
        from vlastack.sim.metaworld import LEROBOT_IMAGE_SIZE, LEROBOT_MAX_STEPS, MetaWorldEnv

        size = image_size or LEROBOT_IMAGE_SIZE
        env = MetaWorldEnv(task_name, size, cameras, max_steps or LEROBOT_MAX_STEPS, render_quality)
    elif suite in LIBERO_SUITES:
        from vlastack.sim.libero import LEROBOT_IMAGE_SIZE as LIBERO_SIZE
        from vlastack.sim.libero import LiberoEnv

        env = LiberoEnv(
            suite,
            task_name,
            image_size or LIBERO_SIZE,
            cameras,
            max_steps,
            camera_map,
            lerobot_batch_size,
            init_states,
        )
    elif suite in SUITES:
        env = BuiltinEnv(task_name, image_size=image_size or 64, cameras=cameras, max_steps=max_steps or None,
                         action_representation=action_representation)  # fmt: skip
    else:
        raise ValueError(f"unknown suite {suite!r}; choose from {', '.join(ALL_SUITES)}")
    if seed is not None:
        env.reset(seed=seed)
    return env
