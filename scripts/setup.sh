#!/usr/bin/env bash
# Creates .venv, installs torch first (the pinned CPU build when none is present, so pip
# never resolves a bare `torch` to a multi-GB CUDA wheel), then the package with dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."
# PYTHON picks the interpreter (python3.11 by default; 3.12 and 3.13 work too: `make test-py312`),
# VENV the folder. A pyenv shim that exists but is not active is skipped for pyenv's own copy.
PY=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
runs() { "$1" -c "pass" >/dev/null 2>&1; }
if ! runs "$PY"; then
  for cand in "$(pyenv root 2>/dev/null)"/versions/"${PY#python}"*/bin/"$PY"; do
    runs "$cand" && PY=$cand && break
  done
fi
if ! runs "$PY"; then
  [ -n "${PYTHON:-}" ] && { echo "error: PYTHON=$PYTHON not found" >&2; exit 1; }
  PY=python3
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  # The CPU build is a local wheel for Python 3.11 only; elsewhere pip takes PyPI's (CUDA) build,
  # which runs on a CPU as well.
  "$VENV/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
"$VENV/bin/python" -m pip install -q -e ".[dev]"
# Python >= 3.13: openpi-client 0.1.2 pins numpy<2, its dependency dm-tree needs numpy>=2.1 there, so
# pip cannot resolve it; installed without its own pins, with the rest of what it needs.
if ! "$VENV/bin/python" -c "import openpi_client" >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip install -q --no-deps "openpi-client>=0.1.2"
  "$VENV/bin/python" -m pip install -q "dm-tree>=0.1.9" "msgpack>=1.0.5" "pillow>=9" "websockets>=11"
fi
# LIBERO (vla eval --suite libero_*): ~700 MB download, ~1.2 GB installed. VLASTACK_NO_LIBERO=1 skips
# it; without it the LIBERO tests skip and `vla eval --suite libero_*` says how to install it.
if [ -z "${VLASTACK_NO_LIBERO:-}" ] && ! "$VENV/bin/python" -c "import libero.libero" >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip install -q -e ".[dev,libero]" || echo "warning: could not install the LIBERO extra; its tests will skip"
fi
# Headless MuJoCo rendering needs an OpenGL backend; OSMesa works on any CPU-only Linux box.
if ! "$VENV/bin/python" -c "import ctypes.util,sys; sys.exit(0 if ctypes.util.find_library('OSMesa') else 1)"; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq libosmesa6 libegl1 libgl1 >/dev/null) || echo "warning: could not install libosmesa6; set MUJOCO_GL=egl"
  fi
fi
