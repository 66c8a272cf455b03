"""LeRobot's / openpi's input pipeline for pi0, pi05 and pi0_fast, reproduced exactly (no `lerobot`).

    pipe = Pipeline.from_lerobot(folder, cfg)       # or .from_openpi(folder, cfg), .load(our_folder)
    batch = pipe.build_batch(obs_list, tokenizer)   # what the model gets; pipe.normalizer for actions

What LeRobot 0.6.1 does, step by step (``policies/pi0{,5}/``, ``processor/``):

- cameras: the config's VISUAL input features in order; an absent camera is an image of -1 with
  its mask off (its tokens are padding);
- images: float in [0, 1] (uint8 / 255), resized keeping the aspect ratio (bilinear,
  align_corners=False, clamped to [0, 1]) and padded with 0 centred to the square resolution
  (openpi's ``resize_with_pad``), then mapped to [-1, 1];
- state/actions: MEAN_STD ``(x - mean) / (std + eps)`` and back ``x * std + mean``; QUANTILES
  ``2 (x - q01) / (q99 - q01) - 1`` (eps only where q99 == q01) and back; no clipping; the model
  sees the state zero-padded to 32;
- prompt: pi0 appends "\\n" (nothing else); pi05 writes ``Task: {cleaned}, State: {bins};\\nAction: ``
  with the normalized state digitized into 256 bins over [-1, 1] (no clipping); pi0_fast the same
  without ``Action: `` (its model writes it);
- tokens: ``<bos>`` + SentencePiece ids, right-padded with 0 to ``tokenizer_max_length``, truncated.

openpi (``assets/<id>/norm_stats.json``): eps 1e-6 on both sides (``(x - mean) / (std + 1e-6)``,
quantiles ``(x - q01) / (q99 - q01 + 1e-6) * 2 - 1``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from vlastack.batch import Batch
from vlastack.data.stats import ExactNormalizer
from vlastack.data.transforms import resize_with_pad
from vlastack.fileio import load_safetensors, read_json

STATE_KEY, ACTION_KEY = "observation.state", "action"
PIPELINE_FILE = "lerobot_pipeline.json"
_LEROBOT_MODES = {"MEAN_STD": "mean_std", "QUANTILES": "quantiles", "IDENTITY": "identity"}


def pi05_prompt(task: str, normalized_state: np.ndarray) -> str:
    """openpi's Pi0.5 prompt: the state (normalized, unclipped) in 256 bins over [-1, 1]."""
    bins = np.digitize(normalized_state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAction: "


def pi0_fast_prompt(task: str, normalized_state: np.ndarray) -> str:
    """LeRobot's pi0_fast prompt: as pi05's, without "Action: " (the model writes it)."""
    bins = np.digitize(normalized_state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {cleaned}, State: {' '.join(map(str, bins))};\n"


def pi0_prompt(task: str, style: str = "lerobot") -> str:
    """LeRobot appends "\\n" if absent; openpi cleans the text first (strip, "_" -> " ")."""
    if style == "openpi":
        task = task.strip().replace("_", " ").replace("\n", " ")
    return task if task.endswith("\n") else task + "\n"


def pad_ids(ids: list[int], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids (``<bos>`` first) truncated to ``max_len``, right-padded with 0 -> (ids int64, mask bool)."""
    ids = ids[:max_len]
    out = np.zeros(max_len, dtype=np.int64)
    out[: len(ids)] = ids
    mask = np.zeros(max_len, dtype=bool)
    mask[: len(ids)] = True
    return out, mask


def _model_fields(model_cfg) -> dict:
    """The ``Pipeline`` fields every checkpoint layout takes from the model config."""
    return {
        "camera_names": tuple(model_cfg.camera_names),
        "image_size": model_cfg.vision.image_size,
        "max_text_len": model_cfg.max_text_len,
        "model_state_dim": model_cfg.state_dim,
    }


@dataclass
class Pipeline:
    """Everything between an observation and the model, for one LeRobot / openpi checkpoint."""

    kind: str  # pi0 | pi05 | pi0_fast
    camera_names: tuple[str, ...]
    image_size: int
    max_text_len: int
    model_state_dim: int
    normalizer: ExactNormalizer
    style: str = "lerobot"  # lerobot | openpi (prompt cleaning and eps)
    rename_map: dict[str, str] = field(default_factory=dict)

    def build_batch(self, obs_list: list, tokenizer) -> Batch:
        """Checked observations (``obs.Obs``: uint8 HWC images by camera, float state, prompt)
        -> model batch with float images in [-1, 1] (see vlastack/batch.py)."""
        b, n, s = len(obs_list), len(self.camera_names), self.image_size
        images = torch.full((b, n, 3, s, s), -1.0)
        image_mask = torch.zeros(b, n, dtype=torch.bool)
        tokens = torch.zeros(b, self.max_text_len, dtype=torch.long)
        token_mask = torch.zeros(b, self.max_text_len, dtype=torch.bool)
        state = torch.zeros(b, self.model_state_dim)
        for i, o in enumerate(obs_list):
            for j, cam in enumerate(self.camera_names):
                if cam in o.images:
                    img = torch.from_numpy(np.array(o.images[cam])).permute(2, 0, 1)[None].float() / 255.0
                    images[i, j] = resize_with_pad(img, s, s)[0] * 2.0 - 1.0
                    image_mask[i, j] = True
            st = self.normalizer.normalize(STATE_KEY, torch.from_numpy(np.asarray(o.state, np.float32)))
            if self.kind == "pi05":
                ids = tokenizer.encode(pi05_prompt(o.prompt, st.numpy()))
            elif self.kind == "pi0_fast":
                ids = tokenizer.encode(pi0_fast_prompt(o.prompt, st.numpy()))
            elif self.style == "openpi":  # "\n" tokenized apart: openpi's start-of-answer token
                ids = tokenizer.encode(pi0_prompt(o.prompt, "openpi")[:-1]) + tokenizer.encode(
                    "\n", bos=False
                )
            else:
                ids = tokenizer.encode(pi0_prompt(o.prompt))
            if self.kind == "pi0":
                state[i, : st.shape[0]] = st
            ids, mask = pad_ids(ids, self.max_text_len)
            tokens[i], token_mask[i] = torch.from_numpy(ids), torch.from_numpy(mask)
        return {"images": images, "image_mask": image_mask, "tokens": tokens, "token_mask": token_mask,
                "state": state}  # fmt: skip

    # ------------------------------------------------------------------ files

    def save(self, folder: str | Path) -> None:
        d = asdict(self)
        d["camera_names"] = list(self.camera_names)
        d["normalizer"] = self.normalizer.to_dict()
        (Path(folder) / PIPELINE_FILE).write_text(json.dumps(d, indent=2) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> Pipeline:
        d = read_json(Path(folder) / PIPELINE_FILE)
        d["camera_names"] = tuple(d["camera_names"])
        d["normalizer"] = ExactNormalizer.from_dict(d["normalizer"])
        return cls(**d)

    @classmethod
    def from_lerobot(cls, folder: str | Path, kind: str, meta: dict, model_cfg) -> Pipeline:
        """Read ``policy_preprocessor.json`` / ``policy_postprocessor.json`` and their normalizer
        state files (the postprocessor's action stats win for actions)."""
        folder = Path(folder)
        modes: dict[str, str] = {}
        stats: dict[str, dict[str, np.ndarray]] = {}
        eps, rename = 1e-8, {}
        for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
            path = folder / name
            if not path.exists():
                raise ValueError(f"{folder}: missing {name} (LeRobot's processor: norm stats, tokenizer)")
            for step in read_json(path)["steps"]:
                reg, cfg = step.get("registry_name", ""), step.get("config", {})
                if reg in ("relative_actions_processor", "absolute_actions_processor") and cfg.get("enabled"):
                    raise ValueError(f"{folder}: relative actions (use_relative_actions) are not supported")
                if reg == "rename_observations_processor":
                    rename = dict(cfg.get("rename_map", {}))
                if reg not in ("normalizer_processor", "unnormalizer_processor"):
                    continue
                eps = float(cfg.get("eps", eps))
                norm_map = {k: _LEROBOT_MODES.get(v, v.lower()) for k, v in cfg.get("norm_map", {}).items()}
                tensors = _read_stats(folder / step["state_file"]) if step.get("state_file") else {}
                mine = STATE_KEY if reg == "normalizer_processor" else ACTION_KEY
                for feat, spec in cfg.get("features", {}).items():
                    if feat != mine:
                        continue
                    stats[feat] = {s: v for (k, s), v in tensors.items() if k == feat}
                    # LeRobot leaves a feature without statistics as it is (e.g. a base model's actions)
                    modes[feat] = norm_map.get(spec["type"], "identity") if stats[feat] else "identity"
        for key in (STATE_KEY, ACTION_KEY):
            modes.setdefault(key, "identity")
        return cls(
            kind=kind,
            **_model_fields(model_cfg),
            normalizer=ExactNormalizer(modes, stats, "lerobot", eps),
            rename_map=rename,
        )

    @classmethod
    def from_openpi(cls, folder: str | Path, kind: str, model_cfg, asset_id: str | None = None) -> Pipeline:
        """``assets/<asset_id>/norm_stats.json`` (the only asset folder if ``asset_id`` is None)."""
        folder = Path(folder)
        assets = sorted((folder / "assets").glob("*/norm_stats.json"))
        if asset_id is not None:
            assets = [p for p in assets if p.parent.name == asset_id]
        if len(assets) != 1:
            found = [p.parent.name for p in assets]
            raise ValueError(f"{folder}: need exactly one assets/<id>/norm_stats.json, found {found}")
        raw = read_json(assets[0])
        raw = raw.get("norm_stats", raw)
        mode = "quantiles" if kind == "pi05" else "mean_std"
        stats = {STATE_KEY: raw["state"], ACTION_KEY: raw["actions"]}
        return cls(
            kind=kind,
            **_model_fields(model_cfg),
            normalizer=ExactNormalizer({STATE_KEY: mode, ACTION_KEY: mode}, stats, "openpi"),
            style="openpi",
        )


def _read_stats(file: Path) -> dict[tuple[str, str], np.ndarray]:
    """``policy_*_normalizer_processor.safetensors``: ``<feature>.<stat>`` -> array."""
    if not file.exists():
        raise ValueError(f"missing normalizer state file {file}")
    out = {}
    for k, v in load_safetensors(file).items():
        v = v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
        feat, _, stat = k.rpartition(".")
        out[(feat, stat)] = v
    return out
