"""Record the first N training losses of the demo recipe (seeded, CPU, fp32) for bit-identity checks.

    python scripts/record_demo_losses.py --data /tmp/demo_data --out losses.json [--steps 200]

Generates a small expert dataset (if ``--data`` does not exist), then trains the ``tiny`` preset with
the demo recipe at ``train.precision=fp32`` and writes the per-step losses (exact floats, repr) to JSON.
Extra variants (``--variant plain`` = no grounding, ``tokens`` = the token head) guard the other paths.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch

VARIANTS = {
    "demo": [],
    "plain": ["model.grounding.attend_weight=0", "model.grounding.points=0"],
    "tokens": ["model.grounding.attend_weight=0", "model.grounding.points=0", "model.head=tokens"],
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/tmp/demo_losses_data")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--variants", default="demo")
    a = p.parse_args()
    try:
        from vlastack.apps.demo import demo_config
    except ImportError:
        from vlastack.train.demo import demo_config
    from vlastack.sim.generate import generate
    from vlastack.train.trainer import Trainer

    torch.set_num_threads(2)
    data = Path(a.data)
    if not (data / "meta" / "info.json").exists():
        generate(data, episodes=a.episodes, workers=1, image_size=64, noise=0.1, seed=0, overwrite=True,
                 video_quality="lossless")  # fmt: skip
    res = {}
    for v in a.variants.split(","):
        over = [f"train.steps={a.steps}", "train.precision=fp32", "train.save_every=100000",
                "train.log_every=100000", "data.num_workers=0", *VARIANTS[v]]  # fmt: skip
        cfg = demo_config("tiny", None, over)
        run = Path(tempfile.mkdtemp())
        try:
            s = Trainer(cfg, data_path=data, run_dir=run, verbose=False).fit()
        finally:
            shutil.rmtree(run, ignore_errors=True)
        res[v] = [repr(x) for x in s["losses"]]
        print(v, s["losses"][:3], s["losses"][-1], flush=True)
        Path(a.out).write_text(json.dumps({"steps": a.steps, "losses": res}, indent=1))  # after each


if __name__ == "__main__":
    main()
