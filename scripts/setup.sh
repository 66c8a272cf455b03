#!/usr/bin/env bash
# Creates .venv, installs torch first (the pinned CPU build when none is present, so pip
# never resolves a bare `torch` to a multi-GB CUDA wheel), then the package with dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[dev]"
# LIBERO (vla eval --suite libero_*): ~700 MB download, ~1.2 GB installed. VLASTACK_NO_LIBERO=1 skips
# it; without it the LIBERO tests skip and `vla eval --suite libero_*` says how to install it.
if [ -z "${VLASTACK_NO_LIBERO:-}" ] && ! .venv/bin/python -c "import libero.libero" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q -e ".[dev,libero]" || echo "warning: could not install the LIBERO extra; its tests will skip"
fi
# Headless MuJoCo rendering needs an OpenGL backend; OSMesa works on any CPU-only Linux box.
if ! .venv/bin/python -c "import ctypes.util,sys; sys.exit(0 if ctypes.util.find_library('OSMesa') else 1)"; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq libosmesa6 libegl1 libgl1 >/dev/null) || echo "warning: could not install libosmesa6; set MUJOCO_GL=egl"
  fi
fi
