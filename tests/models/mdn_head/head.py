"""A mixture-density head (``model.head=mdn``): OFT's action queries through the VLM, each query's
hidden state -> K diagonal Gaussians over its action; trained by negative log-likelihood, sampled
from the policy's seeded generator (or the most likely component's mean at temperature 0)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig
from vlastack.config.errors import _check
from vlastack.models.backbone import Backbone, prefix_layout
from vlastack.models.heads.base import ActionOutput, HeadBase


@dataclass(frozen=True)
class MDNOptions:
    components: int = 4
    temperature: float = 0.0  # 0: the most likely component's mean

    def __post_init__(self) -> None:
        _check(self.components >= 1, "components", f"must be >= 1, got {self.components}")
        _check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")


class MDNHead(HeadBase):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg, w, k, a = cfg, cfg.vlm.width, cfg.head_options.components, cfg.action_dim
        self.state_proj = nn.Linear(cfg.state_dim, w)
        self.queries = nn.Embedding(cfg.action_horizon, w)
        self.out = nn.Linear(w, k * (1 + 2 * a))  # logit, mean [A], log std [A] per component

    def mixture(self, backbone: Backbone, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """-> logits [B, H, K], means [B, H, K, A], log stds [B, H, K, A], fp32."""
        prefix, pad = backbone.embed_prefix(batch)
        b, p = pad.shape
        c, k = self.cfg, self.cfg.head_options.components
        inputs = torch.cat(
            [self.state_proj(batch["state"])[:, None], self.queries.weight.expand(b, -1, -1)], 1
        )
        starts = torch.zeros(1 + c.action_horizon, dtype=torch.bool, device=pad.device)
        starts[0] = True
        _, mask, positions = prefix_layout(pad, starts)
        h = backbone.decoder([torch.cat([prefix, inputs.to(prefix.dtype)], 1), None], positions, mask).vlm
        o = self.out(h[:, p + 1 :]).float().view(b, c.action_horizon, k, 1 + 2 * c.action_dim)
        return o[..., 0], o[..., 1 : 1 + c.action_dim], o[..., 1 + c.action_dim :].clamp(-5, 2)

    def loss(self, backbone: Backbone, batch: Batch, **kwargs: Any) -> dict[str, Tensor]:
        logits, mean, log_std = self.mixture(backbone, batch)
        dims = batch["action_dim_mask"][:, None, None].float()  # padded dims count for nothing
        z = (batch["actions"].float()[:, :, None] - mean) / log_std.exp()
        comp = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)) * dims
        nll = -torch.logsumexp(logits.log_softmax(-1) + comp.sum(-1), dim=-1)  # [B, H]
        real = (~batch["action_is_pad"]).float()
        return {"loss": (nll * real).sum() / real.sum().clamp(min=1.0)}

    def sample(
        self, backbone: Backbone, batch: Batch, noise: Tensor | None = None, generator=None, **kwargs: Any
    ) -> ActionOutput:
        logits, mean, log_std = self.mixture(backbone, batch)
        t = self.cfg.head_options.temperature
        if t == 0:
            pick = logits.argmax(-1)
        else:
            u = torch.rand(logits.shape, generator=generator, device=logits.device)
            pick = (logits / t - (-u.clamp_min(1e-12).log()).log()).argmax(-1)  # Gumbel-max
        sel = pick[..., None, None].expand(*pick.shape, 1, mean.shape[-1])
        mu, sd = mean.gather(2, sel).squeeze(2), log_std.gather(2, sel).squeeze(2).exp()
        if t > 0:
            mu = mu + t * sd * torch.randn(mu.shape, generator=generator, device=mu.device)
        return ActionOutput(mu)
