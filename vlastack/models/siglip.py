"""SigLIP-style ViT image encoder (pre-LayerNorm, GELU-tanh MLP, learned position embeddings).

Module names follow Hugging Face ``SiglipVisionModel`` so weight import is a prefix rename.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vlastack.nn.mlp import GeluMLP
from vlastack.nn.norms import LayerNorm


class SiglipAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        """[B, T, W] -> [B, T, W], full bidirectional attention."""
        q, k, v = (
            rearrange(p(x), "b t (h d) -> b h t d", h=self.heads)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(rearrange(out, "b h t d -> b t (h d)"))


class SiglipBlock(nn.Module):
    def __init__(self, width: int, heads: int, mlp_dim: int, eps: float) -> None:
        super().__init__()
        self.layer_norm1 = LayerNorm(width, eps=eps)
        self.self_attn = SiglipAttention(width, heads)
        self.layer_norm2 = LayerNorm(width, eps=eps)
        self.mlp = GeluMLP(width, mlp_dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


def sincos_2d(grid: int, dim: int) -> Tensor:
    """Fixed 2D sin-cos position table (MAE): -> fp32 [grid*grid, dim], row-major patches."""
    assert dim % 4 == 0, dim
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    ys, xs = torch.meshgrid(
        torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32), indexing="ij"
    )
    parts = [f(c.flatten()[:, None] * omega[None]) for c in (ys, xs) for f in (torch.sin, torch.cos)]
    return torch.cat(parts, dim=1)


class SiglipEncoder(nn.Module):
    """images [B, 3, S, S] (float in [-1, 1]) -> patch features [B, (S/p)^2, width]."""

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        width: int,
        depth: int,
        heads: int,
        mlp_dim: int,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.image_size, self.patch_size = image_size, patch_size
        self.num_patches = (image_size // patch_size) ** 2
        self.patch_embedding = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size)
        self.position_embedding = nn.Embedding(self.num_patches, width)
        self.layers = nn.ModuleList(SiglipBlock(width, heads, mlp_dim, eps) for _ in range(depth))
        self.post_layernorm = LayerNorm(width, eps=eps)

    def forward(self, images: Tensor) -> Tensor:
        _, c, h, w = images.shape
        assert (c, h, w) == (3, self.image_size, self.image_size), (
            f"expected [B, 3, {self.image_size}, {self.image_size}], got {tuple(images.shape)}"
        )
        x = self.patch_embedding(images.to(self.patch_embedding.weight.dtype))
        x = rearrange(x, "b d h w -> b (h w) d") + self.position_embedding.weight[None].to(x.dtype)
        for layer in self.layers:
            x = layer(x)
        return self.post_layernorm(x)

    @torch.no_grad()
    def init_position_embedding(self) -> None:
        """Learned position embeddings start from the 2D sin-cos table, so a model trained from
        scratch knows where each patch is from step one (imported weights overwrite this)."""
        grid = self.image_size // self.patch_size
        w = self.position_embedding.weight
        if w.device.type != "meta" and w.shape[1] % 4 == 0:
            w.copy_(sincos_2d(grid, w.shape[1]).to(w.dtype))


def preprocess_images(images: Tensor) -> Tensor:
    """uint8 [..., 3, H, W] in 0..255 -> float32 in [-1, 1] (SigLIP's mean=std=0.5); floats pass through."""
    if images.dtype == torch.uint8:
        return images.float() * (2.0 / 255.0) - 1.0
    return images
