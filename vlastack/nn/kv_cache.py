"""A pre-allocated, fixed-shape key/value cache written by index.

Shapes never change after allocation, so a compiled sampler or decode step sees static shapes
(no ``torch.cat`` growth) and can be captured in a CUDA graph. Attention always reads the whole
buffer; the caller's mask hides slots that are not filled yet.
"""

from __future__ import annotations

import torch
from torch import Tensor


class StaticKVCache:
    """k, v: one [B, kv_heads, max_len, head_dim] buffer per layer.

    Separate tensors, not views of one [layers, ...] tensor: a view shares its base's version
    counter, so writing layer i would invalidate layer j's buffer that autograd saved when training
    runs through the cache (the grounded flow loss does).
    """

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (batch_size, kv_heads, max_len, head_dim)
        self.max_len = max_len
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def mark_static(self) -> StaticKVCache:
        """Tell dynamo the buffers keep their addresses across calls, so a sampler compiled with
        CUDA graphs (mode="reduce-overhead") may write them in place: cudagraph trees refuse to
        capture in-place writes to ordinary inputs. Returns self."""
        for t in (*self.k, *self.v):
            torch._dynamo.mark_static_address(t)
        return self

    def layer(self, layer: int) -> LayerKV:
        """Layer ``layer``'s buffers (the same tensors, no copy). A decoder layer gets this, not
        the cache and its index: code compiled for one layer then serves all of them (no guard on
        the index: fastpath.compile_layers)."""
        return LayerKV(self.k[layer], self.v[layer], self.max_len)


class LayerKV:
    """One layer's k, v buffers [B, kv_heads, max_len, head_dim] of a ``StaticKVCache``."""

    def __init__(self, k: Tensor, v: Tensor, max_len: int) -> None:
        self.k, self.v, self.max_len = k, v, max_len

    def update(self, k: Tensor, v: Tensor, pos: int | Tensor) -> tuple[Tensor, Tensor]:
        """Write k/v [B, kv_heads, T, D] at ``pos`` (int start, or LongTensor [T] of slots).

        Returns the layer's full buffers [B, kv_heads, max_len, D].
        """
        kc, vc = self.k, self.v
        if isinstance(pos, Tensor) and pos.dim() == 0:  # torch.jit.trace turns python ints into 0-d tensors
            pos = int(pos)
        if isinstance(pos, int):
            t = k.shape[2]
            assert pos + t <= self.max_len, f"cache overflow: {pos}+{t} > {self.max_len}"
            kc[:, :, pos : pos + t] = k.to(kc.dtype)
            vc[:, :, pos : pos + t] = v.to(vc.dtype)
        else:
            kc.index_copy_(2, pos, k.to(kc.dtype))
            vc.index_copy_(2, pos, v.to(vc.dtype))
        return kc, vc
