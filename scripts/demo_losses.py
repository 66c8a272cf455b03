"""Record (or compare) the first N training losses of the demo recipe: seeded, CPU, fp32.

    python scripts/demo_losses.py record /tmp/losses.json [--steps 200]
    python scripts/demo_losses.py compare /tmp/losses.json

Refactors of the training loop, data path or demo recipe must leave these bit-identical. The
dataset is a small expert dataset (40 episodes) generated once under ``--data``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def demo_losses(data: Path, steps: int, threads: int = 2) -> list[float]:
    try:
        from vlastack.apps.demo import DATA_NOISE, VIDEO_QUALITY, demo_config
    except ImportError:  # before vlastack/apps existed
        from vlastack.train.demo import DATA_NOISE, VIDEO_QUALITY, demo_config
    from vlastack.sim.generate import generate
    from vlastack.train.trainer import Trainer

    overrides = ["train.precision=fp32", "train.steps=3400", "train.log_every=1000"]
    cfg = demo_config("tiny", None, [*overrides, f"train.num_threads={threads}"])
    if not (data / "meta" / "info.json").exists():
        generate(
            data, suite=cfg.eval.suite, episodes=40, workers=2, image_size=cfg.model.vision.image_size,
            cameras=cfg.model.camera_names, noise=DATA_NOISE, seed=0, overwrite=True,
            video_quality=VIDEO_QUALITY,
        )  # fmt: skip
    torch.set_num_threads(threads)
    run = Path(tempfile.mkdtemp(prefix="demo_losses_"))
    try:
        summary = Trainer(cfg, data_path=data, run_dir=run, verbose=False).fit(stop_after=steps)
    finally:
        shutil.rmtree(run, ignore_errors=True)
    return [float(x) for x in summary["losses"]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["record", "compare"])
    ap.add_argument("path")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--data", default="/tmp/demo_losses_data")
    ap.add_argument("--threads", type=int, default=2, help="the demo's 2; 1 on a crowded machine")
    args = ap.parse_args()
    losses = demo_losses(Path(args.data), args.steps, args.threads)
    if args.mode == "record":
        Path(args.path).write_text(json.dumps({"steps": args.steps, "losses": losses}))
        print(f"recorded {len(losses)} losses, last {losses[-1]!r} -> {args.path}")
        return 0
    ref = json.loads(Path(args.path).read_text())["losses"]
    diff = [i for i, (a, b) in enumerate(zip(ref, losses)) if a != b]
    if diff or len(ref) != len(losses):
        print(f"DIFFER: first at step {diff[0] + 1 if diff else '-'}; {len(diff)} of {len(ref)} differ")
        return 1
    print(f"bit-identical: {len(losses)} losses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
