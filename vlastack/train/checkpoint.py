"""Checkpoint folders: write atomically, keep the last K, point to the latest, check on resume.

Layout of ``<run>/checkpoints/step_0000100/``::

    model.safetensors, config.json   the model (``VLA.save_pretrained``; LoRA runs: merged export)
    config.yaml                      the full Config
    norm_stats.json                  the data Normalizer
    ema/                             the same files with EMA weights (when train.ema_decay > 0)
    adapter.safetensors              LoRA runs: only the trained adapter tensors
    train_state/                     optimizer, scheduler, scaler, EMA, data position, step
                                     (state.safetensors + state.json), RNG per rank (rng_rankR.*)

A checkpoint is written under ``.tmp-step_...``, fsynced, then renamed; ``checkpoints/latest``
(a text file with the folder name) is replaced atomically afterwards, so a crash at any point
leaves the previous checkpoint intact. ``<run>/final`` holds the last step's exported policy.

A crash (kill -9, Ctrl-C, a full disk) mid-save leaves temporary folders behind. ``begin`` always
starts a checkpoint from an empty temporary folder, and ``sweep`` (run when training starts)
deletes every leftover, so an interrupted save never blocks ``--resume`` or holds disk space.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from vlastack.config import Config, load_yaml, save_yaml, to_dict
from vlastack.data.format import TRAIN_SEEDS, train_seeds
from vlastack.data.stats import NORM_STATS
from vlastack.train.state import atomic_write_text, fsync_file, fsync_tree

LATEST = "latest"


def step_name(step: int) -> str:
    return f"step_{step:07d}"


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def tmp_dir(run_dir: str | Path, step: int) -> Path:
    return checkpoint_root(run_dir) / f".tmp-{step_name(step)}"


def begin(run_dir: str | Path, step: int) -> Path:
    """An empty temporary folder for checkpoint ``step`` (a leftover from a killed save is removed)."""
    tmp = tmp_dir(run_dir, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def sweep(run_dir: str | Path) -> list[Path]:
    """Delete what interrupted saves left in ``run_dir``: ``checkpoints/.tmp-*``, ``.latest.tmp``,
    ``.tmp-final``. Call once at start, before any rank writes. Returns what was removed."""
    root = checkpoint_root(run_dir)
    stale = [*root.glob(".tmp-*"), *root.glob(f".{LATEST}.tmp"), Path(run_dir) / ".tmp-final"]
    removed = []
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink(missing_ok=True)
        else:
            continue
        removed.append(p)
    return removed


def write_common(folder: Path, cfg: Config, normalizer: Any, data_root: str | Path | None = None) -> None:
    """config.yaml + norm_stats.json: what a policy needs beside the weights; plus train_seeds.json
    (the simulator seeds behind the training data) when ``vla data generate`` made the data."""
    save_yaml(cfg, folder / "config.yaml")
    if normalizer is not None:
        normalizer.save(folder / NORM_STATS)
    seeds = train_seeds(data_root or cfg.data.path)
    if seeds is not None:
        atomic_write_text(folder / TRAIN_SEEDS, json.dumps(seeds))


def commit(run_dir: str | Path, step: int, keep_last: int) -> Path:
    """Make the temp folder of ``step`` the newest checkpoint; drop all but the last ``keep_last``."""
    root = checkpoint_root(run_dir)
    tmp, final = tmp_dir(run_dir, step), root / step_name(step)
    fsync_tree(tmp)
    if final.exists():  # re-saving the same step (e.g. after a resume): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_file(root)
    atomic_write_text(root / LATEST, final.name + "\n")
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in steps[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The folder named by ``checkpoints/latest``, or the highest step folder, or None."""
    root = checkpoint_root(run_dir)
    ptr = root / LATEST
    if ptr.exists():
        name = ptr.read_text(errors="replace").strip()
        p = root / name
        if (
            name.startswith("step_") and "/" not in name and p.is_dir()
        ):  # a garbage pointer falls back to the scan
            return p
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    return steps[-1] if steps else None


# What a training run writes into its folder (``claim_run_dir(overwrite=True)`` removes these only).
RUN_OUTPUTS = (
    "checkpoints", "final", ".tmp-final", "lora_base", "eval", "tb", "metrics.jsonl", "loss_curve.png",
    "report.html", "train_summary.json", "config.yaml",
)  # fmt: skip


def claim_run_dir(run_dir: str | Path, overwrite: bool = False) -> None:
    """A new run may start in ``run_dir``: refuse (``ValueError``) a folder that holds another run's
    checkpoints or final policy, unless ``overwrite``, which deletes that run's outputs first."""
    run_dir = Path(run_dir)
    latest = latest_checkpoint(run_dir)
    final = run_dir / "final"
    if latest is None and not final.exists():
        return
    if not overwrite:
        what = f"checkpoint {latest.name}" if latest is not None else "a final policy"
        raise ValueError(
            f"{run_dir} already holds a training run ({what}): continue it with --resume, train into "
            "another --out, or pass --overwrite to delete it and start over"
        )
    for name in RUN_OUTPUTS:
        p = run_dir / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def export_final(run_dir: str | Path, ckpt: Path, name: str = "final") -> Path:
    """Copy the policy files of ``ckpt`` (no training state) to ``<run>/<name>`` (atomic rename)."""
    run_dir = Path(run_dir)
    tmp, final = run_dir / f".tmp-{name}", run_dir / name
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt, tmp, ignore=shutil.ignore_patterns("train_state"))
    fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


# Training settings that change what the saved state means, or which samples come next and how
# they are normalized: resuming across a change is refused. Other keys (steps, logging, saving,
# evaluation, threads, workers) may change and are listed in a log line.
STATE_KEYS = ("optimizer", "lora_rank", "lora_targets", "lora_alpha", "batch_size", "grad_accum", "seed")
DATA_KEYS = ("episodes", "norm", "norm_stats", "random_crop_scale", "color_jitter")


def _diff(a: Any, b: Any, prefix: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}.{k}")
        return out
    return [] if a == b else [f"{prefix} is {a!r} in the checkpoint but {b!r} now"]


def changed_keys(old: Config, new: Config) -> list[str]:
    """Dotted keys whose value differs between two configs (for the resume log line)."""
    return [r.split(" is ")[0].lstrip(".") for r in _diff(to_dict(old), to_dict(new), "")]


def check_same_statistics(ckpt: Path, normalizer: Any) -> None:
    """Refuse to resume when the dataset's normalizer differs from the one the checkpoint was
    trained with (another --data, or the same folder with other episodes): the model would see
    differently scaled states and actions from the next step on."""
    saved = ckpt / NORM_STATS
    if normalizer is None or not saved.exists():
        return
    from vlastack.data.stats import load_normalizer

    old, new = load_normalizer(saved).to_dict(), normalizer.to_dict()
    keys = sorted(
        k for k in set(old["stats"]) | set(new["stats"]) if old["stats"].get(k) != new["stats"].get(k)
    )
    keys += ["modes"] if old["modes"] != new["modes"] else []
    if keys:
        raise ValueError(
            f"cannot resume from {ckpt}: this dataset's normalizer statistics ({', '.join(keys)}) differ "
            "from the checkpoint's (another --data?); resume with the dataset the run was started on"
        )


def check_compatible(ckpt: Path, cfg: Config) -> Config:
    """Raise ``ValueError`` with every reason ``cfg`` cannot resume from ``ckpt``; returns its Config."""
    if not (ckpt / "config.yaml").exists() or not (ckpt / "train_state" / "state.json").exists():
        raise ValueError(
            f"cannot resume from {ckpt}: not a training checkpoint (config.yaml/train_state missing)"
        )
    try:
        old = load_yaml(ckpt / "config.yaml")
    except ValueError as e:
        raise ValueError(f"cannot resume from {ckpt}: its config.yaml is invalid ({e})") from None
    new_model = cfg.model
    if old.model.action_representation == "auto":  # saved before the data's record was read: no change
        new_model = replace(cfg.model, action_representation="auto")
    reasons = _diff(to_dict(old.model), to_dict(new_model), "model")
    ot, nt = to_dict(old.train), to_dict(cfg.train)
    for k in STATE_KEYS:
        reasons += _diff(ot[k], nt[k], f"train.{k}")
    for k in ("lr_vision", "lr_vlm", "lr_expert", "lr_head"):  # frozen parts fix the optimizer groups
        if (ot.get(k) == 0) != (nt[k] == 0):
            reasons.append(
                f"train.{k}: a part frozen in one run is trained in the other ({ot[k]} vs {nt[k]})"
            )
    if (ot["ema_decay"] > 0) != (nt["ema_decay"] > 0):
        reasons.append("train.ema_decay: EMA is on in one run and off in the other")
    od, nd = to_dict(old.data), to_dict(cfg.data)
    for k in DATA_KEYS:
        reasons += _diff(od[k], nd[k], f"data.{k}")
    if reasons:
        raise ValueError(f"cannot resume from {ckpt}: " + "; ".join(reasons))
    return old
