"""OpenVLA-OFT-style parallel decoding (``model.head=oft``): one learned query per action step
goes through the VLM beside the prompt, and an MLP maps each query's hidden state to its action;
L1 regression, every step in one forward pass (Kim et al. 2025, "Fine-Tuning Vision-Language-Action
Models: Optimizing Speed and Success"). No action expert, no tokenizer, no sampling loop.

    vla train model.head=oft model.head_options.hidden=256   # options: config/heads.py OFTOptions

The sequence is [prefix | state token, H action queries]: the prefix attends within itself, the
state token and the queries attend to everything (one bidirectional block after the prefix).
With ``model.grounding.points > 0``: ``GroundedOFTHead`` (``grounded.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig
from vlastack.models.backbone import Backbone, prefix_layout
from vlastack.models.heads.base import ActionOutput, HeadBase


class OFTHead(HeadBase):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg, o, w = cfg, cfg.head_options, cfg.vlm.width
        self.state_proj = nn.Linear(cfg.state_dim, w)
        self.queries = nn.Embedding(cfg.action_horizon, w)
        self.mlp = nn.Sequential(nn.Linear(w, o.hidden), nn.GELU(), nn.Linear(o.hidden, cfg.action_dim))

    def reset_parameters(self, std: float = 0.02) -> None:
        super().reset_parameters(std)
        nn.init.zeros_(self.mlp[-1].weight)  # start at the mean action (normalized 0)

    def predict(self, backbone: Backbone, batch: Batch) -> Tensor:
        """-> actions fp32 [B, H, A] (normalized units)."""
        prefix, pad = backbone.embed_prefix(batch)  # [B, P, W], [B, P]
        b, p = pad.shape
        h = self.cfg.action_horizon
        inputs = torch.cat(
            [self.state_proj(batch["state"])[:, None], self.queries.weight.expand(b, -1, -1)], 1
        )
        starts = torch.zeros(1 + h, dtype=torch.bool, device=pad.device)
        starts[0] = True  # the state token and the queries: one block that sees the whole prefix
        x = torch.cat([prefix, inputs.to(prefix.dtype)], dim=1)
        _, mask, positions = prefix_layout(pad, starts)
        out = backbone.decoder([x, None], positions, mask).vlm
        actions = self.mlp(out[:, p + 1 :]).float()
        assert actions.shape == (b, h, self.cfg.action_dim), actions.shape
        return actions

    def regression_loss(self, actions: Tensor, batch: Batch) -> Tensor:
        """actions fp32 [B, H, A] -> L1 (or MSE) over the real steps and dims, scalar fp32."""
        target = batch["actions"].float()
        w = ((~batch["action_is_pad"])[:, :, None] & batch["action_dim_mask"][:, None]).float()
        err = actions - target
        per = err.abs() if self.cfg.head_options.l1 else err.pow(2)
        return (per * w).sum() / w.sum().clamp(min=1.0)

    def loss(self, backbone: Backbone, batch: Batch, **kwargs: Any) -> dict[str, Tensor]:
        return {"loss": self.regression_loss(self.predict(backbone, batch), batch)}

    def sample(
        self, backbone: Backbone, batch: Batch, noise: Tensor | None = None, **kwargs: Any
    ) -> ActionOutput:
        return ActionOutput(self.predict(backbone, batch))
