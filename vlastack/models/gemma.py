"""Gemma-style decoder shared by the VLM and the action expert ("mixture of transformers").

Each ``JointLayer`` holds one ``DecoderBlock`` per expert (its own norms, QKV/O projections and
MLP). Attention runs jointly over the concatenated tokens of both experts, so the action expert
reads the VLM's keys/values in every layer (Pi0). With ``expert=None`` this is a plain Gemma LM.
Module names follow Hugging Face Gemma so weight import is a prefix rename.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from einops import rearrange
from torch import Tensor, nn

from vlastack.config import DecoderConfig
from vlastack.nn.attention import gqa_attention
from vlastack.nn.kv_cache import LayerKV, StaticKVCache
from vlastack.nn.mlp import GeGLU
from vlastack.nn.norms import AdaRMSNorm, RMSNorm
from vlastack.nn.rope import RotaryEmbedding, apply_rope


class AttentionProj(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(width, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(width, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(width, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, width, bias=False)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[B, T, W] -> q [B, H, T, D], k/v [B, KV, T, D]."""
        q = rearrange(self.q_proj(x), "b t (h d) -> b h t d", d=self.head_dim)
        k = rearrange(self.k_proj(x), "b t (h d) -> b h t d", d=self.head_dim)
        v = rearrange(self.v_proj(x), "b t (h d) -> b h t d", d=self.head_dim)
        return q, k, v


class DecoderOutput(NamedTuple):
    """What ``JointDecoder`` returns: final-normed outputs per expert (None where that expert had no
    tokens or its output was not asked for) and, with ``vlm_hidden_at``, the VLM residual stream
    after that layer (un-normed)."""

    vlm: Tensor | None
    expert: Tensor | None
    hidden: Tensor | None = None


def make_norm(width: int, eps: float, cond_dim: int | None) -> RMSNorm | AdaRMSNorm:
    """A Gemma RMSNorm, or with ``cond_dim`` an adaptive one whose scale, shift and residual gate
    come from a conditioning vector (Pi0.5's flow time)."""
    return RMSNorm(width, eps) if cond_dim is None else AdaRMSNorm(width, cond_dim, eps)


def _norm(norm: nn.Module, x: Tensor, cond: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """-> (normed x, residual gate or None). A plain norm ignores ``cond``."""
    if isinstance(norm, AdaRMSNorm):
        assert cond is not None, "an adaptive norm needs its conditioning input (cond)"
        return norm(x, cond)
    return norm(x), None


def _residual(x: Tensor, y: Tensor, gate: Tensor | None) -> Tensor:
    return x + y if gate is None else x + y * gate


class DecoderBlock(nn.Module):
    """One expert's weights in one layer: pre-norm attention + pre-norm GeGLU MLP.

    With ``cond_dim`` both norms are adaptive (``AdaRMSNorm``) and gate their residual branch.
    """

    def __init__(self, cfg: DecoderConfig, cond_dim: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = make_norm(cfg.width, cfg.norm_eps, cond_dim)
        self.self_attn = AttentionProj(cfg.width, cfg.heads, cfg.kv_heads, cfg.head_dim)
        self.post_attention_layernorm = make_norm(cfg.width, cfg.norm_eps, cond_dim)
        self.mlp = GeGLU(cfg.width, cfg.mlp_dim)

    def qkv(self, x: Tensor, cond: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """x [B, T, W] -> q [B, H, T, D], k/v [B, KV, T, D] and the attention residual's gate."""
        h, gate = _norm(self.input_layernorm, x, cond)
        return (*self.self_attn.qkv(h), gate)

    def finish(
        self, x: Tensor, attn: Tensor, cond: Tensor | None = None, gate: Tensor | None = None
    ) -> Tensor:
        """x [B, T, W], attn [B, T, H*D] -> [B, T, W]. ``gate``: from ``qkv``."""
        x = _residual(x, self.self_attn.o_proj(attn), gate)
        h, gate = _norm(self.post_attention_layernorm, x, cond)
        return _residual(x, self.mlp(h), gate)


class JointLayer(nn.Module):
    def __init__(
        self, index: int, vlm: DecoderConfig, expert: DecoderConfig | None, expert_cond_dim: int | None = None
    ) -> None:
        super().__init__()
        self.index = index
        self.vlm = DecoderBlock(vlm)
        self.expert = DecoderBlock(expert, expert_cond_dim) if expert is not None else None

    def forward(
        self,
        xs: list[Tensor | None],
        *,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor,
        cache: LayerKV | None = None,
        cache_pos: int | Tensor = 0,
        attend_cache: bool = True,
        vlm_output: bool = True,
        cond: list[Tensor | None] | None = None,
    ) -> list[Tensor | None]:
        """xs: per-expert tokens [B, T_e, W_e] or None; cos/sin [B, T, D] for the T = sum(T_e) query
        tokens; mask bool [B, 1, T, S] over S keys (S = T, or the cache length when attending it).

        With a cache (this layer's buffers, ``StaticKVCache.layer(i)``), its k/v are written at
        ``cache_pos``; ``attend_cache`` chooses whether attention reads the whole cache buffer
        (decode/denoise) or only these tokens (prefill).
        ``vlm_output=False`` skips the VLM tokens' attention output and MLP: in the last layer of the
        flow model only their keys/values are ever read. ``cond``: per-expert conditioning
        [B, C_e] or None (openpi's ``adarms_cond``), read by adaptive norms only.
        """
        blocks = [self.vlm, self.expert]
        conds = cond or [None, None]
        qs, ks, vs, gates = [], [], [], [None, None]
        n_kv_only = xs[0].shape[1] if (xs[0] is not None and not vlm_output) else 0
        for i, (block, x) in enumerate(zip(blocks, xs)):
            if x is None:
                continue
            q, k, v, gates[i] = block.qkv(x, conds[i])
            qs.append(q), ks.append(k), vs.append(v)
        if n_kv_only:  # queries of the VLM tokens are not needed
            qs = qs[1:]
            mask = mask[:, :, n_kv_only:]
            cos_q, sin_q = cos[:, n_kv_only:], sin[:, n_kv_only:]
        else:
            cos_q, sin_q = cos, sin
        # Concatenating the experts' (fixed-size) token groups, not growing a sequence.
        outs: list[Tensor | None] = [None, None]
        if not qs:  # only keys/values were wanted (last layer of a flow-model prefill)
            k, v = apply_rope(ks[0], cos, sin), vs[0]
            if cache is not None:
                cache.update(k, v, cache_pos)
            return outs
        q, k, v = (torch.cat(t, dim=2) if len(t) > 1 else t[0] for t in (qs, ks, vs))
        q, k = apply_rope(q, cos_q, sin_q), apply_rope(k, cos, sin)
        if cache is not None:
            kc, vc = cache.update(k, v, cache_pos)
            if attend_cache:
                k, v = kc, vc
        out = rearrange(gqa_attention(q, k, v, mask), "b h t d -> b t (h d)")
        start = 0
        for i, (block, x) in enumerate(zip(blocks, xs)):
            if x is None or (i == 0 and n_kv_only):
                continue
            n = x.shape[1]
            outs[i] = block.finish(x, out[:, start : start + n], conds[i], gates[i])
            start += n
        return outs


class JointDecoder(nn.Module):
    """Token embeddings + ``depth`` joint layers + a final norm per expert. The LM head is tied.

    ``expert_cond_dim``: the expert's norms (final norm included) are adaptive, conditioned on a
    [B, expert_cond_dim] vector passed as ``cond=[None, c]`` (Pi0.5).
    """

    def __init__(
        self, vlm: DecoderConfig, expert: DecoderConfig | None, expert_cond_dim: int | None = None
    ) -> None:
        super().__init__()
        self.vlm_cfg, self.expert_cfg = vlm, expert
        self.embed_tokens = nn.Embedding(vlm.vocab_size, vlm.width)
        self.layers = nn.ModuleList(JointLayer(i, vlm, expert, expert_cond_dim) for i in range(vlm.depth))
        self.norm = RMSNorm(vlm.width, vlm.norm_eps)
        self.expert_norm = (
            make_norm(expert.width, expert.norm_eps, expert_cond_dim) if expert is not None else None
        )
        self.rope = RotaryEmbedding(vlm.head_dim, vlm.rope_theta)

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> [B, T, W], scaled by sqrt(W) as Gemma does (in the embedding dtype)."""
        x = self.embed_tokens(tokens)
        return x * torch.tensor(math.sqrt(self.vlm_cfg.width), dtype=x.dtype)

    def logits(self, h: Tensor) -> Tensor:
        """Final-normed VLM hidden states [B, T, W] -> fp32 logits [B, T, vocab] (tied weights)."""
        return (h @ self.embed_tokens.weight.t().to(h.dtype)).float()

    def new_cache(
        self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device | str
    ) -> StaticKVCache:
        c = self.vlm_cfg
        return StaticKVCache(c.depth, batch_size, c.kv_heads, max_len, c.head_dim, dtype, device)

    def forward(
        self,
        xs: list[Tensor | None],
        positions: Tensor,
        mask: Tensor,
        *,
        cache: StaticKVCache | None = None,
        cache_pos: int | Tensor = 0,
        attend_cache: bool = True,
        vlm_output: bool = True,
        vlm_hidden_at: int | None = None,
        cond: list[Tensor | None] | None = None,
    ) -> DecoderOutput:
        """xs = [vlm tokens [B, Tv, Wv] | None, expert tokens [B, Te, We] | None];
        positions [B, Tv+Te]; mask bool [B, 1, Tv+Te, S] -> final-normed outputs per expert.

        ``vlm_output=False``: the VLM tokens' final outputs are not needed (flow head), so the last
        layer computes only their keys/values and the VLM output is None.
        ``vlm_hidden_at=i``: also return the VLM tokens' residual stream after layer ``i``
        (un-normed, [B, Tv, Wv]) as ``hidden`` (the grounding head reads it).
        ``cond=[None, c]``: the expert's conditioning [B, C] for adaptive norms (Pi0.5).
        """
        assert len(xs) == 2 and any(x is not None for x in xs)
        assert xs[1] is None or self.expert_cfg is not None, "this decoder has no action expert"
        cos, sin = self.rope(positions)
        last = len(self.layers) - 1
        hidden = None
        for i, layer in enumerate(self.layers):
            xs = layer(
                xs,
                cos=cos,
                sin=sin,
                mask=mask,
                cache=cache.layer(i) if cache is not None else None,
                cache_pos=cache_pos,
                attend_cache=attend_cache,
                vlm_output=vlm_output or i < last,
                cond=cond,
            )
            if i == vlm_hidden_at:
                hidden = xs[0]
        conds = cond or [None, None]
        norms = [self.norm, self.expert_norm]
        outs = [_norm(n, x, c)[0] if x is not None else None for n, x, c in zip(norms, xs, conds)]
        if vlm_hidden_at is not None:
            assert hidden is not None, f"no VLM output at layer {vlm_hidden_at}"
        return DecoderOutput(outs[0], outs[1], hidden)

    def unused_by_flow_head(self) -> list[str]:
        """Parameter names that cannot affect a flow-head loss: the last VLM layer's query, output
        and MLP weights and the VLM final norm (only the last layer's keys/values are read)."""
        last = f"layers.{len(self.layers) - 1}.vlm."
        names = [f"{last}self_attn.q_proj.weight", f"{last}self_attn.o_proj.weight", "norm.weight"]
        names += [
            f"{last}{n}" for n, _ in self.layers[-1].vlm.named_parameters() if n.startswith(("mlp.", "post_"))
        ]
        return names
