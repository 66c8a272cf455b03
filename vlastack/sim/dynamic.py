"""Dynamic task families: the target moves or changes while the robot acts, so timing matters.

- ``reach_moving``: touch a block that a belt carries along +x at ``BELT_SPEED`` (1 cm per step,
  a third of the gripper's top speed) and stay on it for ``HOLD_STEPS`` steps;
- ``reach_switch``: touch the colored block of two (the other is ``DIM``); at a random step in
  [``SWITCH_STEPS``) the color moves to the other block, so the policy must notice and turn.

They are not in the default ``builtin`` suite (the demo's data and results stay as they were):
name them (``eval.tasks=[reach_moving]``) or use the ``dynamic`` suite. Objects move in
``advance``, which the env calls before each control step; the block is placed kinematically
(teleported, at rest) and does not collide with the gripper, so the belt never jams. The
experts lead the moving target by its velocity (privileged), stateless like the static ones.
"""

from __future__ import annotations

import numpy as np

from vlastack.sim.scene import BLOCK_HALF, COLORS, MAX_DELTA
from vlastack.sim.tasks import COLOR_NAMES, HOVER_Z, Task, _toward, sample_xy

BELT_SPEED = 0.01  # metres per control step along +x (10 cm/s at 10 Hz)
DIM = (0.55, 0.35, 0.75)  # the uncolored block in reach_switch: a color no instruction names
SWITCH_STEPS = (3, 9)  # reach_switch: the color moves at a step in [3, 9)
HOLD_STEPS = 4  # reach_moving: consecutive steps on the moving block


def _reach_action(ee: np.ndarray, top: np.ndarray, vel: np.ndarray) -> np.ndarray:
    """Expert step to touch the top ``top`` [3] of an object moving at ``vel`` [3] per step: aim
    where it will be when the gripper arrives, descend once within 3 cm of its next position."""
    lead = top + vel * (np.linalg.norm(ee[:2] - top[:2]) / MAX_DELTA + 1)
    far = np.linalg.norm(ee[:2] - (top[:2] + vel[:2])) > 0.03
    return _toward(ee, np.array([lead[0], lead[1], HOVER_Z if far else top[2] + 0.015]), -1.0)


def _touching(ee: np.ndarray, top: np.ndarray) -> bool:
    return bool(np.linalg.norm(ee[:2] - top[:2]) < 0.03 and ee[2] < top[2] + 0.035)


class ReachMoving(Task):
    family = "reach_moving"
    max_steps = 30
    phrasings = ("touch the {c} block", "reach the {c} block", "catch the {c} block", "go to the {c} block")

    def reset(self, rng: np.random.Generator) -> str:
        self.xy = np.array([rng.uniform(-0.17, -0.05), rng.uniform(-0.10, 0.10)])
        self.yaw = float(rng.uniform(-0.5, 0.5))
        colors = self._blocks(rng, 1, [self.xy])
        self.core._set_collide_ee("block0", False)  # carried by the belt: never pushed or jammed
        self.held_for = 0  # consecutive steps on the block before the current one
        return self._phrase(rng, c=colors[0])

    def advance(self) -> None:
        self.held_for = self.held_for + 1 if self.success_now() else 0
        self.xy = self.xy + np.array([BELT_SPEED, 0.0])
        self.core.place("block0", tuple(self.xy), self.yaw)

    def _top(self) -> np.ndarray:
        return np.array([self.xy[0], self.xy[1], 2 * BLOCK_HALF])

    def success_now(self) -> bool:
        return _touching(self.core.ee_pos, self._top())

    def success(self) -> bool:
        return self.success_now() and self.held_for >= HOLD_STEPS - 1

    def expert(self) -> np.ndarray:
        return _reach_action(self.core.ee_pos, self._top(), np.array([BELT_SPEED, 0.0, 0.0]))

    def key_positions(self) -> tuple[np.ndarray, np.ndarray]:
        return self._top(), self._top()

    def distance(self) -> float:
        return float(np.linalg.norm(self.core.ee_pos - self._top()))


class ReachSwitch(Task):
    family = "reach_switch"
    max_steps = 30
    phrasings = ("touch the {c} block", "reach the {c} block", "go to the {c} block", "touch the {c} one")

    def reset(self, rng: np.random.Generator) -> str:
        xy = sample_xy(rng, 2, 0.14)
        self.color = COLORS[str(rng.choice(COLOR_NAMES))]
        name = next(k for k, v in COLORS.items() if v == self.color)
        for i in range(2):
            self.core.place(f"block{i}", tuple(xy[i]), rng.uniform(-0.5, 0.5))
        self.target, self.t = 0, 0
        self.switch_at = int(rng.integers(*SWITCH_STEPS))
        self._paint()
        return self._phrase(rng, c=name)

    def _paint(self) -> None:
        self.core.set_color(f"block{self.target}", self.color)
        self.core.set_color(f"block{1 - self.target}", DIM)

    def advance(self) -> None:
        self.t += 1
        if self.t == self.switch_at:
            self.target = 1 - self.target
            self._paint()

    def _top(self) -> np.ndarray:
        p = self.core.pos(f"block{self.target}")
        return np.array([p[0], p[1], 2 * BLOCK_HALF])

    def success(self) -> bool:
        return self.t >= self.switch_at and _touching(self.core.ee_pos, self._top())

    def expert(self) -> np.ndarray:
        return _reach_action(self.core.ee_pos, self._top(), np.zeros(3))

    def key_positions(self) -> tuple[np.ndarray, np.ndarray]:
        return self._top(), self._top()

    def distance(self) -> float:
        return float(np.linalg.norm(self.core.ee_pos - self._top()))


DYNAMIC_TASKS: dict[str, type[Task]] = {t.family: t for t in (ReachMoving, ReachSwitch)}
