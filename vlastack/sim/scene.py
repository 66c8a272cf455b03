"""The built-in MuJoCo scene: a table, a floating two-finger gripper and a pool of objects.

The gripper is a mocap body moved by end-effector deltas; it has no arm, so a step is a handful
of contact-only physics substeps. Grasping is a weld constraint switched on when the gripper
closes near a block (robust at 10 Hz, unlike finger-contact grasps), and while a block is held its
collisions with the gripper are masked so the weld never fights a contact.

Units are metres; the table top is z = 0; the workspace is ``WORKSPACE`` (x, y ranges). Tasks
(``tasks.py``) place the objects they use and park the rest off the table.
"""

from __future__ import annotations

import numpy as np

from vlastack.sim.camera import pinhole_uv
from vlastack.sim.render import close_at_exit, ensure_gl_backend

ensure_gl_backend()
import mujoco  # noqa: E402  (must come after the GL backend is chosen)

BLOCK_HALF = 0.025  # blocks are 5 cm cubes: about 8 px wide in a 64x64 scene image
BALL_RADIUS = 0.025
CYL_RADIUS, CYL_HALF = 0.022, 0.025
PAD_RADIUS = 0.05
BOWL_INNER, BOWL_WALL_H, BOWL_WALL_T = 0.055, 0.02, 0.008
WORKSPACE = ((-0.16, 0.16), (-0.12, 0.12))
EE_LOW = np.array([-0.22, -0.18, BLOCK_HALF - 0.001])
EE_HIGH = np.array([0.22, 0.18, 0.22])
EE_HOME = np.array([0.0, -0.08, 0.14])
MAX_DELTA = 0.03  # metres per control step for a unit action (0.3 m/s at 10 Hz)
CONTROL_HZ = 10
SUBSTEPS = 20  # 200 Hz physics
FINGER_CLOSED, FINGER_OPEN, FINGER_HOLD = 0.008, 0.045, 0.032
GRASP_TOL_XY, GRASP_TOL_Z = 0.02, 0.02

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.75, 0.15),
    "blue": (0.1, 0.25, 0.95),
    "yellow": (0.95, 0.85, 0.1),
}
NUM_BLOCKS, NUM_BALLS, NUM_CYLS = 3, 2, 2
STATE_DIM = 5  # ee x, y, z, gripper opening (0 closed .. 1 open), holding (0/1)
ACTION_DIM = 4  # dx, dy, dz in [-1, 1] (x MAX_DELTA m), gripper: > 0 closes, <= 0 opens

# Collision bits: the gripper (2) touches free objects but not the table; objects (1) touch all.
_OBJ = 'contype="1" conaffinity="3" condim="3" friction="0.8 0.005 0.0001"'
_EE = 'contype="2" conaffinity="2"'


def _free_body(name: str, geom: str, park: tuple[float, float]) -> str:
    return (
        f'<body name="{name}" pos="{park[0]} {park[1]} 0.03"><freejoint name="{name}"/>'
        f'<geom name="{name}" {geom} {_OBJ} mass="0.05"/></body>'
    )


def build_xml(image_size: int) -> str:
    """MJCF for the scene, with an offscreen buffer of ``image_size`` and no shadows or MSAA."""
    objs = []
    for i in range(NUM_BLOCKS):
        objs.append(
            _free_body(
                f"block{i}", f'type="box" size="{BLOCK_HALF} {BLOCK_HALF} {BLOCK_HALF}"', (2 + 0.2 * i, 2)
            )
        )
    for i in range(NUM_BALLS):
        objs.append(_free_body(f"ball{i}", f'type="sphere" size="{BALL_RADIUS}"', (2 + 0.2 * i, 2.4)))
    for i in range(NUM_CYLS):
        objs.append(
            _free_body(f"cyl{i}", f'type="cylinder" size="{CYL_RADIUS} {CYL_HALF}"', (2 + 0.2 * i, 2.8))
        )
    w, h, t = BOWL_INNER + BOWL_WALL_T, BOWL_WALL_H, BOWL_WALL_T
    walls = "".join(
        f'<geom type="box" pos="{px} {py} {h}" size="{sx} {sy} {h}" rgba=".45 .3 .2 1"/>'
        for px, py, sx, sy in ((w, 0, t, w + t), (-w, 0, t, w + t), (0, w, w + t, t), (0, -w, w + t, t))
    )
    welds = "".join(
        f'<weld name="grasp{i}" body1="ee" body2="block{i}" active="false" solref="0.01 1"/>'
        for i in range(NUM_BLOCKS)
    )
    fh = 0.022  # finger half-height: the grasp point (ee origin) is the fingers' centre
    return f"""
<mujoco model="vlastack_builtin">
  <option timestep="{1.0 / (CONTROL_HZ * SUBSTEPS)}" integrator="implicitfast"/>
  <visual>
    <global offwidth="{image_size}" offheight="{image_size}"/>
    <quality shadowsize="0" offsamples="0"/>
    <headlight ambient=".45 .45 .45" diffuse=".5 .5 .5" specular="0 0 0"/>
  </visual>
  <worldbody>
    <light directional="true" dir="0.2 0.4 -1" diffuse=".4 .4 .4" specular="0 0 0" castshadow="false"/>
    <geom name="table" type="plane" size="0.3 0.24 0.02" rgba=".55 .55 .55 1" contype="1" conaffinity="1"/>
    <camera name="scene" pos="0 -0.3 0.4" xyaxes="1 0 0 0 .805 .594" fovy="45"/>
    <body name="ee" mocap="true" pos="{EE_HOME[0]} {EE_HOME[1]} {EE_HOME[2]}">
      <geom name="palm" type="box" pos="0 0 0.034" size="0.05 0.01 0.006" rgba=".2 .2 .2 1" {_EE}/>
      <geom name="finger_l" type="box" pos="-{FINGER_OPEN} 0 0" size="0.006 0.012 {fh}" rgba=".3 .3 .3 1" {_EE}/>
      <geom name="finger_r" type="box" pos="{FINGER_OPEN} 0 0" size="0.006 0.012 {fh}" rgba=".3 .3 .3 1" {_EE}/>
      <camera name="wrist" pos="0 -0.08 0.03" xyaxes="1 0 0 0 .581 .814" fovy="75"/>
    </body>
    <body name="pad" pos="2 -2 0"><geom name="pad" type="cylinder" size="{PAD_RADIUS} 0.001" pos="0 0 0.001"
      rgba=".95 .95 .95 1" contype="0" conaffinity="0"/></body>
    <body name="bowl" pos="2 -2.5 0"><geom type="box" pos="0 0 0.002" size="{w + t} {w + t} 0.002"
      rgba=".45 .3 .2 1" contype="1" conaffinity="1"/>{walls}</body>
    {"".join(objs)}
  </worldbody>
  <equality>{welds}</equality>
</mujoco>
"""


class SimCore:
    """Physics, gripper control, grasping and rendering. Tasks place objects and judge success.

    ``step(action)``: action float32 [4] = (dx, dy, dz, grip). Each of dx, dy, dz is clipped to
    [-1, 1] and scaled by ``MAX_DELTA``; the target is clipped to the gripper's box
    (``EE_LOW``..``EE_HIGH``). grip > 0 closes the gripper; closing (open -> closed) within
    ``GRASP_TOL_XY``/``GRASP_TOL_Z`` of a block's centre grasps it; opening releases it.
    """

    def __init__(self, image_size: int = 64, cameras: tuple[str, ...] = ("scene", "wrist")):
        self.model = mujoco.MjModel.from_xml_string(build_xml(image_size))
        self.data = mujoco.MjData(self.model)
        self.image_size, self.cameras = image_size, tuple(cameras)
        for c in self.cameras:
            if mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, c) < 0:
                raise ValueError(f"unknown camera {c!r}; the built-in scene has 'scene' and 'wrist'")
        self._renderer = None
        m = self.model
        self._gid = {
            n: mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, n)
            for n in ("finger_l", "finger_r", "pad", *self.object_names())
        }
        self._qadr = {
            n: m.jnt_qposadr[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, n)] for n in self.object_names()
        }
        self._vadr = {
            n: m.jnt_dofadr[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, n)] for n in self.object_names()
        }
        self._bid = {n: mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, n) for n in ("pad", "bowl")}
        self._weld = [
            mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_EQUALITY, f"grasp{i}") for i in range(NUM_BLOCKS)
        ]
        self.held: int | None = None  # index of the held block
        self.closed = False

    @staticmethod
    def object_names() -> list[str]:
        return (
            [f"block{i}" for i in range(NUM_BLOCKS)]
            + [f"ball{i}" for i in range(NUM_BALLS)]
            + [f"cyl{i}" for i in range(NUM_CYLS)]
        )

    # ------------------------------------------------------------------ layout
    def reset(self, ee_pos: np.ndarray = EE_HOME) -> None:
        """Park every object off the table and put the gripper (open, empty) at ``ee_pos``."""
        mujoco.mj_resetData(self.model, self.data)
        self.data.eq_active[:] = 0
        for i, n in enumerate(self.object_names()):
            self.place(n, (2.0 + 0.15 * i, 2.0), 0.0)
            self._set_collide_ee(n, True)
        for n in ("pad", "bowl"):
            self.model.body_pos[self._bid[n]] = (2.0, -2.0 - 0.5 * (n == "bowl"), 0.0)
        self.held, self.closed = None, False
        self.data.mocap_pos[0] = ee_pos
        self._set_fingers()
        mujoco.mj_forward(self.model, self.data)

    def place(self, name: str, xy: tuple[float, float], yaw: float = 0.0) -> None:
        """Put a free object at rest on the table at ``xy`` rotated by ``yaw`` about z."""
        a = self._qadr[name]
        half = (
            BALL_RADIUS if name.startswith("ball") else BLOCK_HALF if name.startswith("block") else CYL_HALF
        )
        self.data.qpos[a : a + 3] = (xy[0], xy[1], half)
        self.data.qpos[a + 3 : a + 7] = (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))
        v = self._vadr[name]
        self.data.qvel[v : v + 6] = 0.0

    def place_fixture(self, name: str, xy: tuple[float, float]) -> None:
        """Move the static ``pad`` or ``bowl``."""
        self.model.body_pos[self._bid[name]] = (xy[0], xy[1], 0.0)

    def set_color(self, name: str, rgb: tuple[float, float, float]) -> None:
        self.model.geom_rgba[self._gid[name]] = (*rgb, 1.0)

    # ------------------------------------------------------------------ state
    @property
    def ee_pos(self) -> np.ndarray:
        return self.data.mocap_pos[0].copy()

    def pos(self, name: str) -> np.ndarray:
        """Centre of a free object, or the origin of ``pad``/``bowl`` (on the table)."""
        if name in self._bid:
            return self.model.body_pos[self._bid[name]].copy()
        a = self._qadr[name]
        return self.data.qpos[a : a + 3].copy()

    def project(self, points: np.ndarray, camera: str) -> np.ndarray:
        """World points [N, 3] (metres) -> where ``camera`` images them: float32 [N, 2] (u, v) as
        fractions of the image width and height (u right, v down; the image is [0, 1]^2). A point
        behind the camera gets (-1, -1). Pinhole model of MuJoCo's camera: it looks along its -z,
        y up, with vertical field of view ``fovy`` (square images)."""
        cid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if cid < 0:
            raise ValueError(f"unknown camera {camera!r}; the built-in scene has 'scene' and 'wrist'")
        pts = np.asarray(points, np.float64).reshape(-1, 3)
        return pinhole_uv(pts, self.data.cam_xpos[cid], self.data.cam_xmat[cid], self.model.cam_fovy[cid])

    def opening(self) -> float:
        """Finger opening in [0, 1] (1 = open)."""
        return float((self._finger_offset() - FINGER_CLOSED) / (FINGER_OPEN - FINGER_CLOSED))

    def state(self) -> np.ndarray:
        """float32 [STATE_DIM]: ee xyz, gripper opening, holding flag."""
        e = self.data.mocap_pos[0]
        return np.array([e[0], e[1], e[2], self.opening(), float(self.held is not None)], np.float32)

    # ------------------------------------------------------------------ control
    def target(self, action: np.ndarray, absolute: bool = False) -> np.ndarray:
        """Where ``step(action, absolute)`` moves the gripper, float64 [3]. ``absolute``:
        ``action[:3]`` is the gripper's target position (metres), approached by at most ``MAX_DELTA``
        per axis this step, as a position-controlled arm with a speed limit does; else it is a delta
        in [-1, 1] x ``MAX_DELTA`` (the default). Clipped to the gripper's box."""
        a = np.asarray(action, dtype=np.float64)
        start = self.data.mocap_pos[0]
        move = (
            np.clip(a[:3] - start, -MAX_DELTA, MAX_DELTA)
            if absolute
            else np.clip(a[:3], -1.0, 1.0) * MAX_DELTA
        )
        return np.clip(start + move, EE_LOW, EE_HIGH)

    def step(self, action: np.ndarray, absolute: bool = False) -> None:
        """One control step toward ``target(action, absolute)``; ``action[3] > 0`` closes."""
        a = np.asarray(action, dtype=np.float64)
        start = self.data.mocap_pos[0].copy()
        target = self.target(a, absolute)
        close = bool(a[3] > 0)
        if close and not self.closed:
            self._try_grasp()
        elif not close and self.held is not None:
            self._release()
        self.closed = close
        self._set_fingers()
        # Interpolate the mocap target across substeps so pushes are smooth, not teleports.
        for k in range(1, SUBSTEPS + 1):
            self.data.mocap_pos[0] = start + (target - start) * (k / SUBSTEPS)
            mujoco.mj_step(self.model, self.data)

    def _finger_offset(self) -> float:
        if self.held is not None:
            return FINGER_HOLD
        return FINGER_CLOSED if self.closed else FINGER_OPEN

    def _set_fingers(self) -> None:
        off = self._finger_offset()
        self.model.geom_pos[self._gid["finger_l"], 0] = -off
        self.model.geom_pos[self._gid["finger_r"], 0] = off

    def _set_collide_ee(self, name: str, on: bool) -> None:
        self.model.geom_conaffinity[self._gid[name]] = 3 if on else 1

    def _try_grasp(self) -> None:
        ee = self.data.mocap_pos[0]
        for i in range(NUM_BLOCKS):
            p = self.pos(f"block{i}")
            if np.linalg.norm(p[:2] - ee[:2]) < GRASP_TOL_XY and abs(p[2] - ee[2]) < GRASP_TOL_Z:
                # Weld at the current relative pose so the block does not jump into the fingers.
                q = self.data.qpos[self._qadr[f"block{i}"] + 3 : self._qadr[f"block{i}"] + 7]
                self.model.eq_data[self._weld[i], 0:3] = 0.0
                self.model.eq_data[self._weld[i], 3:6] = p - ee
                self.model.eq_data[self._weld[i], 6:10] = q
                self.data.eq_active[self._weld[i]] = 1
                self._set_collide_ee(f"block{i}", False)
                self.held = i
                return

    def _release(self) -> None:
        assert self.held is not None
        self.data.eq_active[self._weld[self.held]] = 0
        self._set_collide_ee(f"block{self.held}", True)
        self.held = None

    # ------------------------------------------------------------------ rendering
    def render(self) -> dict[str, np.ndarray]:
        """{camera: uint8 [H, W, 3]} for the configured cameras."""
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, self.image_size, self.image_size)
            close_at_exit(self)  # before MuJoCo's EGL teardown (render.close_at_exit)
        out = {}
        for c in self.cameras:
            self._renderer.update_scene(self.data, camera=c)
            out[c] = self._renderer.render().copy()
        return out

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
