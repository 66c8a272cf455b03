"""Record (or compare) the first N training losses of the demo recipe: seeded, CPU, fp32.

    python scripts/demo_losses.py record /tmp/losses.json [--steps 200]
    python scripts/demo_losses.py compare /tmp/losses.json
    python scripts/demo_losses.py record /tmp/quick.json --quick   # seconds: synthetic batches

Refactors of the training loop, data path, model or demo recipe must leave these bit-identical.
The full check trains the demo recipe on a small expert dataset (40 episodes, generated once under
``--data``). ``--quick`` takes 30 single-thread ``train_step``s (``--steps``) on synthetic batches
for three configs: the demo (grounding), plain pi0 and the token head.

Compare with ``--eager`` across trees: the demo recipe compiles, and compiled losses are not
bit-reproducible across Inductor cache states (the same tree, fresh cache vs warm cache: 6 of the
first 30 losses differ in the last bit, measured 2026-11-26), so a compiled comparison can differ
with no code change.
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


def demo_losses(data: Path, steps: int, threads: int = 2, eager: bool = False) -> list[float]:
    try:
        from vlastack.apps.demo import DATA_NOISE, VIDEO_QUALITY, demo_config
    except ImportError:  # before vlastack/apps existed
        from vlastack.train.demo import DATA_NOISE, VIDEO_QUALITY, demo_config
    from vlastack.sim.generate import generate
    from vlastack.train.trainer import Trainer

    overrides = ["train.precision=fp32", "train.steps=3400", "train.log_every=1000"]
    overrides += ["train.compile=false"] if eager else []
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


QUICK_VARIANTS = {
    "demo": [],
    "plain": ["model.grounding.attend_weight=0", "model.grounding.points=0"],
    "tokens": ["model.grounding.attend_weight=0", "model.grounding.points=0", "model.head=tokens"],
}


def quick_losses(steps: int) -> dict[str, list[float]]:
    from vlastack.apps.demo import demo_config
    from vlastack.batch import dummy_batch
    from vlastack.models import build_model
    from vlastack.train.optim import build_optimizer
    from vlastack.train.step import train_step

    torch.set_num_threads(1)
    res = {}
    for name, over in QUICK_VARIANTS.items():
        cfg = demo_config("tiny", None, ["train.precision=fp32", *over])
        torch.manual_seed(0)
        m = build_model(cfg.model)
        batches = [dummy_batch(cfg.model, 8, seed=s) for s in range(3)]
        m.head.prepare([{k: v[i] for k, v in b.items()} for b in batches for i in range(8)])
        opt = build_optimizer(m, cfg.train)
        torch.manual_seed(1)
        res[name] = [
            train_step(
                m,
                opt,
                [batches[i % 3]],
                device_type="cpu",
                precision="fp32",
                scaler=None,
                grad_clip=cfg.train.grad_clip,
            ).loss
            for i in range(steps)
        ]
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["record", "compare"])
    ap.add_argument("path")
    ap.add_argument("--steps", type=int, default=None, help="200 (30 with --quick)")
    ap.add_argument("--data", default="/tmp/demo_losses_data")
    ap.add_argument("--threads", type=int, default=2, help="the demo's 2; 1 on a crowded machine")
    ap.add_argument("--quick", action="store_true", help="synthetic batches, three configs (seconds)")
    ap.add_argument("--eager", action="store_true", help="train.compile=false (reproducible across caches)")
    args = ap.parse_args()
    if args.quick:
        runs = quick_losses(args.steps or 30)
        losses = [x for name in QUICK_VARIANTS for x in runs[name]]
        args.steps = len(losses)
    else:
        args.steps = args.steps or 200
        losses = demo_losses(Path(args.data), args.steps, args.threads, args.eager)
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
