"""The built-in task families: layout sampling, instructions, success tests and scripted experts.

Every family randomizes object positions, yaw and colors, adds distractors of other colors, and
names its target by color in the instruction, so a policy must read the prompt and look at the
image. Phrasings are short on purpose: the ``tiny`` preset keeps only the first 23 bytes of a
prompt, so the colors that matter come early.

Experts are stateless functions of the privileged simulator state (``SimCore``): each call looks
at where things are and returns the next action, so they recover from noise and missed grasps.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from vlastack.sim.scene import (
    BLOCK_HALF,
    BOWL_INNER,
    COLORS,
    MAX_DELTA,
    PAD_RADIUS,
    WORKSPACE,
    SimCore,
)

HOVER_Z = 0.09  # travel height: clears every object
CARRY_Z = 0.11  # travel height with a block in hand
COLOR_NAMES = tuple(COLORS)


def _toward(ee: np.ndarray, goal: np.ndarray, grip: float) -> np.ndarray:
    """Proportional step toward ``goal``: float32 [4] with xyz in [-1, 1]."""
    d = np.clip((goal - ee) / MAX_DELTA, -1.0, 1.0)
    return np.array([d[0], d[1], d[2], grip], np.float32)


def sample_xy(rng: np.random.Generator, n: int, min_dist: float, avoid=(), margin: float = 0.0) -> list:
    """``n`` points in the workspace, pairwise >= ``min_dist`` apart and from ``avoid``."""
    (x0, x1), (y0, y1) = WORKSPACE
    for _ in range(1000):
        pts = [*avoid]
        for _ in range(2000):
            p = np.array([rng.uniform(x0 + margin, x1 - margin), rng.uniform(y0 + margin, y1 - margin)])
            if all(np.linalg.norm(p - q) >= min_dist for q in pts):
                pts.append(p)
                if len(pts) == len(avoid) + n:
                    return pts[len(avoid) :]
    raise RuntimeError("could not sample a layout; the workspace is too small for these distances")


class Task:
    """One family. ``reset`` lays out the scene and returns the instruction."""

    family: str = ""
    max_steps: int = 50
    phrasings: tuple[str, ...] = ()
    extra_state_dim: int = 0  # dims a family appends to the robot state (fragile: velocity)

    def __init__(self, core: SimCore):
        self.core = core

    def reset(self, rng: np.random.Generator) -> str:
        raise NotImplementedError

    def success(self) -> bool:
        raise NotImplementedError

    def expert(self) -> np.ndarray:
        raise NotImplementedError

    def advance(self) -> None:
        """Before each control step: dynamic families move or change their objects (dynamic.py)."""

    def after_step(self) -> None:
        """After each control step: fragile families measure the motion it made (fragile.py)."""

    def failed(self) -> bool:
        """The episode can no longer succeed (a fragile family's cup spilled): it ends now."""
        return False

    def extra_state(self) -> np.ndarray:
        """float32 [extra_state_dim], appended to ``SimCore.state()`` in the observation."""
        return np.zeros(0, np.float32)

    def step_info(self) -> dict:
        """Extra entries for the env's step ``info`` (fragile families: ``spilled``, ``peak_accel``)."""
        return {}

    def key_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """Privileged: the two points the task is about (object, goal), each xyz [3] in metres."""
        raise NotImplementedError

    def distance(self) -> float:
        """How far the scene is from done, in metres: the object's distance to its goal (the reach
        families: the gripper's to its target). The env reports it in every step's ``info``;
        ``vla rl`` can shape its reward with it (``rl.progress_reward``)."""
        obj, goal = self.key_positions()
        return float(np.linalg.norm(obj - goal))

    def _phrase(self, rng: np.random.Generator, **kw) -> str:
        return self.phrasings[rng.integers(len(self.phrasings))].format(**kw)

    def _blocks(self, rng: np.random.Generator, n: int, xy: list) -> list[str]:
        """Place ``block0..n-1`` at ``xy`` with random yaw and distinct colors; returns colors."""
        colors = list(rng.choice(COLOR_NAMES, size=n, replace=False))
        for i in range(n):
            self.core.place(f"block{i}", tuple(xy[i]), rng.uniform(-0.5, 0.5))
            self.core.set_color(f"block{i}", COLORS[colors[i]])
        return colors


class Reach(Task):
    family = "reach"
    max_steps = 30
    phrasings = ("touch the {c} {s}", "reach the {c} {s}", "go to the {c} {s}", "point at the {c} {s}")
    _pool: ClassVar[dict[str, tuple[str, ...]]] = {
        "block": ("block0", "block1", "block2"),
        "ball": ("ball0", "ball1"),
        "cylinder": ("cyl0", "cyl1"),
    }

    def reset(self, rng: np.random.Generator) -> str:
        shapes = [str(s) for s in rng.choice(["block", "ball", "cylinder"], size=3)]
        while max(shapes.count(s) for s in set(shapes)) > 2:  # the pool has 2 balls, 2 cylinders
            shapes = [str(s) for s in rng.choice(["block", "ball", "cylinder"], size=3)]
        colors = list(rng.choice(COLOR_NAMES, size=3, replace=False))
        used = {k: 0 for k in self._pool}
        self.objects = []
        for s, xy, c in zip(shapes, sample_xy(rng, 3, 0.09), colors):
            name = self._pool[s][used[s]]
            used[s] += 1
            self.core.place(name, tuple(xy), rng.uniform(-0.5, 0.5))
            self.core.set_color(name, COLORS[c])
            self.objects.append(name)
        k = int(rng.integers(3))
        self.target = self.objects[k]
        return self._phrase(rng, c=colors[k], s=shapes[k])

    def _top(self) -> np.ndarray:
        p = self.core.pos(self.target)
        return np.array([p[0], p[1], 2 * BLOCK_HALF])  # every reach object is 5 cm tall

    def success(self) -> bool:
        ee, top = self.core.ee_pos, self._top()
        return bool(np.linalg.norm(ee[:2] - top[:2]) < 0.03 and ee[2] < top[2] + 0.035)

    def expert(self) -> np.ndarray:
        ee, top = self.core.ee_pos, self._top()
        far = np.linalg.norm(ee[:2] - top[:2]) > 0.03
        goal = np.array([top[0], top[1], HOVER_Z if far else top[2] + 0.015])
        return _toward(ee, goal, -1.0)

    def key_positions(self) -> tuple[np.ndarray, np.ndarray]:
        return self._top(), self._top()

    def distance(self) -> float:
        return float(np.linalg.norm(self.core.ee_pos - self._top()))


class Push(Task):
    family = "push"
    max_steps = 50
    phrasings = (
        "push the {c} block onto the pad",
        "push the {c} block to the pad",
        "slide the {c} block onto the pad",
        "move the {c} block onto the pad",
    )

    def reset(self, rng: np.random.Generator) -> str:
        for _ in range(1000):
            pad, blk = sample_xy(rng, 2, 0.10, margin=0.02)
            d = pad - blk
            if np.linalg.norm(d) > 0.16:
                continue
            pre = blk - d / np.linalg.norm(d) * 0.06  # where the gripper starts pushing from
            if abs(pre[0]) > 0.2 or abs(pre[1]) > 0.16:
                continue
            (other,) = sample_xy(rng, 1, 0.10, avoid=[pad, blk, pre])
            if _seg_dist(other, pre, pad) > 0.075:
                break
        self.core.place_fixture("pad", tuple(pad))
        colors = self._blocks(rng, 2, [blk, other])
        return self._phrase(rng, c=colors[0])

    def success(self) -> bool:
        return bool(
            np.linalg.norm(self.core.pos("block0")[:2] - self.core.pos("pad")[:2]) < PAD_RADIUS - 0.015
        )

    def expert(self) -> np.ndarray:
        ee, b, pad = self.core.ee_pos, self.core.pos("block0"), self.core.pos("pad")
        d = pad[:2] - b[:2]
        dist = float(np.linalg.norm(d))
        if dist < 0.012:
            return _toward(ee, np.array([ee[0], ee[1], HOVER_Z]), 1.0)
        u = d / dist
        rel = ee[:2] - b[:2]
        along = float(rel @ u)
        lateral = float(np.linalg.norm(rel - along * u))
        low = ee[2] < 0.045
        push_z = BLOCK_HALF
        if low and along < -0.03 and lateral < 0.015:  # behind the block, on the line: push
            goal_xy = b[:2] + u * (min(dist, 0.015) - 0.04)
            return _toward(ee, np.array([*goal_xy, push_z]), 1.0)
        pre = b[:2] - u * 0.06
        if low:  # in the wrong place near the table: go up before moving sideways
            return _toward(ee, np.array([ee[0], ee[1], HOVER_Z]), 1.0)
        if np.linalg.norm(ee[:2] - pre) > 0.012:
            return _toward(ee, np.array([*pre, HOVER_Z]), 1.0)
        return _toward(ee, np.array([*pre, push_z]), 1.0)

    def key_positions(self) -> tuple[np.ndarray, np.ndarray]:
        return self.core.pos("block0"), self.core.pos("pad")

    def distance(self) -> float:  # across the table, where success is judged
        return float(np.linalg.norm(self.core.pos("block0")[:2] - self.core.pos("pad")[:2]))


def _seg_dist(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    ab = b - a
    t = np.clip((p - a) @ ab / (ab @ ab), 0.0, 1.0)
    return float(np.linalg.norm(p - (a + t * ab)))


def pick_place_action(core: SimCore, block: int, place_xy: np.ndarray, release_z: float) -> np.ndarray:
    """Expert step for 'grasp ``block``, carry it above ``place_xy``, release at ``release_z``'.

    Travels at a safe height, descends once roughly above the target while still correcting xy,
    and grasps/releases only when close in xy and z (so noisy execution just delays it).
    """
    ee, b = core.ee_pos, core.pos(f"block{block}")
    if core.held is not None and core.held != block:
        return _toward(ee, ee + np.array([0.0, 0.0, 0.02]), -1.0)  # wrong block: drop it
    if core.held is None:
        dxy = np.linalg.norm(ee[:2] - b[:2])
        if dxy > 0.02:
            if ee[2] < HOVER_Z - 0.03 and dxy > 0.04:
                return _toward(ee, np.array([ee[0], ee[1], HOVER_Z]), -1.0)
            return _toward(ee, np.array([b[0], b[1], HOVER_Z if dxy > 0.04 else ee[2]]), -1.0)
        ready = abs(ee[2] - b[2]) < 0.008 and dxy < 0.012 and not core.closed
        return _toward(ee, b, 1.0 if ready else -1.0)
    dxy = np.linalg.norm(ee[:2] - place_xy)
    if dxy > 0.02:
        if ee[2] < CARRY_Z - 0.03 and dxy > 0.04:
            return _toward(ee, np.array([ee[0], ee[1], CARRY_Z]), 1.0)
        return _toward(ee, np.array([place_xy[0], place_xy[1], CARRY_Z if dxy > 0.04 else ee[2]]), 1.0)
    goal = np.array([place_xy[0], place_xy[1], release_z])
    ready = abs(ee[2] - release_z) < 0.008 and dxy < 0.008
    return _toward(ee, goal, -1.0 if ready else 1.0)


class PickPlace(Task):
    family = "pick_place"
    max_steps = 50
    phrasings = (
        "put the {c} block in the bowl",
        "place the {c} block in the bowl",
        "pick up the {c} block and put it in the bowl",
        "drop the {c} block into the bowl",
    )

    def reset(self, rng: np.random.Generator) -> str:
        (bowl,) = sample_xy(rng, 1, 0.0, margin=0.03)
        n = int(rng.integers(2, 4))
        xy = sample_xy(rng, n, 0.08)
        while min(np.linalg.norm(p - bowl) for p in xy) < 0.12:  # clear of the bowl's walls
            xy = sample_xy(rng, n, 0.08)
        self.core.place_fixture("bowl", tuple(bowl))
        colors = self._blocks(rng, n, xy)
        return self._phrase(rng, c=colors[0])

    def success(self) -> bool:
        b, bowl = self.core.pos("block0"), self.core.pos("bowl")
        inside = np.all(np.abs(b[:2] - bowl[:2]) < BOWL_INNER)
        return bool(inside and b[2] < 0.045 and self.core.held is None)

    def expert(self) -> np.ndarray:
        return pick_place_action(self.core, 0, self.core.pos("bowl")[:2], 0.075)

    def key_positions(self) -> tuple[np.ndarray, np.ndarray]:
        return self.core.pos("block0"), self.core.pos("bowl")


class Stack(Task):
    family = "stack"
    max_steps = 50
    phrasings = ("stack {c} on {d}", "stack the {c} on {d}", "put {c} on {d}", "place {c} on the {d}")

    def reset(self, rng: np.random.Generator) -> str:
        colors = self._blocks(rng, 3, sample_xy(rng, 3, 0.09))
        return self._phrase(rng, c=colors[0], d=colors[1])

    def success(self) -> bool:
        top, base = self.core.pos("block0"), self.core.pos("block1")
        dz = top[2] - base[2]
        on = np.linalg.norm(top[:2] - base[:2]) < 0.02 and 0.04 < dz < 0.06
        return bool(on and self.core.held is None)

    def expert(self) -> np.ndarray:
        base = self.core.pos("block1")
        return pick_place_action(self.core, 0, base[:2], base[2] + 2 * BLOCK_HALF + 0.008)

    def key_positions(self) -> tuple[np.ndarray, np.ndarray]:
        return self.core.pos("block0"), self.core.pos("block1")

    def distance(self) -> float:  # to where block0 rests when stacked: on block1's top
        goal = self.core.pos("block1") + np.array([0.0, 0.0, 2 * BLOCK_HALF])
        return float(np.linalg.norm(self.core.pos("block0") - goal))


TASKS: dict[str, type[Task]] = {t.family: t for t in (Reach, Push, PickPlace, Stack)}
