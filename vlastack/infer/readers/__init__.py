"""One reader per policy-folder format, named for it, and ``load_parts``, which locates a folder
once (``models.convert.locate.locate``: the folder resolved, its config.json read and its format
detected) and hands it to its format's reader:

- ``vlastack_folder.read``: a vlastack policy folder (trained here, or imported with LeRobot's
  exact pipeline);
- ``lerobot_openpi.read``: a LeRobot or openpi pi0 / pi05 / pi0_fast checkpoint (a folder, its
  ``pretrained_model/`` parent, or a Hub id in the local cache).

    parts = load_parts("lerobot/pi05_base")
    Policy(parts.model, parts.normalizer, parts.tokenizer, preprocess=parts.pipeline)

Every file of the folder is read once per load.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vlastack.infer.readers import lerobot_openpi, vlastack_folder
from vlastack.infer.readers.common import Parts, find_tokenizer, lerobot_steps_per_chunk
from vlastack.models.convert.locate import Checkpoint, hf_snapshot, locate

__all__ = ["Parts", "find_tokenizer", "lerobot_steps_per_chunk", "load_parts"]


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
        return vlastack_folder.read(ckpt, ema, device)
    if ema:
        raise ValueError(
            f"{ckpt.folder} is a {ckpt.fmt} checkpoint: it has no ema/ weights (ema applies to vlastack runs)"
        )
    return lerobot_openpi.read(ckpt, overrides, strict, dtype, asset_id, device)
