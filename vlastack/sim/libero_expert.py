"""A scripted pick-and-place expert for LIBERO's libero_object tasks ("pick up the X and place it
in the basket") and libero_spatial tasks ("pick up the black bowl ... and place it on the plate"),
from the simulator's state: ``LiberoEnv.expert_action()``.

Measured (``bench/libero_expert.py`` -> ``bench/results/libero_expert.json``) on LIBERO's fixed
initial states and on random placements. An object that fits across the open hand is taken whole; one
wider than the hand every way (a bowl) is taken by its rim: the fingers straddle the wall on the side
with the most room around it, and the hand carries the same offset over the target.

It reads what a policy never sees (object poses, collision geometry) and drives LIBERO's own
controller as a policy does: 7-d relative OSC actions (position delta, axis-angle delta, gripper),
the same actions ``vla data generate`` records. Phases::

    0 above the grasp point, gripper open, turned so that the object fits across the fingers (its
      collision geoms' footprint); a flat object also turned away from its neighbours; for a rim
      grasp, the fingers closing across the wall
    1 down to grasp height (or pressing on for PRESS_STEPS)         2 close          3 lift
    4 above the target              5 down to the release height           6 open (and hold)

Targets come from the task's ``obj_of_interest`` (LIBERO names the object and then the target).
"""

from __future__ import annotations

import numpy as np

POS_GAIN = 10.0  # action per metre of error (an action of 1 is LIBERO's 5 cm step)
YAW_GAIN = 4.0  # action per radian (an action of 1 turns 0.5 rad)
HOVER, LIFT = 0.12, 0.25  # metres above the object (the lift: above its start; tall bottles clear the basket)
CARRY_SPEED = 0.6  # the largest action while an object is held (a faster swing shakes it loose)
GRASP_DZ = 0.0  # the grasp site's height above the object's origin
RELEASE_ABOVE = 0.15  # release this far above the target's origin
CLOSE_STEPS, OPEN_STEPS = 12, 8
PRESS_STEPS = 60  # the longest descent before closing
# Wider than this across the fingers (the Panda opens to 8 cm): turn the hand to the object's
# narrow side. Narrower objects are taken as the hand is (turning costs reach and time).
MAX_WIDTH = 0.07
# The hand's reach along the fingers' axis from the grasp point (its collision box): a turn that
# keeps the object's neighbours outside this is preferred (up to TURN_TRIES radians off).
HAND_HALF_LENGTH = 0.10
TURN_TRIES = (0.0, -0.2, 0.2, -0.35, 0.35)
FLAT = 0.05  # objects lower than this are taken low, among their neighbours: only they may turn
# Rim grasp (objects wider than MAX_WIDTH every way): the fingers this far inside the outer edge and
# this far below the top; RIM_SIDES directions around the object are tried.
RIM_IN, RIM_DEPTH, RIM_SIDES = 0.008, 0.025, 16
FINGER_SPAN, HAND_ABOVE_TIPS = 0.045, 0.07  # the open fingers' reach from the grasp point; the hand's height
ROBOT_BODIES = ("robot", "gripper", "mount")  # name prefixes of the robot's own bodies
PLACE_ABOVE = 0.03  # a rim-held object is let go with its bottom this far above the target's top


def _box_corners(center: np.ndarray, rot: np.ndarray, half: np.ndarray) -> np.ndarray:
    signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], float)
    return center + (signs * half) @ rot.T


def _collides(model, g: int) -> bool:
    """Whether geom ``g`` takes part in contacts (visual-only geoms do not)."""
    return bool(model.geom_contype[g] or model.geom_conaffinity[g])


def _geom_box(model, data, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Geom ``g`` as an oriented box: (centre [3], rotation [3, 3], half extents [3])."""
    size, kind = model.geom_size[g], model.geom_type[g]
    rot = data.geom_xmat[g].reshape(3, 3)
    center = data.geom_xpos[g].copy()
    if kind == 6:  # box
        half = size[:3]
    elif kind == 7:  # mesh: its local bounding box
        center = center + rot @ model.geom_aabb[g][:3]
        half = model.geom_aabb[g][3:]
    elif kind == 5:  # cylinder
        half = np.array([size[0], size[0], size[1]])
    elif kind == 3:  # capsule
        half = np.array([size[0], size[0], size[1] + size[0]])
    else:  # sphere and the rest
        half = np.full(3, size[0])
    return center, rot, np.asarray(half, float)


def footprint(model, data, body_ids: set[int], dims: int = 2) -> np.ndarray:
    """[N, dims] corners (xy, or xyz with ``dims=3``) of the bodies' collision geoms (oriented
    boxes around each)."""
    pts = [np.zeros((1, dims))]
    for g in range(model.ngeom):
        if model.geom_bodyid[g] not in body_ids or not _collides(model, g):
            continue
        pts.append(_box_corners(*_geom_box(model, data, g))[:, :dims])
    return np.concatenate(pts[1:]) if len(pts) > 1 else pts[0]


def width_along(xy: np.ndarray, yaw: float) -> float:
    """The footprint's extent along the horizontal direction ``yaw``."""
    proj = xy @ np.array([np.cos(yaw), np.sin(yaw)])
    return float(proj.max() - proj.min())


def narrow_yaw(xy: np.ndarray) -> float:
    """The yaw of the direction across which the footprint is narrowest (its minor axis)."""
    c = xy - xy.mean(0)
    _, v = np.linalg.eigh(c.T @ c)
    return float(np.arctan2(v[1, 0], v[0, 0]))  # the smallest eigenvalue's vector


def _wrap_half_turn(a: float) -> float:
    """An angle in [-pi/2, pi/2): a parallel gripper is the same turned by half a turn."""
    return (a + np.pi / 2) % np.pi - np.pi / 2


def _quat_xyzw_to_mat(q: np.ndarray) -> np.ndarray:
    x, y, z, w = q
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])  # fmt: skip


class PickPlaceExpert:
    """One episode's expert; ``act(raw)`` maps LIBERO's raw observation to a 7-d action."""

    def __init__(self, env) -> None:
        inner = env._inner  # the LIBERO problem env inside the offscreen renderer
        self.sim = inner.sim
        self.obj, self.target = inner.obj_of_interest[:2]
        model = self.sim.model
        names = [model.body_id2name(i) for i in range(model.nbody)]
        self.obj_bodies = {i for i, n in enumerate(names) if n and n.startswith(self.obj)}
        objects = [k.removesuffix("_pos") for k in inner._get_observations() if k.endswith("_pos")]
        objects = [o for o in objects if not o.startswith("robot") and "_to_" not in o and o != self.obj]
        self.other_bodies = [{i for i, n in enumerate(names) if n and n.startswith(o)} for o in objects]
        self.target_bodies = {i for i, n in enumerate(names) if n and n.startswith(self.target)}
        self.phase, self.count = 0, 0
        self.yaw: float | None = None
        self.lift = 0.0
        # The grasp point relative to the object's origin, and the hand's release point relative
        # to the target's origin (whole grasp: straight above both; rim: set by _rim_grasp).
        self.offset = np.array([0.0, 0.0, GRASP_DZ])
        self.release = np.array([0.0, 0.0, RELEASE_ABOVE])

    def _grasp_yaw(self, raw: dict) -> float:
        """The hand's yaw for the grasp: as it is when the object fits across the fingers, else
        across the object's narrow side; for a flat object (taken low, among its neighbours) then
        the nearby turn (``TURN_TRIES``) that keeps the other objects farthest from the hand's long
        axis, among those the object still fits."""
        m, d = self.sim.model._model, self.sim.data._data
        xyz = footprint(m, d, self.obj_bodies, 3)
        rim = self._rim_grasp(raw, xyz)
        if rim is not None:
            return rim
        xy = xyz[:, :2]
        now = self._closing_yaw(raw["robot0_eef_quat"])
        base = now if width_along(xy, now) <= MAX_WIDTH else narrow_yaw(xy)
        if np.ptp(xyz[:, 2]) > FLAT:  # taken high up: the hand stays above its neighbours
            return base
        others = [footprint(m, d, ids) for ids in self.other_bodies]
        center = xy.mean(0)

        def clearance(yaw: float) -> float:
            u = np.array([np.cos(yaw), np.sin(yaw)])
            best = np.inf
            for pts in others:
                rel = pts - center
                along = np.clip(rel @ u, -HAND_HALF_LENGTH, HAND_HALF_LENGTH)
                best = min(best, float(np.linalg.norm(rel - along[:, None] * u, axis=1).min()))
            return best

        fits = [
            base + t for t in TURN_TRIES if width_along(xy, base + t) <= max(MAX_WIDTH, width_along(xy, base))
        ]
        return max(fits, key=lambda y: (round(clearance(y), 3), -abs(y - base)))

    def _rim_grasp(self, raw: dict, xyz: np.ndarray) -> float | None:
        """For an object wider than the hand every way: the rim point whose open fingers and hand
        keep farthest from every other collision geom above the fingertips (ties: the side nearer
        the hand); sets ``offset`` and ``release`` and returns the closing yaw (across the wall), or
        None when the object fits."""
        xy = xyz[:, :2]
        if width_along(xy, narrow_yaw(xy)) <= MAX_WIDTH:
            return None
        m, d = self.sim.model._model, self.sim.data._data
        obj = np.asarray(raw[f"{self.obj}_pos"], float)
        eef = np.asarray(raw["robot0_eef_pos"], float)
        center = (xy.min(0) + xy.max(0)) / 2
        tip = xyz[:, 2].max() - RIM_DEPTH  # the fingertips' height at the grasp
        # Obstacles: the collision geoms of anything but the robot and the object that rise above
        # the fingertips (a neighbour, the walls of a drawer the object sits in) as oriented boxes;
        # the table and the target lie below them.
        boxes = []
        for g in range(m.ngeom):
            b = int(m.geom_bodyid[g])
            name = self.sim.model.body_id2name(b) or ""
            if b in self.obj_bodies or name.startswith(ROBOT_BODIES) or not _collides(m, g):
                continue
            c, rot, half = _geom_box(m, d, g)
            near = np.linalg.norm(c[:2] - center) < 0.3 + np.linalg.norm(half)
            if near and _box_corners(c, rot, half)[:, 2].max() > tip - 0.01:
                boxes.append((c, rot, half))

        def room(u: np.ndarray, grip: np.ndarray) -> float:
            """The least distance from the open fingers (across u at the fingertips) and the hand
            above them to the obstacles."""
            t = np.linspace(-1, 1, 9)[:, None]
            u3 = np.array([*u, 0.0])
            g3 = np.array([*grip, tip])
            fingers = g3 + t * FINGER_SPAN * u3
            hand = g3 + [0.0, 0.0, HAND_ABOVE_TIPS] + t * HAND_HALF_LENGTH * u3
            pts = np.concatenate([fingers, hand])
            best = 1.0
            for c, rot, half in boxes:
                local = (pts - c) @ rot  # into the box's frame
                best = min(best, float(np.linalg.norm(local - np.clip(local, -half, half), axis=1).min()))
            return best

        options = []
        for a in np.arange(RIM_SIDES) * 2 * np.pi / RIM_SIDES:
            u = np.array([np.cos(a), np.sin(a)])
            grip = center + u * ((xy @ u).max() - center @ u - RIM_IN)
            options.append((round(room(u, grip), 3), float(u @ (eef[:2] - center)), a, grip))
        _, _, yaw, grip = max(options, key=lambda o: (o[0], o[1]))
        # The rim's own top on that side (a bowl resting on something may tilt).
        near = xyz[np.linalg.norm(xy - grip, axis=1) < 0.025]
        top = (near if len(near) else xyz)[:, 2].max()
        self.offset = np.array([grip[0] - obj[0], grip[1] - obj[1], top - RIM_DEPTH - obj[2]])
        # Release with the object's centre over the target's and its bottom PLACE_ABOVE over its top.
        tgt = np.asarray(raw[f"{self.target}_pos"], float)
        t_xyz = footprint(m, d, self.target_bodies, 3) if self.target_bodies else tgt[None]
        t_center = (t_xyz[:, :2].min(0) + t_xyz[:, :2].max(0)) / 2
        grip_above_bottom = top - RIM_DEPTH - xyz[:, 2].min()
        self.release = np.array([
            *(t_center - tgt[:2] + grip - center), t_xyz[:, 2].max() - tgt[2] + PLACE_ABOVE + grip_above_bottom,
        ])  # fmt: skip
        return float(yaw)

    def _closing_yaw(self, eef_quat: np.ndarray) -> float:
        y = _quat_xyzw_to_mat(eef_quat)[:, 1]  # the fingers close along the hand's y axis
        return float(np.arctan2(y[1], y[0]))

    def act(self, raw: dict) -> np.ndarray:
        eef = np.asarray(raw["robot0_eef_pos"], float)
        obj = np.asarray(raw[f"{self.obj}_pos"], float)
        tgt = np.asarray(raw[f"{self.target}_pos"], float)
        if self.yaw is None:
            self.yaw = self._grasp_yaw(raw)
            self.lift = max(obj[2], tgt[2]) + LIFT
        grip, turn = -1.0, 0.0
        p = self.phase
        if p == 0:
            goal = obj + self.offset + np.array([0.0, 0.0, HOVER])
            turn = _wrap_half_turn(self.yaw - self._closing_yaw(raw["robot0_eef_quat"]))
            if np.linalg.norm(goal - eef) < 0.01 and abs(turn) < 0.05:
                self.phase = 1
        elif p == 1:
            goal = obj + self.offset
            self.count += 1
            # Reached, or pressed on for a while: on a tall bottle the hand rests on the cap and
            # slides off it as it presses, until the fingers hold the neck (closing at once, when
            # the hand first stops, missed the salad dressing every time).
            if abs(goal[2] - eef[2]) < 0.008 or self.count > PRESS_STEPS:
                self.phase, self.count = 2, 0
        elif p == 2:
            goal, grip = eef.copy(), 1.0
            self.count += 1
            if self.count >= CLOSE_STEPS:
                self.phase, self.count = 3, 0
        elif p == 3:
            goal, grip = np.array([eef[0], eef[1], self.lift]), 1.0
            if eef[2] > self.lift - 0.02:
                self.phase = 4
        elif p == 4:
            goal, grip = np.array([*(tgt[:2] + self.release[:2]), self.lift]), 1.0
            if np.linalg.norm(goal[:2] - eef[:2]) < 0.015:
                self.phase = 5
        elif p == 5:
            goal, grip = tgt + self.release, 1.0
            self.count += 1
            if eef[2] < goal[2] + 0.02 or self.count > 40:
                self.phase, self.count = 6, 0
        else:
            goal = np.array([*(tgt[:2] + self.release[:2]), eef[2]])
            self.count += 1
            if self.count > OPEN_STEPS:  # opened: back up, out of the way
                goal[2] = self.lift
        top = CARRY_SPEED if p in (3, 4, 5) else 1.0  # holding the object
        move = np.clip((goal - eef) * POS_GAIN, -top, top)
        rot = np.array([0.0, 0.0, np.clip(turn * YAW_GAIN, -1, 1)])
        return np.concatenate([move, rot, [grip]]).astype(np.float32)
