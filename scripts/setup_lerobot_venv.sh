#!/usr/bin/env bash
# The LeRobot 0.6.1 venv that the comparisons run in, OUTSIDE the project (LeRobot needs Python 3.12
# and pins torch<2.12; torch 2.13.0 is installed first and LeRobot without its deps, as
# docs/lerobot.md says). It covers every LeRobot-side script: the parity fixtures
# (scripts/make_lerobot_fixtures.py: transformers), the Meta-World comparison
# (bench/lerobot_metaworld.py: lerobot-train and lerobot-eval with ACT and Diffusion Policy, which
# need LeRobot's extras training, diffusion and metaworld) and the environment checks
# (scripts/check_metaworld_lerobot.py). Meta-World is LeRobot's pin (3.0.0); MuJoCo is ours (3.3.0:
# docs/metaworld.md found LeRobot's and our environments pixel-identical on it).
#
#   bash scripts/setup_lerobot_venv.sh [VENV]        # default /work/lrvenv; safe to re-run
set -euo pipefail
VENV=${1:-/work/lrvenv}
# A pyenv shim named python3.12 exists even where pyenv's global version is another, and fails when
# run: take the first candidate that actually starts.
if [ -z "${PY312:-}" ]; then
    for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python; do
        if "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then PY312=$c; break; fi
    done
fi
[ -n "${PY312:-}" ] || { echo "no Python 3.12 found: set PY312=/path/to/python3.12" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PY312" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet)
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" --no-deps lerobot==0.6.1 torchvision==0.28.0
"${PIP[@]}" "numpy>=2,<2.3" "Pillow>=10,<13" "einops>=0.8,<0.9" "draccus>=0.11.6,<0.12" \
    "huggingface-hub>=1.6,<2" requests "safetensors>=0.4.3,<1" "packaging>=24.2,<26" termcolor tqdm \
    "gymnasium>=1.1.1,<2" "opencv-python-headless<4.14" "transformers>=5.4,<5.6" sentencepiece protobuf \
    "av>=15,<16" "datasets>=4.8,<5" "pandas>=2,<3" "pyarrow>=21,<30" "jsonlines>=4,<5" scipy \
    "accelerate==1.15.0" "diffusers>=0.38,<0.40" "metaworld==3.0.0" "mujoco==3.3.0" \
    "websockets>=13" "msgpack>=1"  # scripts/lerobot_policy_server.py: vla eval drives LeRobot policies
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m
print("LeRobot venv:", ", ".join(f"{p} {m.version(p)}" for p in
      ("lerobot", "torch", "torchvision", "metaworld", "mujoco", "accelerate", "diffusers", "draccus",
       "datasets", "av")))
PY
