"""Fragile-payload task families: the dynamic reaches (sim/dynamic.py) carrying a full cup, so an
abrupt change of velocity fails the episode.

- ``carry_moving``: ``reach_moving`` (a block on a belt; touch it and stay on it);
- ``carry_switch``: ``reach_switch`` (the color moves to the other block at a random step);
- ``carry``: the static ``reach`` (the control family).

The gripper carries a full cup (not rendered: the instruction says so). Each control step moves
the gripper by a displacement v_t (its velocity, metres per step); if ``|v_t - v_{t-1}|`` (its
acceleration, metres per step squared) exceeds ``SPILL_ACCEL`` the cup spills and the episode ends
as a failure. This is the constraint a position-controlled arm carrying liquid, a tray or a
loosely held part lives with. It makes what asynchronous execution does at a chunk boundary
matter: a new chunk that disagrees with the motion in progress changes the velocity at once.
On the plain dynamic reaches a boundary jump only changes where the arm heads (its speed is
capped at ``MAX_DELTA``), so it never fails an episode (docs/rtc.md).

The experts are the dynamic ones, acceleration-limited: they steer toward the same aim point
with at most ``EXPERT_ACCEL`` (a third of ``SPILL_ACCEL``) of velocity change per step, and brake
so they can stop at the target. Like the other experts they read privileged state. The state the
policy sees gains the gripper's velocity (``extra_state``), so these families cannot share a
dataset with the 5-dim ones.
"""

from __future__ import annotations

import numpy as np

from vlastack.sim.dynamic import BELT_SPEED, ReachMoving, ReachSwitch
from vlastack.sim.scene import MAX_DELTA
from vlastack.sim.tasks import HOVER_Z, Reach

SPILL_ACCEL = 0.018  # metres per step^2: 1.8 m/s^2 at 10 Hz; above it the cup spills
EXPERT_ACCEL = 0.006  # the experts' limit: a third of the spill threshold
MAX_SPEED = 0.9 * MAX_DELTA  # the experts stay under the arm's per-axis cap in every direction
PHRASINGS = (
    "carry cup to {c} block",
    "bring cup to {c} block",
    "take cup to the {c} block",
    "cup to the {c} block",
)
# The state the policy sees: the robot's (sim/scene.py) + the gripper's velocity (metres per step).
# Without it a chunk cannot know how fast the arm already moves: the first policy trained on
# these tasks commanded ~1.9 cm from rest, where the expert starts at 0.8 cm, and spilled at once.


def _clip_norm(v: np.ndarray, n: float) -> np.ndarray:
    m = float(np.linalg.norm(v))
    return v if m <= n else v * (n / m)


def smooth_reach_action(ee: np.ndarray, vel: np.ndarray, top: np.ndarray, goal_vel: np.ndarray) -> np.ndarray:
    """Expert step (delta action float32 [4]) to touch the top ``top`` [3] of an object moving at
    ``goal_vel`` [3] per step, from the gripper at ``ee`` [3] moving at ``vel`` [3] per step: the
    velocity that still lets it stop at the aim point (v^2 <= 2 a d), changed by at most
    ``EXPERT_ACCEL``. It hovers at ``HOVER_Z`` until within 4 cm of the target in xy."""
    far = np.linalg.norm(ee[:2] - (top[:2] + goal_vel[:2])) > 0.04
    aim = np.array([top[0], top[1], HOVER_Z if far else top[2] + 0.015]) + goal_vel
    e = aim - ee
    dist = float(np.linalg.norm(e))
    speed = min(MAX_SPEED, np.sqrt(2 * EXPERT_ACCEL * dist), dist)
    want = goal_vel + (e / dist * speed if dist > 1e-9 else 0.0)
    v = _clip_norm(vel + _clip_norm(_clip_norm(want, MAX_SPEED) - vel, EXPERT_ACCEL), MAX_SPEED)
    return np.array([*(v / MAX_DELTA), -1.0], np.float32)


class _Cup:
    """The cup's bookkeeping, mixed in before a reach family (``class C(_Cup, Reach)``): velocity,
    acceleration, spill; the family's layout, instruction and success test otherwise."""

    max_steps = 40  # the accelerations limit makes the experts slower than the plain reaches
    extra_state_dim = 3

    def extra_state(self) -> np.ndarray:
        return self.vel.astype(np.float32)

    def reset(self, rng: np.random.Generator) -> str:
        prompt = super().reset(rng)  # the reach family's layout and instruction
        self.last_ee = self.core.ee_pos.copy()
        self.vel = np.zeros(3)
        self.peak_accel = 0.0  # the largest |v_t - v_{t-1}| so far
        self.spilled = False
        return prompt

    def success(self) -> bool:
        return not self.spilled and super().success()

    def after_step(self) -> None:
        ee = self.core.ee_pos.copy()
        v = ee - self.last_ee
        acc = float(np.linalg.norm(v - self.vel))
        self.peak_accel = max(self.peak_accel, acc)
        self.spilled = self.spilled or acc > SPILL_ACCEL
        self.vel, self.last_ee = v, ee

    def failed(self) -> bool:
        return self.spilled

    def step_info(self) -> dict:
        return {"spilled": self.spilled, "peak_accel": self.peak_accel}


class CarryMoving(_Cup, ReachMoving):
    family = "carry_moving"
    phrasings = PHRASINGS

    def expert(self) -> np.ndarray:
        return smooth_reach_action(self.core.ee_pos, self.vel, self._top(), np.array([BELT_SPEED, 0.0, 0.0]))


class CarrySwitch(_Cup, ReachSwitch):
    family = "carry_switch"
    phrasings = PHRASINGS

    def expert(self) -> np.ndarray:
        return smooth_reach_action(self.core.ee_pos, self.vel, self._top(), np.zeros(3))


class Carry(_Cup, Reach):
    """The static ``reach`` carrying the cup (the control family of the fragile set)."""

    family = "carry"
    phrasings = (
        "carry cup to {c} {s}",
        "bring cup to {c} {s}",
        "take cup to the {c} {s}",
        "cup to the {c} {s}",
    )

    def expert(self) -> np.ndarray:
        return smooth_reach_action(self.core.ee_pos, self.vel, self._top(), np.zeros(3))


FRAGILE_TASKS = {t.family: t for t in (CarryMoving, CarrySwitch, Carry)}
