"""Run and convert LeRobot / openpi pi0, pi05 and pi0_fast checkpoints (offline).

    parts = load_parts("lerobot/pi05_base")     # folder, pretrained_model/ parent or Hub cache id
    Policy(parts.model, parts.normalizer, parts.tokenizer, preprocess=parts.pipeline)
    import_checkpoint("lerobot/pi05_base", "runs/pi05_base")   # -> a vlastack policy folder

``Policy.from_pretrained`` is ``load_parts`` (``locate``: the folder resolved, its config.json read
and its format detected, once; then one reader per format: ``read_vlastack``, ``read_external``)
composed into a ``Policy``. Every file of the folder is read once per load.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from vlastack.config import Config, DataConfig, EvalConfig, NormConfig, TrainConfig, save_yaml
from vlastack.data.stats import NORM_STATS, load_normalizer
from vlastack.fileio import read_json
from vlastack.infer.preprocess import ACTION_KEY, PIPELINE_FILE, STATE_KEY, Pipeline
from vlastack.models.convert.lerobot import (
    Checkpoint,
    build_from_checkpoint,
    config_from_checkpoint,
    hf_snapshot,
    locate,
)
from vlastack.models.convert.pi0_fast import attach_tokenizers
from vlastack.models.tokenizer import SentencePieceTokenizer, load_tokenizer

PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"


@dataclass
class Parts:
    """What a policy folder of any format holds, for ``Policy``: the model, LeRobot's exact input
    pipeline (None for a trained vlastack folder), the text tokenizer, the normalizer (None:
    identity), the checkpoint kind, the folder, its format and the actions it runs per chunk
    (a LeRobot folder's ``n_action_steps``; None: the policy's default)."""

    model: torch.nn.Module
    pipeline: Pipeline | None
    tokenizer: Any
    kind: str
    folder: Path
    normalizer: Any
    fmt: str
    replan_steps: int | None = None


def lerobot_steps_per_chunk(meta: dict) -> int | None:
    """A LeRobot pi0/pi05/pi0-FAST ``config.json``'s ``n_action_steps`` (capped at ``chunk_size``):
    how many actions lerobot-eval runs per chunk. None for other configs."""
    if meta.get("type") in ("pi0", "pi05", "pi0_fast") and meta.get("n_action_steps"):
        return int(min(meta["n_action_steps"], meta.get("chunk_size") or meta["n_action_steps"]))
    return None


def tokenizer_name(folder: Path) -> str:
    """The tokenizer LeRobot's preprocessor names (``tokenizer_processor.tokenizer_name``)."""
    pre = folder / "policy_preprocessor.json"
    if pre.exists():
        for step in read_json(pre).get("steps", []):
            name = step.get("config", {}).get("tokenizer_name")
            if name:
                return name
    return PALIGEMMA_TOKENIZER


def text_tokenizer(folder: Path, cfg_tokenizer: str):
    """The checkpoint's text tokenizer: the file-free byte tokenizer where its config says so (a
    tiny model exported by ``vla export-lerobot``), else PaliGemma's ``tokenizer.model``."""
    return (
        load_tokenizer("byte") if cfg_tokenizer == "byte" else SentencePieceTokenizer(find_tokenizer(folder))
    )


def find_tokenizer(folder: Path) -> Path:
    """``tokenizer.model`` in the checkpoint folder, else in the local Hugging Face cache of the
    tokenizer the preprocessor names (PaliGemma's). Nothing is downloaded."""
    if (folder / "tokenizer.model").exists():
        return folder / "tokenizer.model"
    name = tokenizer_name(folder)
    snap = hf_snapshot(name)
    if snap is not None and (snap / "tokenizer.model").exists():
        return snap / "tokenizer.model"
    raise ValueError(
        f"no tokenizer.model in {folder} nor in the local Hugging Face cache of {name!r}; "
        f"put PaliGemma's tokenizer.model in {folder} (or `huggingface-cli download {name} tokenizer.model`)"
    )


def load_parts(
    path: str | Path | Checkpoint,
    overrides: list[str] | tuple[str, ...] = (),
    strict: bool = True,
    dtype: torch.dtype | None = torch.float32,
    asset_id: str | None = None,
    device: str | torch.device = "cpu",
    ema: bool = False,
) -> Parts:
    """Any policy folder -> ``Parts``: located once (``locate``), then read by its format's reader:
    a vlastack folder (trained, or imported with its LeRobot pipeline), a LeRobot or an openpi
    checkpoint (a folder, its ``pretrained_model/`` parent, or a Hub id in the local cache)."""
    hub_id = isinstance(path, str) and path.count("/") == 1 and hf_snapshot(path) is not None
    if not isinstance(path, Checkpoint) and not Path(path).expanduser().exists() and not hub_id:
        raise ValueError(f"policy folder {path} does not exist (nor is it a Hub id in the local cache)")
    ckpt = locate(path)
    if ckpt.fmt == "vlastack":
        if overrides or not strict:
            raise ValueError(
                "overrides/strict apply to LeRobot or openpi checkpoints, not to vlastack folders"
            )
        return read_vlastack(ckpt, ema, device)
    if ema:
        raise ValueError(
            f"{ckpt.folder} is a {ckpt.fmt} checkpoint: it has no ema/ weights (ema applies to vlastack runs)"
        )
    return read_external(ckpt, overrides, strict, dtype, asset_id, device)


def read_vlastack(ckpt: Checkpoint, ema: bool = False, device: str | torch.device = "cpu") -> Parts:
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
        return Parts(model, pipe, tok, pipe.kind, folder, pipe.normalizer, "vlastack")
    stats = weights / NORM_STATS if (weights / NORM_STATS).exists() else folder / NORM_STATS
    normalizer = load_normalizer(stats) if stats.exists() else None
    return Parts(
        model, None, load_tokenizer(model.cfg.tokenizer), model.cfg.head, folder, normalizer, "vlastack"
    )


def read_external(
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
