"""Grounding add-on of the token head (``model.head=tokens`` with ``model.grounding.points > 0``).

The flow head went from 10% to 83% on the built-in suite once a grounding head said where the
named object is (``grounding.py``); the token head had no such pathway and scored 1%. Here the
same ``GroundingHead`` reads the prefix and its prediction reaches the action tokens the way it
reaches the flow expert, through the state token:

    [images | text]  [state + grounding]  [a_0 ... a_{L-1}]
     bidirectional    own block            causal (autoregressive) or one block (parallel)

The prefix runs first, into a static cache (with gradients in training), because the state
token's input depends on the prefix pass's last-layer output; the state token and the action
tokens then run against that cache, as the flow head's suffix does. Without grounding the token
head keeps its single-pass layout (the state token inside the bidirectional prompt block).

Training feeds the state token the recorded positions plus N(0, ``grounding.noise``^2) (teacher
forcing, as the flow head) and adds ``grounding.weight`` x the head's MSE and
``grounding.attend_weight`` x the attention loss to the token loss.
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
from vlastack.models.heads.tokens.head import TokenHead
from vlastack.nn.kv_cache import StaticKVCache


class GroundedTokenHead(TokenHead):
    """The token head with a ``GroundingHead`` feeding its (continuous) state token.

    Weights: ``head.grounding.*`` as in the grounded flow head; ``head.state_proj`` takes S + 3K
    inputs."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.grounding = GroundingHead.from_config(cfg)
        self.state_proj = nn.Linear(cfg.state_dim + cfg.grounding.dim, cfg.vlm.width)

    # ------------------------------------------------------------------ the two passes

    def prefix_pass(
        self, backbone: Backbone, batch: Batch, suffix_len: int
    ) -> tuple[StaticKVCache, Tensor, Tensor]:
        """[images | text] into a fresh cache of P + ``suffix_len`` slots. -> (cache, the grounding
        layer's residual stream [B, P, W], prefix pad bool [B, P])."""
        return grounded_prefix_pass(self.cfg, backbone, batch, suffix_len)

    def suffix_pass(
        self,
        backbone: Backbone,
        cache: StaticKVCache,
        pad: Tensor,
        state_in: Tensor,
        actions_in: Tensor,
        causal: bool,
    ) -> Tensor:
        """[state token | action inputs [B, T, W]] against the cached prefix (pad [B, P]).
        state_in [B, S + G]. -> final-normed hidden [B, 1 + T, W] (position 0 predicts token 0)."""
        st = self.state_proj(state_in.to(self.state_proj.weight.dtype))[:, None]
        x = torch.cat([st.to(actions_in.dtype), actions_in], dim=1)
        t = x.shape[1]
        starts = torch.zeros(t, dtype=torch.bool, device=pad.device)
        starts[: (t if causal else min(t, 2))] = True  # state; then each action (causal) or one block
        return cached_suffix_pass(backbone, cache, pad, x, starts)

    # ------------------------------------------------------------------ TokenHead hooks

    def _run(self, backbone: Backbone, batch: Batch, actions_in: Tensor, causal: bool) -> Tensor:
        """Inference layout: the state token reads the head's own prediction."""
        cache, hidden, pad = self.prefix_pass(backbone, batch, 1 + actions_in.shape[1])
        state = torch.cat([batch["state"].float(), self.grounding(hidden, pad)], dim=-1)
        return self.suffix_pass(backbone, cache, pad, state, actions_in, causal)

    def train_run(
        self, backbone: Backbone, batch: Batch, actions_in: Tensor, causal: bool
    ) -> tuple[Tensor, Any]:
        """Teacher forcing: the state token reads the recorded positions plus noise."""
        cache, hidden, pad = self.prefix_pass(backbone, batch, 1 + actions_in.shape[1])
        pred, look = self.grounding.attend(hidden, pad)
        forced, target = teacher_forced(self.cfg, pred, batch)
        state = torch.cat([batch["state"].float(), forced], dim=-1)
        return self.suffix_pass(backbone, cache, pad, state, actions_in, causal), (pred, look, target)

    def extra_losses(self, out: dict[str, Tensor], aux: Any, batch: Batch) -> dict[str, Tensor]:
        return add_grounding_losses(self.cfg, out, aux, batch, "token_loss")

    def prefill(self, backbone: Backbone, batch: Batch) -> tuple[StaticKVCache, Tensor, Tensor, Tensor]:
        """Prefix pass, then the state token (with the head's grounding) into slot P. -> (cache of
        P + 1 + num_steps slots, logits [B, V] for token 0, prompt pad [B, P + 1], real prompt
        tokens [B]), the same contract as ``TokenHead.prefill``."""
        cache, hidden, pad = self.prefix_pass(backbone, batch, 1 + self.num_steps)
        state = torch.cat([batch["state"].float(), self.grounding(hidden, pad)], dim=-1)
        empty = hidden.new_zeros(pad.shape[0], 0, self.cfg.vlm.width)
        h = self.suffix_pass(backbone, cache, pad, state, empty, causal=True)
        prompt_pad = torch.cat([pad, pad.new_ones(pad.shape[0], 1)], dim=1)
        return cache, self.logits(backbone, h[:, -1]), prompt_pad, prompt_pad.long().sum(-1)

    def predict_grounding(self, backbone: Backbone, batch: Batch) -> Tensor:
        """The grounding head's prediction, normalized units. -> fp32 [B, G]."""
        _, hidden, pad = self.prefix_pass(backbone, batch, 0)
        return self.grounding(hidden, pad)
