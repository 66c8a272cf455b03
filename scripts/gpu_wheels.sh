#!/usr/bin/env bash
# Wheels for the LeRobot side-by-side on a GPU machine with no package registry (bench/latency_gpu.py
# --lerobot). Run here, where PyPI is reachable:   bash scripts/gpu_wheels.sh   -> .gpu_wheels/ (ignored)
#
# lerobot 0.6.1 with --no-deps plus only what `from lerobot.policies.pi0.modeling_pi0 import PI0Policy`
# (and pi05) imports that the GPU image (torch 2.11, python 3.12, docs: .library/device/KINDS.md)
# lacks or holds at a version LeRobot cannot use: transformers 5.5.x (LeRobot 0.6.1 needs >=5.4,<5.6;
# the image has 5.17), tokenizers 0.22 (transformers 5.5 checks <=0.23.0 at import; the image has
# 0.23.2), draccus and its mergedeep/toml, gymnasium and farama-notifications, termcolor. Everything
# else it imports (numpy, huggingface_hub, safetensors, einops, opencv, pillow, scipy, requests, ...)
# is in the image. The set is checked by installing it with --no-index into a fresh venv beside a
# CPU torch (see docs/gpu.md); it must stay well under the 64 MiB a device call carries.
# websockets and openpi-client: `vla serve` and the real openpi client for --parts serve (the image has
# neither; bench/latency_gpu.py installs just those two for its own process).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.gpu_wheels
PY=${PY:-/work/main/.venv/bin/python}
mkdir -p "$DEST"
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLAT[@]}" -d "$DEST" \
  lerobot==0.6.1 transformers==5.5.4 tokenizers==0.22.2 draccus==0.11.6 mergedeep==1.3.4 toml==0.10.2 \
  gymnasium==1.4.0 farama-notifications==0.0.6 termcolor==3.3.0 websockets==17.4 openpi-client==0.1.2
ls -l "$DEST"
du -sh "$DEST"
