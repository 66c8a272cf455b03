"""Headless OpenGL backend selection for MuJoCo rendering.

MuJoCo reads ``MUJOCO_GL`` once, when ``mujoco`` is first imported, so every sim module calls
:func:`ensure_gl_backend` before ``import mujoco``. When the user has not set ``MUJOCO_GL`` we probe
EGL, then OSMesa, each in a fresh subprocess (a failed GL init can leave the current process in a
bad state), and export the first that renders. Worker processes inherit the choice through the
environment, so the probe runs once per process tree.

Triton is loaded before the renderer: Mesa's renderers (llvmpipe, under EGL or OSMesa) load their own
LLVM, and Triton's library loaded after it segfaults the process. That happens to anyone with a CUDA
torch wheel (which ships Triton; PyPI's default on Linux) who renders on a CPU and then touches
``torch._dynamo`` (``torch.compile``, or torch importing it lazily): seen with torch 2.13.0+cu130 and
Python 3.12, a LIBERO env and then a model built. Loaded the other way round, both work.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

_PROBE = (
    "import mujoco, numpy as np\n"
    'm = mujoco.MjModel.from_xml_string(\'<mujoco><worldbody><light pos="0 0 1"/>'
    '<geom type="sphere" size=".1" rgba="1 0 0 1"/></worldbody></mujoco>\')\n'
    "d = mujoco.MjData(m); mujoco.mj_forward(m, d)\n"
    "r = mujoco.Renderer(m, 16, 16); r.update_scene(d); img = r.render(); r.close()\n"
    "assert img.max() > 0\n"
)
BACKENDS = ("egl", "osmesa")


def probe_backend(name: str, timeout_s: float = 60.0) -> bool:
    """True if MuJoCo renders a frame with ``MUJOCO_GL=name`` in a fresh Python process."""
    env = dict(os.environ, MUJOCO_GL=name, PYOPENGL_PLATFORM=name)
    try:
        res = subprocess.run(
            [sys.executable, "-c", _PROBE], env=env, capture_output=True, timeout=timeout_s, check=False
        )
    except (subprocess.TimeoutExpired, OSError):
        return False
    return res.returncode == 0


def ensure_gl_backend() -> str:
    """Set ``MUJOCO_GL`` (egl, else osmesa) if unset; returns the backend in use.

    Also defaults llvmpipe (Mesa's CPU rasterizer) to render on the calling thread: for 64-224 px
    frames its worker threads cost more than they save, and evaluation already runs one process
    per core.
    """
    os.environ.setdefault("LP_NUM_THREADS", "0")
    if "triton" not in sys.modules and importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401  (before Mesa's LLVM: module docstring)
    chosen = os.environ.get("MUJOCO_GL", "").strip().lower()
    if chosen:
        return chosen
    if "mujoco" in sys.modules:
        # Too late to change it for this process; MuJoCo already picked its default.
        return ""
    for name in BACKENDS:
        if probe_backend(name):
            os.environ["MUJOCO_GL"] = name
            os.environ.setdefault("PYOPENGL_PLATFORM", name)
            return name
    raise RuntimeError(
        "no headless OpenGL backend works: tried MUJOCO_GL=egl and MUJOCO_GL=osmesa. "
        "Install one, e.g. `apt-get install -y libosmesa6` (scripts/setup.sh does this), or "
        "`apt-get install -y libegl1`, then retry."
    )


def close_at_exit(owner: object) -> None:
    """Close ``owner`` (an env holding a MuJoCo renderer) at interpreter exit, before MuJoCo's EGL
    display goes. Call it right after creating the renderer: the first renderer registers MuJoCo's
    own ``eglTerminate`` exit hook, and exit hooks run last-registered first, so this one runs
    before it. Otherwise the renderer is freed after the display is gone and Python prints
    ``EGLError`` tracebacks after a successful run. Holds ``owner`` weakly: a closed or collected
    env costs nothing at exit."""
    import atexit
    import contextlib
    import weakref

    ref = weakref.ref(owner)

    def close() -> None:
        obj = ref()
        if obj is not None:
            with contextlib.suppress(Exception):  # at exit, a failed free prints nothing
                obj.close()

    atexit.register(close)
