"""The reader of LeRobot and openpi pi0 / pi05 / pi0_fast checkpoints (their folders differ in the
pipeline they carry: ``Pipeline.from_lerobot`` or ``Pipeline.from_openpi``)."""

from __future__ import annotations

import torch

from vlastack.infer.preprocess import Pipeline
from vlastack.infer.readers.common import Parts, lerobot_steps_per_chunk, text_tokenizer
from vlastack.models.convert.lerobot import build_from_checkpoint, config_from_checkpoint
from vlastack.models.convert.locate import Checkpoint
from vlastack.models.convert.pi0_fast import attach_tokenizers


def read(
    ckpt: Checkpoint,
    overrides: list[str] | tuple[str, ...] = (),
    strict: bool = True,
    dtype: torch.dtype | None = torch.float32,
    asset_id: str | None = None,
    device: str | torch.device = "cpu",
) -> Parts:
    """A LeRobot or openpi pi0 / pi05 / pi0_fast checkpoint, everything small first (config,
    processor, normalizer, tokenizer) and the weights last: a wrong processor or a missing tokenizer
    must not cost a 13 GB read before it is reported."""
    folder = ckpt.folder
    cfg, kind, meta = config_from_checkpoint(ckpt, overrides)
    if ckpt.fmt == "lerobot":
        pipe = Pipeline.from_lerobot(folder, kind, meta, cfg)
    else:
        pipe = Pipeline.from_openpi(folder, kind, cfg, asset_id)
    tok = text_tokenizer(folder, cfg.tokenizer)
    if tok.vocab_size > cfg.vlm.vocab_size:
        raise ValueError(f"tokenizer has {tok.vocab_size} pieces but the embedding {cfg.vlm.vocab_size} rows")
    model = build_from_checkpoint(ckpt, cfg, kind, strict=strict, dtype=dtype)
    if kind == "pi0_fast":
        attach_tokenizers(model, ckpt, tok)
    steps = lerobot_steps_per_chunk(meta) if ckpt.fmt == "lerobot" else None
    return Parts(model.to(device), pipe, tok, kind, folder, pipe.normalizer, ckpt.fmt, steps)
