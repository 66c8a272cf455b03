"""Grounding add-on of the OFT head (``model.head=oft`` with ``model.grounding.points > 0``).

The same ``GroundingHead`` as the flow and token heads (``grounding.py``) reads the prefix; its
prediction reaches the action queries through the state token, as it reaches the flow expert:

    [images | text]  [state + grounding, q_0 ... q_{H-1}]
     bidirectional    one block that sees the prefix and itself

The prefix runs first, into a static cache (with gradients in training), because the state
token's input depends on the prefix pass's output; the state token and the queries then run
against that cache. Without grounding the OFT head keeps its single-pass layout (``head.py``).
Training feeds the state token the recorded positions plus noise (teacher forcing) and adds the
grounding losses to the L1 loss, as the other grounded heads do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig
from vlastack.models.backbone import Backbone
from vlastack.models.heads.grounding import (
    GroundingHead,
    add_grounding_losses,
    cached_suffix_pass,
    grounded_prefix_pass,
    teacher_forced,
)
from vlastack.models.heads.oft.head import OFTHead


class GroundedOFTHead(OFTHead):
    """The OFT head with a ``GroundingHead`` feeding its state token.

    Weights: ``head.grounding.*`` as in the other grounded heads; ``head.state_proj`` takes S + G
    inputs."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.grounding = GroundingHead.from_config(cfg)
        self.state_proj = nn.Linear(cfg.state_dim + cfg.grounding.dim, cfg.vlm.width)

    def _actions(self, backbone: Backbone, batch: Batch, forced: bool) -> tuple[Tensor, Any]:
        """-> (actions fp32 [B, H, A], (prediction, attention, target) when ``forced``, else None)."""
        h = self.cfg.action_horizon
        cache, hidden, pad = grounded_prefix_pass(self.cfg, backbone, batch, 1 + h)
        pred, look = self.grounding.attend(hidden, pad)
        aux = None
        if forced:
            fed, target = teacher_forced(self.cfg, pred, batch)
            aux = (pred, look, target)
        else:
            fed = pred
        state = torch.cat([batch["state"].float(), fed], dim=-1)
        st = self.state_proj(state.to(self.state_proj.weight.dtype))[:, None]
        b = pad.shape[0]
        x = torch.cat([st, self.queries.weight.expand(b, -1, -1).to(st.dtype)], dim=1)
        starts = torch.zeros(1 + h, dtype=torch.bool, device=pad.device)
        starts[0] = True  # the state token and the queries: one block
        out = cached_suffix_pass(backbone, cache, pad, x, starts)
        actions = self.mlp(out[:, 1:]).float()
        assert actions.shape == (b, h, self.cfg.action_dim), actions.shape
        return actions, aux

    def predict(self, backbone: Backbone, batch: Batch) -> Tensor:
        """-> actions fp32 [B, H, A] (normalized units); the state token reads the head's grounding."""
        return self._actions(backbone, batch, forced=False)[0]

    def loss(self, backbone: Backbone, batch: Batch, **kwargs: Any) -> dict[str, Tensor]:
        actions, aux = self._actions(backbone, batch, forced=True)
        out = {"loss": self.regression_loss(actions, batch)}
        return add_grounding_losses(
            self.cfg, out, aux, batch, "l1_loss" if self.cfg.head_options.l1 else "mse"
        )

    def predict_grounding(self, backbone: Backbone, batch: Batch) -> Tensor:
        """The grounding head's prediction, normalized units. -> fp32 [B, G]."""
        _, hidden, pad = grounded_prefix_pass(self.cfg, backbone, batch, 0)
        return self.grounding(hidden, pad)
