"""Replays ``tests/fixtures/libero_lerobot/long.npz`` in vlastack's LIBERO env; prints JSON.

Run as a script by ``test_libero.py`` in a fresh process, because the OpenBLAS kernels the fixture was
recorded with (``OPENBLAS_CORETYPE``, read when OpenBLAS loads) must be set before numpy is imported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from vlastack.sim.env import make_env


def main(fixture: Path) -> None:
    meta = json.loads((fixture / "long_meta.json").read_text())
    fx = np.load(fixture / "long.npz")
    c = meta["case"]
    env = make_env(f"{c['suite']}/{c['task_id']}", suite=c["suite"], image_size=meta["image_size"])
    errors, successes, images = [], [], {}
    try:
        env.reset(seed=c["seed"])
        for t, a in enumerate(fx["actions"]):
            obs, _, _, _, info = env.step(a)
            errors.append(float(np.abs(obs["state"] - fx["states"][t]).max()))
            successes.append(bool(info["success"]))
            if t in meta["image_steps"]:
                images[t] = [
                    int(np.abs(obs["images"][k].astype(np.int16) - fx[f"{k}/{t}"]).max())
                    for k in ("image", "image2")
                ]
    finally:
        env.close()
    print(json.dumps({"errors": errors, "successes": successes, "images": images}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
