"""Normalization layers. Both compute in fp32 whatever the autocast dtype, then cast back."""

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


class LayerNorm(nn.LayerNorm):
    """LayerNorm that always normalises in fp32 (SigLIP). [..., D] -> [..., D]."""

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)
