"""Rotary position embedding (HF/Gemma "rotate half" layout), computed in fp32."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RotaryEmbedding(nn.Module):
    """positions [B, T] (int) -> (cos, sin), each fp32 [B, T, head_dim]."""

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        # Recomputed per call (D/2 values, constant-folded under compile) rather than a buffer, so a
        # model built on the meta device and loaded with assign=True needs no re-initialisation.
        exponent = (
            torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=positions.device) / self.head_dim
        )
        inv_freq = 1.0 / (self.theta**exponent)
        freqs = positions.float()[..., None] * inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, D]
        return emb.cos(), emb.sin()


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, heads, T, D], cos/sin [B, T, D] -> [B, heads, T, D] in x's dtype (math in fp32)."""
    xf = x.float()
    out = xf * cos[:, None] + _rotate_half(xf) * sin[:, None]
    return out.to(x.dtype)
