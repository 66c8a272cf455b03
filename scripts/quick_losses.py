"""Bit-identity guard for refactors: 30 fp32 training steps (``train.step.train_step``, the demo
recipe on the tiny preset, synthetic batches) for the demo (grounding), plain pi0 and token-head
configs; losses written exactly (repr).

    PYTHONPATH=$PWD python scripts/quick_losses.py out.json [steps]   # on two trees, then cmp
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from vlastack.batch import dummy_batch
from vlastack.models import build_model
from vlastack.train.optim import build_optimizer
from vlastack.train.step import train_step

VARIANTS = {
    "demo": [],
    "plain": ["model.grounding.attend_weight=0", "model.grounding.points=0"],
    "tokens": ["model.grounding.attend_weight=0", "model.grounding.points=0", "model.head=tokens"],
}


def main(out: str, steps: int = 30) -> None:
    try:
        from vlastack.apps.demo import demo_config
    except ImportError:
        from vlastack.train.demo import demo_config
    torch.set_num_threads(1)
    res = {}
    for name, over in VARIANTS.items():
        cfg = demo_config("tiny", None, ["train.precision=fp32", *over])
        torch.manual_seed(0)
        m = build_model(cfg.model)
        batches = [dummy_batch(cfg.model, 8, seed=s) for s in range(3)]
        if cfg.model.head == "tokens":
            m.head.fit_tokenizer_from_batches(batches)
        opt = build_optimizer(m, cfg.train)
        torch.manual_seed(1)
        losses = []
        for i in range(steps):
            r = train_step(m, opt, [batches[i % 3]], device_type="cpu", precision="fp32", scaler=None,
                           grad_clip=cfg.train.grad_clip)  # fmt: skip
            losses.append(repr(r.loss))
        res[name] = losses
        print(name, losses[0], losses[-1], flush=True)
    Path(out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
