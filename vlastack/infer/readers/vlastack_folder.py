"""The reader of vlastack's own policy folders (trained here, or imported with LeRobot's pipeline)."""

from __future__ import annotations

from pathlib import Path

import torch

from vlastack.data.stats import NORM_STATS, load_normalizer
from vlastack.infer.preprocess import PIPELINE_FILE, Pipeline
from vlastack.infer.readers.common import Parts, text_tokenizer
from vlastack.models.convert.locate import Checkpoint
from vlastack.models.tokenizer import load_tokenizer


def saved_steps_per_chunk(path: str | Path) -> int | None:
    """``eval.steps_per_chunk`` of a vlastack checkpoint's config.yaml, capped at its action horizon:
    the one source for how many actions run per chunk (``vla eval``, ``Policy``, ``vla serve``'s
    /metadata). None when the folder has no config.yaml."""
    f = Path(path) / "config.yaml"
    if not f.is_file():
        return None
    from vlastack.config import load_yaml

    cfg = load_yaml(f)
    return min(cfg.eval.steps_per_chunk, cfg.model.action_horizon)


def read(ckpt: Checkpoint, ema: bool = False, device: str | torch.device = "cpu") -> Parts:
    """A vlastack policy folder: ``config.json`` + weights (``ema/`` ones with ``ema``), its
    ``norm_stats.json`` (identity without), and, if it was imported, its LeRobot pipeline."""
    from vlastack.models.vla import VLA

    folder = ckpt.folder
    weights = folder / "ema" if ema else folder
    if ema and not weights.is_dir():
        raise ValueError(f"{folder} has no ema/ folder (train with train.ema_decay > 0)")
    # ema/ has its own config.json; the folder's was read by locate
    model = VLA.from_pretrained(weights, device=device, config=None if ema else ckpt.meta)
    if (folder / PIPELINE_FILE).exists():  # imported: LeRobot's exact input pipeline
        pipe = Pipeline.load(folder)
        tok = text_tokenizer(folder, model.cfg.tokenizer)
        return Parts(
            model, pipe, tok, pipe.kind, folder, pipe.normalizer, "vlastack", saved_steps_per_chunk(folder)
        )
    stats = weights / NORM_STATS if (weights / NORM_STATS).exists() else folder / NORM_STATS
    normalizer = load_normalizer(stats) if stats.exists() else None
    tok = load_tokenizer(model.cfg.tokenizer)
    return Parts(
        model, None, tok, model.cfg.head, folder, normalizer, "vlastack", saved_steps_per_chunk(folder)
    )
