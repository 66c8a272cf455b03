"""The VLA: a ``Backbone`` (SigLIP encoder -> projector -> Gemma decoder) plus an action head.

    model = build_model(cfg.model)
    out = model(batch)                      # {"loss": ...} for training
    actions = model.sample_actions(batch)   # [B, H, A], normalized action space
    out = model.sample(batch)               # ActionOutput(actions, valid)
    model.save_pretrained("ckpt/"); model = VLA.from_pretrained("ckpt/")

The head is chosen by ``cfg.head`` from ``models.heads.HEADS``, built from the registry
``config.HEAD_SPECS`` (the heads and what each does: ``models/heads/__init__.py``). ``VLA``
subclasses ``Backbone`` so its weights keep their names (``vision.*``, ``decoder.*``, ``head.*``);
heads see it only as a ``Backbone``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from vlastack.batch import Batch
from vlastack.config import ModelConfig, model_config_from_dict, to_dict
from vlastack.fileio import load_safetensors, read_json
from vlastack.models.backbone import Backbone
from vlastack.models.heads import ActionHead, ActionOutput, head_class
from vlastack.nn.init import lecun_init_

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


class VLA(Backbone):
    def __init__(self, cfg: ModelConfig) -> None:
        cls = head_class(cfg)
        super().__init__(cfg, expert=cfg.head_spec.uses_expert)
        self.head: ActionHead = cls(cfg)
        # Kept for import/export, but no loss can reach them; frozen so DDP does not wait for
        # their gradients and optimizers do not carry state for them.
        for name in self.head.frozen_backbone_params(self):
            self.get_parameter(name).requires_grad_(False)
        self.reset_parameters()

    @property
    def unreachable_linears(self) -> list[str]:
        """Regexes of the linear layers no loss reaches (their weights are frozen above): LoRA
        leaves them unwrapped (``apply_lora(..., exclude=model.unreachable_linears)``), since an
        adapter there would never get a gradient, which DDP refuses."""
        frozen = self.head.frozen_backbone_params(self)
        return [re.escape(n.removesuffix(".weight")) + "$" for n in frozen if n.endswith(".weight")]

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """LeCun-normal init, N(0, 1/fan_in), for linear and conv weights (the flax default that
        big_vision's SigLIP and openpi train with); N(0, ``std``) for embeddings; zero biases.

        For the 2048-wide pi0 shapes this is close to N(0, 0.02), but narrow presets and small
        inputs (state, actions, patch pixels) need it: with N(0, 0.02) the tiny preset's patch
        content started at a quarter of the position table's scale, and its state and action
        projections 17x below unit gain. On the demo's reach task it trained to a lower loss
        (0.627 vs 0.682 after 1500 steps). Adaptive norms' dense layers stay zero (``AdaRMSNorm``).

        The head initialises its own layers after the backbone's (``head.reset_parameters``; the
        default is the same LeCun init), so a head's own choice (a zero output layer) is kept.
        """
        head = set(map(id, self.head.modules()))
        lecun_init_((m for m in self.modules() if id(m) not in head), std)
        self.head.reset_parameters(std)
        self.vision.init_position_embedding()

    def forward(self, batch: Batch, **kwargs: Any) -> dict[str, Tensor]:
        """Training loss. -> {"loss": scalar fp32, ...}. ``kwargs``: see the head's ``loss``."""
        return self.head.loss(self, batch, **kwargs)

    @torch.no_grad()
    def sample(self, batch: Batch, noise: Tensor | None = None, **kwargs: Any) -> ActionOutput:
        """-> ``ActionOutput(actions fp32 [B, H, A] normalized, valid bool [B] or None)``.
        ``kwargs``: head options (flow: ``num_steps``, ``cache``, see ``FlowHead.sample``)."""
        return self.head.sample(self, batch, noise=noise, **kwargs)

    @torch.no_grad()
    def sample_actions(self, batch: Batch, noise: Tensor | None = None, **kwargs: Any) -> Tensor:
        """-> normalized action chunk fp32 [B, H, A] (``sample(...).actions``)."""
        return self.sample(batch, noise=noise, **kwargs).actions

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    # ------------------------------------------------------------------ persistence

    def save_pretrained(self, path: str | Path) -> None:
        """Folder of ``model.safetensors`` + ``config.json`` (the model config). No pickle."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        tmp = path / (WEIGHTS_NAME + ".tmp")
        save_file(state, str(tmp), metadata={"format": "pt"})
        tmp.replace(path / WEIGHTS_NAME)
        (path / CONFIG_NAME).write_text(json.dumps({"model": to_dict(self.cfg)}, indent=2))
        self.head.save_extra(path)  # e.g. the token head's action_tokenizer/

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        config: dict | None = None,
    ) -> VLA:
        """``config``: the folder's ``config.json`` when the caller has already read it."""
        path = Path(path)
        if not (path / CONFIG_NAME).exists() or not (path / WEIGHTS_NAME).exists():
            raise ValueError(
                f"{path} is not a vlastack model folder (needs {CONFIG_NAME} and {WEIGHTS_NAME})"
            )
        data = config if config is not None else read_json(path / CONFIG_NAME)
        cfg = model_config_from_dict(data.get("model", data))
        with torch.device("meta"):
            model = cls(cfg)
        state = load_safetensors(path / WEIGHTS_NAME, device=str(device))
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise ValueError(
                f"{path}: weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        model = model.to(device)
        model.head.load_extra(path)
        return model


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu") -> VLA:
    with torch.device(device):
        return VLA(cfg)
