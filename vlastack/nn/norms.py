"""Normalization layers. All compute in fp32 whatever the autocast dtype, then cast back."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Gemma RMSNorm: ``x / rms(x) * (1 + w)`` with ``w`` initialised to zero. [..., D] -> [..., D]."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class AdaRMSNorm(nn.Module):
    """Adaptive RMSNorm (Pi0.5's adaRMS): a dense layer maps the condition c [B, C] to a scale,
    shift and gate per channel; ``x / rms(x) * (1 + scale) + shift``, and the gate multiplies the
    residual branch this norm feeds (``x + f(norm(x)) * gate``).

    ``dense`` is zero-initialised (weight and bias), as openpi/LeRobot initialise its weight: at
    init the norm is a plain RMSNorm and every gated branch is closed. x [B, T, D] (or [B, D]),
    c [B, C] -> (normed [B, T, D] in x's dtype, gate [B, 1, D] (or [B, D]) in x's dtype).
    The modulation is computed in fp32 like the normalization itself.
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: Tensor, cond: Tensor) -> tuple[Tensor, Tensor]:
        assert cond.shape == (x.shape[0], self.dense.in_features), (x.shape, cond.shape)
        with torch.autocast(x.device.type, enabled=False):
            mod = F.linear(cond.float(), self.dense.weight.float(), self.dense.bias.float())
        if x.dim() == 3:
            mod = mod[:, None]
        scale, shift, gate = mod.chunk(3, dim=-1)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + scale) + shift).to(x.dtype), gate.to(x.dtype)


class LayerNorm(nn.LayerNorm):
    """LayerNorm that always normalises in fp32 (SigLIP). [..., D] -> [..., D]."""

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)
