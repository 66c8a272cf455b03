"""What the readers share: ``Parts`` (what a policy folder of any format holds, for ``Policy``)
and the text-tokenizer lookup of LeRobot and openpi checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vlastack.fileio import read_json
from vlastack.infer.preprocess import Pipeline
from vlastack.models.convert.locate import hf_snapshot
from vlastack.models.tokenizer import SentencePieceTokenizer, load_tokenizer

PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"


@dataclass
class Parts:
    """What a policy folder of any format holds, for ``Policy``: the model, LeRobot's exact input
    pipeline (None for a trained vlastack folder), the text tokenizer, the normalizer (None:
    identity), the checkpoint kind, the folder, its format and the actions it runs per chunk
    (a vlastack folder's ``eval.steps_per_chunk``, a LeRobot folder's ``n_action_steps``; None:
    the policy's default, its action horizon)."""

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
