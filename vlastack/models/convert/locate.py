"""Finding a policy checkpoint and telling its format: ``locate`` resolves a folder (its
``pretrained_model/`` child, or a Hub id in the local cache: nothing is downloaded), reads its
``config.json`` once and names the format (``vlastack``, ``lerobot`` or ``openpi``). Every loader
starts here (``infer.readers.load_parts``, ``vla import``, evaluation's camera lookup), then goes
to its format's reader; the conversions live in ``lerobot.py``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from vlastack.fileio import read_json
from vlastack.models.convert.safetensors_io import TensorInfo, read_folder_header


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return home / "hub"


def hf_snapshot(repo_id: str) -> Path | None:
    """The local snapshot of ``owner/name`` in the Hugging Face cache (offline), or None."""
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file() and (snaps / ref.read_text().strip()).is_dir():
        return snaps / ref.read_text().strip()
    found = sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def resolve_checkpoint(spec: str | Path) -> Path:
    """A folder, a folder holding ``pretrained_model/``, or a Hub id already in the local cache."""
    path = Path(spec).expanduser()
    if not path.exists() and isinstance(spec, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        snap = hf_snapshot(spec)
        if snap is None:
            raise ValueError(
                f"{spec!r} is neither a folder nor in the local Hugging Face cache ({hf_cache_dir()}); "
                f"nothing is downloaded: fetch it first (huggingface-cli download {spec})"
            )
        path = snap
    if not path.is_dir():
        raise ValueError(f"checkpoint folder {path} does not exist")
    if not (path / "config.json").exists() and (path / "pretrained_model" / "config.json").exists():
        path = path / "pretrained_model"
    return path


@dataclass
class Checkpoint:
    """A located policy folder: its format and ``config.json`` (``meta``), read once by ``locate``;
    the safetensors ``header`` and (pi0_fast) the FAST processor are read on first use and kept, so
    the config, the weights and the tokenizers of one load share a single read of each file."""

    folder: Path
    fmt: str  # "vlastack" | "lerobot" | "openpi"
    meta: dict

    @cached_property
    def header(self) -> dict[str, TensorInfo]:
        return read_folder_header(self.folder)

    @cached_property
    def fast(self) -> tuple[Path, dict, Any]:
        """pi0_fast: (processor folder, its ``processor_config.json``, the BPE ``tokenizers.Tokenizer``)."""
        from tokenizers import Tokenizer

        proc = find_fast_processor(self.folder, self.meta)
        return (
            proc,
            read_json(proc / "processor_config.json"),
            Tokenizer.from_file(str(proc / "tokenizer.json")),
        )


def locate(spec: str | Path | Checkpoint) -> Checkpoint:
    """A folder, its ``pretrained_model/`` parent or a cached Hub id -> ``Checkpoint``; a
    ValueError naming what is missing or unsupported."""
    if isinstance(spec, Checkpoint):
        return spec
    folder = resolve_checkpoint(spec)
    cfg_file = folder / "config.json"
    if not cfg_file.exists() and (folder / "dcp" / ".metadata").is_file():
        raise ValueError(
            f"{folder}: a sharded training checkpoint (train.checkpoint_format=sharded: each rank's "
            "shards, no policy folder); `vla train --resume` continues it, and the run's policy is "
            "its final/ folder (checkpoints at train.eval_every steps also hold one)"
        )
    if not cfg_file.exists():
        raise ValueError(f"{folder}: missing config.json (not a vlastack, LeRobot or openpi checkpoint)")
    meta = read_json(cfg_file)
    return Checkpoint(folder, _format(folder, meta), meta)


def _format(folder: Path, cfg: dict) -> str:
    if "model" in cfg and isinstance(cfg["model"], dict):
        return "vlastack"
    if cfg.get("type") in ("pi0", "pi05", "pi0_fast"):
        return "lerobot"
    if cfg.get("type") is not None:
        raise ValueError(f"{folder}: LeRobot policy type {cfg['type']!r}; supported: pi0, pi05, pi0_fast")
    if "paligemma_variant" in cfg or "action_expert_variant" in cfg:
        return "openpi"
    raise ValueError(f"{folder}/config.json: neither a vlastack, a LeRobot pi0/pi05 nor an openpi config")


def find_fast_processor(folder: str | Path, meta: dict) -> Path:
    """The FAST action tokenizer of a pi0_fast checkpoint (``processor_config.json`` +
    ``tokenizer.json``): ``<folder>/fast_tokenizer/``, else ``action_tokenizer_name`` as a folder,
    else its snapshot in the local Hugging Face cache. Nothing is downloaded."""
    folder = Path(folder)
    name = meta.get("action_tokenizer_name") or "lerobot/fast-action-tokenizer"
    candidates = [folder / "fast_tokenizer", Path(name).expanduser()]
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name) and hf_snapshot(name) is not None:
        candidates.append(hf_snapshot(name))
    for c in candidates:
        if (c / "processor_config.json").is_file() and (c / "tokenizer.json").is_file():
            return c
    raise ValueError(
        f"{folder}: no FAST action tokenizer (processor_config.json + tokenizer.json) in "
        f"{folder / 'fast_tokenizer'} nor in the local Hugging Face cache of {name!r}; copy it there "
        f"(`huggingface-cli download {name} --local-dir {folder / 'fast_tokenizer'}`)"
    )
