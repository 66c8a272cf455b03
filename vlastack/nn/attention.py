"""Attention through ``scaled_dot_product_attention`` with grouped/multi-query key-value heads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor


def gqa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """q [B, H, T, D]; k, v [B, KV, S, D]; mask bool [B, 1, T, S] (True = may attend) -> [B, H, T, D].

    Query heads that share a key/value head are folded into the sequence axis
    ([B, KV, G*T, D]) instead of repeating k/v G times: no extra memory traffic for MQA and it
    works with every SDPA backend, ``torch.export`` and ONNX.
    """
    b, h, t, _ = q.shape
    kv = k.shape[1]
    assert h % kv == 0, (h, kv)
    g = h // kv
    qg = rearrange(q, "b (kv g) t d -> b kv (g t) d", kv=kv)
    if mask is not None:
        assert mask.shape[-2] == t, (mask.shape, q.shape)
        mask = mask[:, :, None].expand(b, 1, g, t, mask.shape[-1]).reshape(b, 1, g * t, mask.shape[-1])
    out = F.scaled_dot_product_attention(qg, k, v.to(qg.dtype), attn_mask=mask)
    return rearrange(out, "b kv (g t) d -> b (kv g) t d", g=g)


def block_causal_mask(pad_mask: Tensor, block_starts: Tensor) -> Tensor:
    """big_vision ``make_attn_mask``: pad_mask bool [B, T] (True = real token), block_starts
    bool/int [B, T] or [T] (True where a new causal block starts) -> bool [B, 1, T, T].

    Token i may attend token j iff j's block is not after i's block and both are real. Each token
    also attends to itself so fully-padded rows stay finite (their outputs are never used).
    """
    cum = block_starts.long().cumsum(-1)
    if cum.dim() == 1:
        cum = cum[None].expand(pad_mask.shape[0], -1)
    allowed = cum[:, None, :] <= cum[:, :, None]
    allowed = allowed & pad_mask[:, None, :] & pad_mask[:, :, None]
    eye = torch.eye(pad_mask.shape[-1], dtype=torch.bool, device=pad_mask.device)
    return (allowed | eye)[:, None]
