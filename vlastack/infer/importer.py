"""Convert LeRobot / openpi pi0, pi05 and pi0_fast checkpoints into vlastack policy folders (offline).

    import_checkpoint("lerobot/pi05_base", "runs/pi05_base")   # -> a vlastack policy folder

Reading any format for serving: ``infer/readers/``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import torch

from vlastack.config import Config, DataConfig, EvalConfig, NormConfig, TrainConfig, save_yaml
from vlastack.data.stats import NORM_STATS
from vlastack.infer.preprocess import ACTION_KEY, STATE_KEY
from vlastack.infer.readers import find_tokenizer, load_parts
from vlastack.models.convert.locate import locate


def import_checkpoint(
    path: str | Path,
    out: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    strict: bool = True,
    dtype: torch.dtype | None = torch.float32,
    asset_id: str | None = None,
) -> Path:
    """Convert to a vlastack policy folder: ``model.safetensors`` + ``config.json`` (ours),
    ``lerobot_pipeline.json`` (cameras, prompt style, exact normalizer), ``tokenizer.model`` and
    ``norm_stats.json`` (the same statistics and formulas, for ``data.norm_stats=init_from``) and
    ``train.yaml`` (the model config with ``train.init_from`` = this folder, to fine-tune from it;
    ``data.norm_stats: dataset`` recomputes the statistics from the training data, ``init_from``
    keeps these; the result is served with what it was trained with)."""
    ckpt = locate(path)
    if ckpt.fmt == "vlastack":
        raise ValueError(f"{path} is already a vlastack policy folder")
    parts = load_parts(ckpt, overrides, strict, dtype, asset_id)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = parts.model
    if model.cfg.tokenizer != "byte":  # PaliGemma's tokenizer.model travels with the policy
        model.cfg = replace(model.cfg, tokenizer=str(out.resolve()))
        shutil.copy(find_tokenizer(parts.folder), out / "tokenizer.model")
    model.save_pretrained(out)
    parts.pipeline.save(out)
    parts.normalizer.save(out / NORM_STATS)
    h = model.cfg.action_horizon
    modes = parts.normalizer.modes  # recomputed from the dataset, with the checkpoint's modes
    norm = NormConfig(state=modes.get(STATE_KEY, "mean_std"), action=modes.get(ACTION_KEY, "mean_std"))
    train = Config(
        model=model.cfg,
        data=DataConfig(norm=norm, norm_stats="dataset"),
        train=TrainConfig(
            init_from=str(out.resolve()), lr=2.5e-5, precision="bf16", out_dir=str(out) + "_ft"
        ),
        eval=EvalConfig(steps_per_chunk=min(8, h), image_size=model.cfg.vision.image_size),
    )
    save_yaml(train, out / "train.yaml")  # vla train --config OUT/train.yaml --data DATASET
    (out / "source.json").write_text(
        json.dumps({"source": str(parts.folder), "kind": parts.kind, "overrides": list(overrides)}, indent=2)
    )
    return out
