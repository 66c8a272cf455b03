"""Inference fast path: functions that turn a trained flow VLA into an inference-only model, and
the whole sampler (prefix pass + every Euler step) as one static function for CUDA-graph capture.

    model = prepare_for_inference(model, torch.bfloat16)   # in place; returns the model
    sampler = StaticSampler(model, graph=True)             # CUDA: captured on the first call
    actions = sampler(batch, noise)                        # fp32 [B, H, A], as model.sample_actions

What ``prepare_for_inference`` does (each step is its own function; the modules of models/ and nn/
are unchanged, the model's submodules are swapped for inference ones):

- ``fuse_projections``: q/k/v -> one ``qkv_proj`` and gate/up -> one ``gate_up_proj`` (exact
  concatenation) in every Gemma block, and q/k/v in every SigLIP block: one GEMM instead of three.
- the same pass folds each plain norm's scale into the fused linear that reads it: Gemma's
  ``x / rms(x) * (1 + w)`` -> ``UnitRMSNorm`` + ``W * (1 + w)`` (exact up to rounding), and
  SigLIP's LayerNorm affine -> the next linear's weight and bias. Adaptive norms (Pi0.5's expert)
  are conditioned on the time and are not folded; the final norms (LM head, action head) neither.
- ``precompute_time``: the flow time only takes the ``num_steps`` values of the fixed Euler
  schedule, so the time branch becomes a table computed once in fp32: pi0's sinusoid + time MLP
  input half -> a bias row per step; pi0.5's sinusoid + time MLP + every adaptive norm's dense
  layer -> one modulation row per step and norm, selected by a one-hot step vector (an exact
  matrix product). pi0 also keeps the row of time 0, for training-time real-time chunking (the
  committed actions are fed clean, at time 0: ``StaticSampler(prefix=True)``). The adaptive
  norms' own dense layers are kept beside the tables: samplers off the fixed schedule (real-time
  chunking's guided sampling, bidirectional decoding) run the model's generic path inside
  ``generic_time(model)``, which swaps them back in.
- weights cast to ``dtype`` (stored, not autocast over fp32); the time tables stay fp32 (rule:
  norms and time embeddings in fp32).

Refuses LoRA-wrapped linears (merge them first: ``nn.lora.merge_lora`` + ``remove_lora``).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vlastack.models.gemma import AttentionProj, DecoderBlock
from vlastack.models.heads.flow.head import FlowHead, sincos_time_embedding
from vlastack.models.siglip import SiglipAttention, SiglipBlock
from vlastack.nn.compile import allow_recompiles
from vlastack.nn.kv_cache import StaticKVCache
from vlastack.nn.mlp import GeGLU
from vlastack.nn.norms import AdaRMSNorm, LayerNorm, RMSNorm

PREPARED_ATTR = "fast_time"  # the submodule precompute_time adds (marks an inference-only model)


# ----------------------------------------------------------------------------- inference modules


class UnitRMSNorm(nn.Module):
    """``x / rms(x)`` in fp32, cast back: an RMSNorm whose ``(1 + w)`` went into the next linear."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class UnitLayerNorm(nn.Module):
    """LayerNorm without affine, in fp32: its weight and bias went into the next linear."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.float(), (self.dim,), None, None, self.eps).to(x.dtype)


def _plain(lin: nn.Module, name: str) -> nn.Linear:
    if type(lin) is not nn.Linear:
        raise ValueError(
            f"{name} is a {type(lin).__name__}, not nn.Linear: merge LoRA adapters before "
            "prepare_for_inference (vlastack.nn.lora.merge_lora then remove_lora)"
        )
    return lin


def _fused_linear(parts: list[nn.Linear], scale: Tensor | None, shift: Tensor | None = None) -> nn.Linear:
    """One Linear computing ``cat([p(norm) for p in parts])`` for ``norm = unit * scale + shift``
    (scale/shift: the folded norm's affine, or None). Math in fp32, stored in the parts' dtype."""
    w = torch.cat([p.weight.detach().float() for p in parts])
    has_bias = parts[0].bias is not None or shift is not None
    b = torch.cat([p.bias.detach().float() for p in parts]) if parts[0].bias is not None else None
    if shift is not None:  # W (u*g + s) + b = (W g) u + (W s + b)
        extra = w @ shift.float()
        b = extra if b is None else b + extra
    if scale is not None:
        w = w * scale.float()[None]
    ref = parts[0].weight
    out = nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        out.weight.copy_(w)
        if has_bias:
            out.bias.copy_(b)
    out.requires_grad_(False)
    return out


class FusedAttentionProj(nn.Module):
    """``AttentionProj`` with one ``qkv_proj`` (same ``qkv`` / ``o_proj`` interface)."""

    def __init__(self, src: AttentionProj, scale: Tensor | None) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = src.heads, src.kv_heads, src.head_dim
        parts = [_plain(getattr(src, n), n) for n in ("q_proj", "k_proj", "v_proj")]
        self.qkv_proj = _fused_linear(parts, scale)
        self.o_proj = src.o_proj

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[B, T, W] -> q [B, H, T, D], k/v [B, KV, T, D]."""
        d = self.head_dim
        q, k, v = self.qkv_proj(x).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        return tuple(rearrange(t, "b t (h d) -> b h t d", d=d) for t in (q, k, v))


class FusedGeGLU(nn.Module):
    """``GeGLU`` with one ``gate_up_proj``: down(gelu_tanh(gate) * up). [..., D] -> [..., D]."""

    def __init__(self, src: GeGLU, scale: Tensor | None) -> None:
        super().__init__()
        parts = [_plain(src.gate_proj, "gate_proj"), _plain(src.up_proj, "up_proj")]
        self.gate_up_proj = _fused_linear(parts, scale)
        self.down_proj = src.down_proj

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class FusedSiglipAttention(nn.Module):
    """``SiglipAttention`` with one ``qkv_proj`` (LayerNorm affine folded in). [B, T, W] -> [B, T, W]."""

    def __init__(self, src: SiglipAttention, norm: LayerNorm) -> None:
        super().__init__()
        self.heads = src.heads
        parts = [_plain(getattr(src, n), n) for n in ("q_proj", "k_proj", "v_proj")]
        self.qkv_proj = _fused_linear(parts, norm.weight, norm.bias)
        self.out_proj = src.out_proj

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = (rearrange(t, "b t (h d) -> b h t d", h=self.heads) for t in self.qkv_proj(x).chunk(3, -1))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(rearrange(out, "b h t d -> b t (h d)"))


# ----------------------------------------------------------------------------- transforms


def _fuse_decoder_block(block: DecoderBlock) -> None:
    n1, n2 = block.input_layernorm, block.post_attention_layernorm
    s1 = 1.0 + n1.weight.detach().float() if type(n1) is RMSNorm else None
    s2 = 1.0 + n2.weight.detach().float() if type(n2) is RMSNorm else None
    block.self_attn = FusedAttentionProj(block.self_attn, s1)
    block.mlp = FusedGeGLU(block.mlp, s2)
    if s1 is not None:
        block.input_layernorm = UnitRMSNorm(n1.eps)
    if s2 is not None:
        block.post_attention_layernorm = UnitRMSNorm(n2.eps)


def _fuse_siglip_block(block: SiglipBlock) -> None:
    n1, n2 = block.layer_norm1, block.layer_norm2
    block.self_attn = FusedSiglipAttention(block.self_attn, n1)
    block.mlp.fc1 = _fused_linear([_plain(block.mlp.fc1, "fc1")], n2.weight, n2.bias)
    block.layer_norm1 = UnitLayerNorm(n1.normalized_shape[0], n1.eps)
    block.layer_norm2 = UnitLayerNorm(n2.normalized_shape[0], n2.eps)


@torch.no_grad()
def fuse_projections(model: nn.Module) -> nn.Module:
    """Fused QKV and gate/up projections with the plain norms folded in, in place (see module
    docstring). ``model.sample`` still works and gives the same actions. Returns ``model``."""
    if getattr(model, "_fused", False):
        return model
    for layer in model.decoder.layers:
        for block in (layer.vlm, layer.expert):
            if block is not None:
                _fuse_decoder_block(block)
    for block in model.vision.layers:
        _fuse_siglip_block(block)
    model._fused = True
    return model


class TimeTables(nn.Module):
    """The flow time branch for a fixed Euler schedule of ``num_steps`` steps.

    ``rows`` [num_steps, X]: pi0: the time MLP input layer's time half plus its bias, per step
    (X = expert width; ``act_in`` is the action half; ``zero_row`` [X] the same at time 0, for
    committed actions fed clean); pi0.5: one-hot step vectors (X = num_steps) that select each
    adaptive norm's precomputed modulation row.
    """

    def __init__(
        self,
        num_steps: int,
        rows: Tensor,
        act_in: nn.Linear | None,
        dense: list[nn.Linear] | None = None,
        zero_row: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.num_steps = num_steps
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("zero_row", zero_row, persistent=False)
        self.act_in = act_in
        # pi0.5: each adaptive norm's original dense layer, in the decoder's module order, for
        # ``generic_time`` (the norms hold the step tables)
        self.dense = None if dense is None else nn.ModuleList(dense)


def _ada_norms(model: nn.Module) -> list[AdaRMSNorm]:
    return [m for m in model.decoder.modules() if isinstance(m, AdaRMSNorm)]


@contextmanager
def generic_time(model: nn.Module) -> Iterator[nn.Module]:
    """Within this context a prepared pi0.5 model's adaptive norms hold their original dense
    layers again (time vector [B, We] in, not a one-hot step), so ``model.sample``-style samplers
    that are not the fixed Euler schedule work on it; the step tables return on exit (a captured
    CUDA graph keeps pointing at them). A no-op for pi0, token heads and unprepared models. The
    caller serialises access (``Policy`` holds its lock)."""
    tables = getattr(model, PREPARED_ATTR, None)
    if tables is None or tables.dense is None:
        yield model
        return
    norms = _ada_norms(model)
    steps = [n.dense for n in norms]
    for n, d in zip(norms, tables.dense, strict=True):
        n.dense = d
    try:
        yield model
    finally:
        for n, d in zip(norms, steps, strict=True):
            n.dense = d


def schedule(num_steps: int) -> list[float]:
    """The Euler times ``FlowHead.sample`` uses: 1, 1 - 1/n, ..., 1/n."""
    dt = -1.0 / num_steps
    return [1.0 + i * dt for i in range(num_steps)]


@torch.no_grad()
def precompute_time(model: nn.Module, num_steps: int | None = None) -> nn.Module:
    """Replace the flow time branch with per-step tables (see module docstring), in place.
    Computed in fp32 from the current weights. Returns ``model``."""
    head = model.head
    if not isinstance(head, FlowHead):
        raise ValueError(f"precompute_time needs a flow head, got {type(head).__name__}")
    if hasattr(model, PREPARED_ATTR):
        raise ValueError("the time branch is already precomputed (prepare_for_inference runs once)")
    c = model.cfg
    n = num_steps or c.head_options.num_denoise_steps
    dev = head.action_in_proj.weight.device
    t = torch.tensor(schedule(n), dtype=torch.float32, device=dev)
    temb = sincos_time_embedding(
        t, c.expert.width, c.head_options.time_min_period, c.head_options.time_max_period
    )  # [n, We]

    def lin(m: nn.Linear, x: Tensor) -> Tensor:
        return F.linear(x, m.weight.float(), None if m.bias is None else m.bias.float())

    if c.adarms:
        cond = F.silu(lin(head.time_mlp_out, F.silu(lin(head.time_mlp_in, temb))))  # [n, We]
        originals = []
        for norm in _ada_norms(model):
            table = lin(norm.dense, cond)  # [n, 3D]: scale, shift, gate per step
            dense = nn.Linear(n, table.shape[1], device=dev, dtype=torch.float32)
            dense.weight.copy_(table.t()), dense.bias.zero_()
            originals.append(norm.dense.requires_grad_(False))
            norm.dense = dense.requires_grad_(False)
        tables = TimeTables(n, torch.eye(n, device=dev), None, originals)
    else:
        w = c.expert.width
        m = _plain(head.action_time_mlp_in, "action_time_mlp_in")  # input: cat([action, time])
        t0 = torch.zeros(1, device=dev)
        temb = torch.cat(
            [
                temb,
                sincos_time_embedding(t0, w, c.head_options.time_min_period, c.head_options.time_max_period),
            ]
        )
        bias = temb @ m.weight[:, w:].float().t() + m.bias.float()  # [n + 1, We]: the steps, time 0
        act_in = nn.Linear(w, w, bias=False, device=dev, dtype=m.weight.dtype)
        act_in.weight.copy_(m.weight[:, :w])
        tables = TimeTables(n, bias[:n], act_in.requires_grad_(False), zero_row=bias[n])
    model.add_module(PREPARED_ATTR, tables)
    return model


def _cast_keep_tables(model: nn.Module, dtype: torch.dtype) -> None:
    """Weights to ``dtype``; adaptive norm tables (pi0.5) stay fp32 (they are norm modulations).
    The norms' original dense layers (``generic_time``) are cast: AdaRMSNorm computes in fp32
    anyway, and they are ~3% of pi0.5's weights."""
    keep = [m.dense for m in model.modules() if isinstance(m, AdaRMSNorm)]
    saved = [(d, d.weight.data, d.bias.data) for d in keep]
    model.to(dtype)
    for d, w, b in saved:
        d.weight.data, d.bias.data = w.float(), b.float()


@torch.no_grad()
def prepare_for_inference(
    model: nn.Module, dtype: torch.dtype = torch.bfloat16, num_steps: int | None = None
) -> nn.Module:
    """Fuse, fold, precompute the time branch for ``num_steps`` (default the config's) and store
    the weights in ``dtype``, in place; the model is then inference-only (eval, no grads). Token
    heads get the fusions and the cast only (their sampler is unchanged). Returns ``model``."""
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    if hasattr(model, PREPARED_ATTR):  # prepared already (e.g. by a bench before Policy(fast=True))
        have = model.head.action_in_proj.weight.dtype
        if have != dtype:
            raise ValueError(f"the model was prepared for {have}, not {dtype}: prepare a fresh copy")
        return model
    model.eval().requires_grad_(False)
    fuse_projections(model)
    if isinstance(model.head, FlowHead):
        precompute_time(model, num_steps)
        rows = model.fast_time.rows
        zero_row = model.fast_time.zero_row
    _cast_keep_tables(model, dtype)
    if isinstance(model.head, FlowHead):
        keep_fp32 = model.cfg.adarms  # one-hot selectors; pi0's bias rows are added in ``dtype``
        model.fast_time.rows = rows.float() if keep_fp32 else rows.to(dtype)
        if zero_row is not None:
            model.fast_time.zero_row = zero_row.to(dtype)
    return model


# ----------------------------------------------------------------------------- the sampler


def fast_velocity(
    model: nn.Module,
    cache: StaticKVCache,
    state: Tensor,
    x: Tensor,
    row: Tensor,
    positions: Tensor,
    mask: Tensor,
) -> Tensor:
    """``FlowHead.denoise_step`` on a prepared model: ``row`` = ``model.fast_time.rows[i]`` for
    Euler step i (the time), or for pi0 a row per action token [B, H, We] (training-time RTC:
    ``zero_row`` on committed steps). state [B, S(+extra)], x [B, H, A] -> v fp32 [B, H, A]."""
    head, tables = model.head, model.fast_time
    dtype = head.action_in_proj.weight.dtype
    act = head.action_in_proj(x.to(dtype))
    b = x.shape[0]
    if model.cfg.adarms:
        suffix, cond = act, row[None].expand(b, -1)
    else:
        h = head.action_time_mlp_out(F.silu(tables.act_in(act) + row))
        suffix, cond = torch.cat([head.state_proj(state.to(dtype))[:, None], h], dim=1), None
    p = cache.max_len - head.suffix_len
    out = model.decoder(
        [None, suffix], positions, mask, cache=cache, cache_pos=p, attend_cache=True, cond=[None, cond]
    )
    return head.action_out_proj(out.expert[:, head.n_state :]).float()


# torch.compile modes a sampler may use: the ones that capture CUDA graphs themselves
# ("reduce-overhead", "max-autotune") would capture inside our own capture of the whole call.
# "max-autotune-no-cudagraphs" benchmarks GEMM configs (Triton templates, split-K) for the step's
# 50-row matmuls, at the cost of a longer warm-up.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# What is compiled: the prefix pass and the Euler step each whole, or one layer of each kind
# (compile_layers).
COMPILE_SCOPES = ("whole", "layers")


def compile_layers(model: nn.Module, mode: str | None = None) -> nn.Module:
    """Regional compilation: one torch.compile of each layer class's forward (the joint decoder
    layer, the SigLIP block), shared by every layer of that class, in place of the whole prefix
    pass and Euler step. Dynamo traces a layer once per call kind (prefill, last prefill layer,
    denoise step) instead of all 18 + 27 layers, so the warm-up is a fraction; inductor cannot
    fuse across layer boundaries (a residual add and the next layer's norm stay two kernels).
    The layers read their cache through ``StaticKVCache.layer(i)``, never an index, so one
    compiled graph serves all of them. Returns the model (its layers' ``forward`` replaced)."""
    mode = check_compile_mode(mode)
    if getattr(model, "_compiled_layers", None) is not None:
        if model._compiled_layers != mode:
            raise ValueError(f"layers already compiled in mode {model._compiled_layers!r}, not {mode!r}")
        return model
    allow_recompiles()
    for layers in (model.decoder.layers, model.vision.layers):
        fn = torch.compile(type(layers[0]).forward, fullgraph=True, dynamic=False, mode=mode)
        for layer in layers:
            layer.forward = types.MethodType(fn, layer)
    model._compiled_layers = mode
    return model


def uncompile_layers(model: nn.Module) -> nn.Module:
    """Undo ``compile_layers``: the layers run their class's own forward again."""
    for layers in (model.decoder.layers, model.vision.layers):
        for layer in layers:
            layer.__dict__.pop("forward", None)
    model.__dict__.pop("_compiled_layers", None)
    return model


def check_compile_scope(scope: str) -> str:
    """``scope`` if it is one of ``COMPILE_SCOPES``; else ValueError."""
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"compile_scope must be one of {' | '.join(COMPILE_SCOPES)}, got {scope!r}")
    return scope


def check_compile_mode(mode: str | None) -> str:
    """``mode`` (None = "default") -> the torch.compile mode; ValueError for any other."""
    mode = mode or "default"
    if mode not in COMPILE_MODES:
        raise ValueError(
            f"compile mode {mode!r}: the fast path takes {' | '.join(COMPILE_MODES)} (it captures the "
            "whole call in one CUDA graph itself, so modes with their own CUDA graphs do not apply)"
        )
    return mode


class StaticSampler:
    """The whole flow sampler over static buffers: ``run()`` reads ``inputs`` and ``noise`` and
    writes ``out``, with fixed shapes, no host syncs and no data-dependent Python control flow, so
    it can be captured in one CUDA graph or compiled whole (``torch.compile(sampler.run,
    fullgraph=True)``). Buffers are allocated on the first call from that batch's shapes and
    dtypes; a later batch must match them (else ValueError: make another sampler).

    ``graph`` (CUDA only; ignored on CPU, where ``run`` runs as is): capture ``run`` on the first
    call (after two warm-up runs on a side stream) and replay it after. ``compile``: torch.compile
    (fullgraph; ``compile_mode``, default "default", see ``COMPILE_MODES``) the prefix pass and the
    Euler step apart, before capture: fused kernels, compiled in the time of one step, and still
    one graph for the whole call. ``compile_scope="layers"``: compile one layer of each kind
    instead (``compile_layers``): a shorter warm-up, the same single captured graph.

    ``prefix=True`` (pi0): training-time real-time chunking, ``prefix_sample`` of
    models/heads/flow/rtc.py as a static function: each call also takes the committed actions
    ``action_prefix`` fp32 [B, H, A] and their count ``prefix_len`` long [B]; they are fed clean at
    flow time 0 (``zero_row``) and kept, the other steps follow the schedule.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        graph: bool = False,
        compile: bool = False,
        prefix: bool = False,
        compile_mode: str | None = None,
        compile_scope: str = "whole",
    ) -> None:
        mode, compile_scope = check_compile_mode(compile_mode), check_compile_scope(compile_scope)
        if not hasattr(model, PREPARED_ATTR):
            raise ValueError("StaticSampler needs a model made by prepare_for_inference (flow head)")
        if prefix and model.fast_time.zero_row is None:
            raise ValueError("prefix=True (a flow time per action token) needs variant='pi0'")
        self.model, self.prefix = model, prefix
        self.action_prefix = self.committed = None
        self.head: FlowHead = model.head
        p = next(model.parameters())
        self.device, self.dtype = p.device, model.head.action_in_proj.weight.dtype
        self.num_steps = model.fast_time.num_steps
        self.dt = -1.0 / self.num_steps
        self.use_graph = graph and self.device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: dict[str, Tensor] | None = None
        self.noise = self.out = None
        self.cache: StaticKVCache | None = None
        # Separate per-step rows (not views of one table): a compiled step sees one input layout.
        self.rows = [r.clone() for r in model.fast_time.rows]
        self._prefill = self.head.prefill
        self._step = self.prefix_step if prefix else self.euler_step
        if compile and compile_scope == "layers":
            compile_layers(model, mode)
        elif compile:
            allow_recompiles()
            self._prefill = torch.compile(self.head.prefill, fullgraph=True, dynamic=False, mode=mode)
            self._step = torch.compile(self._step, fullgraph=True, dynamic=False, mode=mode)

    @property
    def batch_size(self) -> int | None:
        return None if self.noise is None else self.noise.shape[0]

    def euler_step(
        self, cache: StaticKVCache, state: Tensor, x: Tensor, row: Tensor, positions: Tensor, mask: Tensor
    ) -> Tensor:
        """x [B, H, A] fp32 at time t_i -> x at t_{i+1}."""
        return x + self.dt * fast_velocity(self.model, cache, state, x, row, positions, mask)

    def prefix_step(
        self, cache: StaticKVCache, state: Tensor, x: Tensor, row: Tensor, positions: Tensor, mask: Tensor
    ) -> Tensor:
        """``euler_step`` with the committed steps (``self.committed`` [B, H, 1]) at time 0 and
        held at ``self.action_prefix``."""
        keep = self.committed
        rows = torch.where(keep, self.model.fast_time.zero_row, row)  # [B, H, We]
        x = x + self.dt * fast_velocity(self.model, cache, state, x, rows, positions, mask)
        return torch.where(keep, self.action_prefix, x)

    def run(self) -> None:
        """The static function: prefix pass into the cache, ``num_steps`` Euler steps, -> ``out``."""
        cache, positions, mask, state = self._prefill(self.model, self.inputs, self.cache)
        x = self.noise  # scaled by ``load``
        if self.prefix:
            x = torch.where(self.committed, self.action_prefix, x)
        for row in self.rows:
            x = self._step(cache, state, x, row, positions, mask)
        self.out.copy_(x)

    def _allocate(self, batch: dict[str, Tensor], noise: Tensor) -> None:
        dev = self.device
        self.inputs = {k: torch.zeros_like(v, device=dev) for k, v in batch.items() if isinstance(v, Tensor)}
        self.noise = torch.zeros(noise.shape, dtype=torch.float32, device=dev)
        self.out = torch.zeros_like(self.noise)
        self.cache = self.head.new_cache(self.model, noise.shape[0], self.dtype, dev).mark_static()
        statics = [*self.inputs.values(), self.noise, self.out]
        if self.prefix:
            self.action_prefix = torch.zeros_like(self.noise)
            self.committed = torch.zeros((*noise.shape[:2], 1), dtype=torch.bool, device=dev)
            statics += [self.action_prefix, self.committed]
        # Fixed addresses, so torch.compile(self.run, mode="reduce-overhead") may capture the
        # in-place writes to them (cudagraph trees refuse to for ordinary inputs).
        for t in statics:
            torch._dynamo.mark_static_address(t)

    def load(
        self,
        batch: dict[str, Any],
        noise: Tensor,
        action_prefix: Tensor | None = None,
        prefix_len: Tensor | None = None,
        noise_scale: float | None = None,
    ) -> None:
        """Copy ``batch`` (model inputs, vlastack/batch.py) and ``noise`` [B, H, A] times
        ``noise_scale`` (default the config's; outside the captured function, so a call may
        change it) into the static buffers (allocating them on the first call); with
        ``prefix=True`` also the committed actions ``action_prefix`` [B, H, A] and their count
        ``prefix_len`` [B]."""
        if (action_prefix is not None) != self.prefix or (prefix_len is not None) != self.prefix:
            raise ValueError(
                "a sampler made with prefix=True takes action_prefix and prefix_len, and only that one"
            )
        if self.inputs is None:
            self._allocate(batch, noise)
        tensors = {k: v for k, v in batch.items() if isinstance(v, Tensor)}
        if tensors.keys() != self.inputs.keys() or noise.shape != self.noise.shape:
            raise ValueError(
                f"StaticSampler buffers hold keys {sorted(self.inputs)} with noise {tuple(self.noise.shape)}; "
                f"got {sorted(tensors)} with noise {tuple(noise.shape)} (make a sampler per batch size)"
            )
        for k, v in tensors.items():
            buf = self.inputs[k]
            if v.shape != buf.shape or v.dtype != buf.dtype:
                raise ValueError(
                    f"batch[{k!r}] is {v.dtype} {tuple(v.shape)}; this sampler's buffer is "
                    f"{buf.dtype} {tuple(buf.shape)} (make a sampler per batch size)"
                )
            buf.copy_(v, non_blocking=True)
        scale = self.model.cfg.head_options.noise_scale if noise_scale is None else noise_scale
        self.noise.copy_(noise * scale, non_blocking=True)
        if self.prefix:
            b, h = noise.shape[:2]
            if action_prefix.shape != noise.shape or prefix_len.shape != (b,):
                raise ValueError(
                    f"action_prefix {tuple(action_prefix.shape)} / prefix_len {tuple(prefix_len.shape)}: "
                    f"expected {tuple(noise.shape)} / ({b},)"
                )
            self.action_prefix.copy_(action_prefix, non_blocking=True)
            steps = torch.arange(h, device=prefix_len.device)
            self.committed.copy_((steps[None] < prefix_len[:, None])[..., None], non_blocking=True)

    def capture(self) -> None:
        """Warm up on a side stream (compiles, cuBLAS workspaces), then capture ``run``."""
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.run()
        self.graph = graph

    def __call__(
        self,
        batch: dict[str, Any],
        noise: Tensor,
        action_prefix: Tensor | None = None,
        prefix_len: Tensor | None = None,
        noise_scale: float | None = None,
    ) -> Tensor:
        """-> actions fp32 [B, H, A] (a fresh tensor: the next call overwrites ``out``)."""
        self.load(batch, noise, action_prefix, prefix_len, noise_scale)
        if not self.use_graph:
            self.run()
        else:
            if self.graph is None:
                self.capture()
            self.graph.replay()
        return self.out.clone()


class FastFlow:
    """One ``StaticSampler`` (and, on CUDA, one graph) per batch size, made on first use: what
    ``Policy(fast=True)`` calls in place of ``model.sample``; ``prefix_sample`` the same for
    training-time real-time chunking (pi0: ``supports_prefix``)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        graph: bool = True,
        compile: bool = False,
        compile_mode: str | None = None,
        compile_scope: str = "whole",
    ) -> None:
        self.model, self.graph, self.compile = model, graph, compile
        self.compile_mode = check_compile_mode(compile_mode)
        self.kw = {"compile_mode": self.compile_mode, "compile_scope": check_compile_scope(compile_scope)}
        self.samplers: dict[int, StaticSampler] = {}
        self.prefix_samplers: dict[int, StaticSampler] = {}
        self.supports_prefix = model.fast_time.zero_row is not None

    def __call__(self, batch: dict[str, Any], noise: Tensor, noise_scale: float | None = None) -> Tensor:
        """-> actions fp32 [B, H, A]; ``noise_scale`` (default the config's), e.g. BID's."""
        b = noise.shape[0]
        if b not in self.samplers:
            self.samplers[b] = StaticSampler(self.model, graph=self.graph, compile=self.compile, **self.kw)
        return self.samplers[b](batch, noise, noise_scale=noise_scale)

    def prefix_sample(
        self, batch: dict[str, Any], noise: Tensor, action_prefix: Tensor, prefix_len: Tensor
    ) -> Tensor:
        """``models.heads.flow.rtc.prefix_sample`` on the prepared model: committed actions
        ``action_prefix`` [B, H, A] (first ``prefix_len`` [B] steps) fed clean. -> fp32 [B, H, A]."""
        b = noise.shape[0]
        if b not in self.prefix_samplers:
            self.prefix_samplers[b] = StaticSampler(
                self.model,
                graph=self.graph,
                compile=self.compile,
                prefix=True,
                **self.kw,
            )
        return self.prefix_samplers[b](batch, noise, action_prefix, prefix_len)
