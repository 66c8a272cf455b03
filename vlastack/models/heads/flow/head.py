"""Pi0 / Pi0.5 flow-matching action head (openpi convention: t=1 is noise, t=0 is data).

Pi0 (``model.head_options.variant='pi0'``): suffix tokens = [state token, H action tokens], embedded by the
action expert's input layers; the flow time is mixed into every action token by an MLP.
Pi0.5 (``'pi05'``): suffix = the H action tokens (the state is in the prompt, models/prompt.py);
the flow time goes through ``time_mlp_in/out`` into the expert's adaptive RMSNorms (``cond``).
Block-causal mask: prefix (images + text) bidirectional; the state token (pi0) starts a block; the
action tokens form the last block. Training regresses the velocity u = eps - a at
x_t = t*eps + (1-t)*a. Sampling runs the prefix once into a static KV cache, then N Euler steps
over the suffix only. docs/pi05.md lists the differences and the LeRobot weight names.

Subclasses change what the state token reads through two hooks: ``state_extra_dim`` (more inputs
beside the state) and ``condition_state`` (fills them from the prefix), plus ``train_velocity`` and
``extra_losses`` for their training terms (see ``grounding.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig
from vlastack.models.backbone import Backbone, prefix_layout
from vlastack.models.heads.base import ActionOutput, HeadBase
from vlastack.nn.attention import block_causal_mask
from vlastack.nn.kv_cache import StaticKVCache


def sincos_time_embedding(t: Tensor, dim: int, min_period: float, max_period: float) -> Tensor:
    """t [B] in [0, 1] -> fp32 [B, dim] (sin half, cos half), periods log-spaced in [min, max].

    Computed in float64 (except on MPS), as openpi and LeRobot do: angles reach 2 pi / min_period
    (~1600 rad), where fp32 sin/cos lose ~1e-4; in fp32 the tiny LeRobot fixture's velocity
    differed from LeRobot's by 8e-5, in fp64 by 1e-6."""
    assert dim % 2 == 0
    dtype = torch.float32 if t.device.type == "mps" else torch.float64
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=dtype, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (1.0 / period * 2 * math.pi)[None] * t.float()[:, None]
    return torch.cat([angle.sin(), angle.cos()], dim=-1).float()


def sample_time(batch_size: int, device: torch.device, generator: torch.Generator | None = None) -> Tensor:
    """t ~ Beta(1.5, 1) scaled into [0.001, 1]. Beta(a, 1) has CDF x^a, so x = U^(1/a). -> [B]."""
    u = torch.rand(batch_size, device=device, generator=generator)
    return u.pow(1.0 / 1.5) * 0.999 + 0.001


def loss_weight(batch: Batch) -> Tensor:
    """1 for each real (unpadded) step and dim of the actions, else 0: float [B, H, A]."""
    return ((~batch["action_is_pad"])[:, :, None] & batch["action_dim_mask"][:, None, :]).float()


def flow_mse(v: Tensor, u: Tensor, batch: Batch, denominator: Tensor | None = None) -> dict[str, Tensor]:
    """MSE between velocity v and target u [B, H, A] over real (unpadded) steps and dims.
    ``denominator``: the number of real terms to divide by (default: this batch's); several ranks
    pass the global batch's over the world size, so their averaged gradients are the global mean's."""
    weight = loss_weight(batch)
    se = (v - u).pow(2) * weight
    loss = se.sum() / (weight.sum() if denominator is None else denominator).clamp(min=1.0)
    return {"loss": loss, "mse_per_sample": se.sum((1, 2)) / weight.sum((1, 2)).clamp(min=1.0)}


class FlowHead(HeadBase):
    """Action-expert input/output layers plus the flow-matching loss and Euler sampler."""

    state_extra_dim = 0  # inputs the state token reads beside the state (subclasses)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.expert.width
        self.n_state = 0 if cfg.state_in_prompt else 1  # state tokens in the suffix
        if self.n_state:
            self.state_proj = nn.Linear(cfg.state_dim + self.state_extra_dim, w)
        self.action_in_proj = nn.Linear(cfg.action_dim, w)
        if cfg.adarms:  # the time conditions the expert's norms (Pi0.5)
            self.time_mlp_in = nn.Linear(w, w)
            self.time_mlp_out = nn.Linear(w, w)
        else:  # the time is mixed into the action tokens (Pi0)
            self.action_time_mlp_in = nn.Linear(2 * w, w)
            self.action_time_mlp_out = nn.Linear(w, w)
        self.action_out_proj = nn.Linear(w, cfg.action_dim)

    def frozen_backbone_params(self, backbone: Backbone) -> list[str]:
        return ["decoder." + n for n in backbone.decoder.unused_by_flow_head()]

    @property
    def suffix_len(self) -> int:
        return self.n_state + self.cfg.action_horizon

    def suffix_block_starts(self, device: torch.device) -> Tensor:
        """[suffix_len] bool: the state token (pi0) and the first action token each start a block."""
        starts = torch.zeros(self.suffix_len, dtype=torch.bool, device=device)
        starts[: self.n_state + 1] = True
        return starts

    # ------------------------------------------------------------------ hooks for add-ons

    def prefill_kw(self) -> dict[str, Any]:
        """Decoder options for the prefix pass (an add-on may ask for a VLM layer's output)."""
        return {"vlm_output": False}

    def condition_state(self, state: Tensor, hidden: Tensor | None, prefix_pad: Tensor) -> Tensor:
        """state [B, S] -> the state token's input [B, S + state_extra_dim]. ``hidden``: the
        prefix pass's ``DecoderOutput.hidden`` (None unless ``prefill_kw`` asked for it)."""
        return state

    def train_velocity(
        self, backbone: Backbone, batch: Batch, prefix: Tensor, prefix_pad: Tensor, x_t: Tensor, t: Tensor
    ) -> tuple[Tensor, Any]:
        """Training forward -> (v fp32 [B, H, A], whatever ``extra_losses`` needs)."""
        return self.velocity_full(backbone, prefix, prefix_pad, batch["state"], x_t, t), None

    def extra_losses(self, out: dict[str, Tensor], aux: Any, batch: Batch) -> dict[str, Tensor]:
        """Add terms to the flow loss ``out`` (``aux`` from ``train_velocity``)."""
        return out

    # ------------------------------------------------------------------ training

    def embed_suffix(self, state: Tensor, x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor | None]:
        """state [B, S(+extra)], x_t [B, H, A], t [B] (or [B, H]: a flow time per action token,
        pi0 only; training-time RTC gives the committed prefix time 0) -> (suffix tokens
        [B, suffix_len, We], the expert's norm condition [B, We] (pi05) or None (pi0))."""
        c = self.cfg
        act = self.action_in_proj(x_t)
        w = c.expert.width
        if t.dim() == 2:
            if c.adarms:
                raise ValueError("a flow time per action token needs variant='pi0' (pi05 has one per sample)")
            assert t.shape == x_t.shape[:2], (t.shape, x_t.shape)
            temb = sincos_time_embedding(
                t.reshape(-1), w, c.head_options.time_min_period, c.head_options.time_max_period
            )
            temb = temb.reshape(*t.shape, w).to(act.dtype)
        else:
            temb = sincos_time_embedding(t, w, c.head_options.time_min_period, c.head_options.time_max_period)
        if c.adarms:
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(temb.to(act.dtype)))))
            return act, cond
        if t.dim() == 1:
            temb = temb[:, None].expand(-1, c.action_horizon, -1).to(act.dtype)
        h = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(torch.cat([act, temb], dim=-1))))
        state_tok = self.state_proj(state)[:, None]
        return torch.cat([state_tok.to(h.dtype), h], dim=1), None

    def velocity_full(
        self, backbone: Backbone, prefix: Tensor, prefix_pad: Tensor, state: Tensor, x_t: Tensor, t: Tensor
    ) -> Tensor:
        """Uncached: prefix + suffix through the joint decoder; ``state`` is the conditioned state
        [B, S(+extra)]. -> v fp32 [B, H, A]."""
        suffix, cond = self.embed_suffix(state, x_t, t)
        _, mask, positions = prefix_layout(prefix_pad, self.suffix_block_starts(prefix.device))
        out = backbone.decoder([prefix, suffix], positions, mask, vlm_output=False, cond=[None, cond]).expert
        return self.action_out_proj(out[:, self.n_state :]).float()

    def loss_terms(self, batch: Batch) -> Tensor:
        """The number of terms ``loss`` averages over (``HeadBase.loss_terms``)."""
        return loss_weight(batch).sum()

    def loss_draws(
        self, batch_size: int, actions_shape: tuple[int, ...], generator: torch.Generator
    ) -> dict | None:
        """``noise`` [B, H, A] then ``time`` [B], as ``loss`` draws them (``HeadBase.loss_draws``)."""
        device = generator.device
        noise = torch.randn((batch_size, *actions_shape), generator=generator, device=device)
        return {"noise": noise, "time": sample_time(batch_size, device, generator)}

    def loss(
        self,
        backbone: Backbone,
        batch: Batch,
        noise: Tensor | None = None,
        time: Tensor | None = None,
        prefix_len: Tensor | None = None,
        loss_denominator: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """Flow-matching MSE over real (unpadded) steps and dims. -> {"loss": scalar fp32, ...}.
        ``noise`` [B, H, A] and ``time`` [B]: fixed draws (tests, or the trainer's shared draws under
        DDP/FSDP), else sampled; ``loss_denominator``: see ``flow_mse``. ``prefix_len``
        long [B] (training-time RTC, ``train.rtc``): each sample's first d actions are the
        committed prefix: given clean (flow time 0) and left out of the loss."""
        actions = batch["actions"].float()
        b, h = actions.shape[:2]
        eps = torch.randn_like(actions) if noise is None else noise.float()
        t = sample_time(b, actions.device) if time is None else time.float()
        if prefix_len is not None:
            committed = torch.arange(h, device=actions.device)[None] < prefix_len.to(actions.device)[:, None]
            t = torch.where(committed, 0.0, t[:, None])  # [B, H]: the prefix is clean data
            batch = {**batch, "action_is_pad": batch["action_is_pad"] | committed}
        tt = t[..., None] if t.dim() == 2 else t[:, None, None]
        x_t = tt * eps + (1 - tt) * actions
        u = eps - actions
        prefix, prefix_pad = backbone.embed_prefix(batch)
        v, aux = self.train_velocity(backbone, batch, prefix, prefix_pad, x_t, t)
        return self.extra_losses(flow_mse(v, u, batch, loss_denominator), aux, batch)

    # ------------------------------------------------------------------ sampling

    def step_mask(self, prefix_pad: Tensor) -> Tensor:
        """Mask for suffix queries over the cache slots [prefix | suffix]: bool [B, 1, T, P+T],
        T = ``suffix_len``."""
        b, p = prefix_pad.shape
        s = self.suffix_len
        suffix = block_causal_mask(prefix_pad.new_ones(b, s), self.suffix_block_starts(prefix_pad.device))
        return torch.cat([prefix_pad[:, None, None, :].expand(b, 1, s, p), suffix], dim=-1)

    def new_cache(
        self, backbone: Backbone, batch_size: int, dtype: torch.dtype, device: torch.device | str
    ) -> StaticKVCache:
        """A cache that fits this model's prefix + suffix, to reuse across ``sample`` calls.
        ``dtype``: the k/v dtype the decoder computes in (bf16 under bf16 autocast)."""
        return backbone.decoder.new_cache(batch_size, self.cfg.prefix_len + self.suffix_len, dtype, device)

    def prefill(
        self, backbone: Backbone, batch: Batch, cache: StaticKVCache | None = None
    ) -> tuple[StaticKVCache, Tensor, Tensor, Tensor]:
        """Run the prefix once into ``cache`` (every slot is rewritten before it is read), or a
        fresh one. -> (cache, step positions [B, T], step mask, conditioned state [B, S(+extra)])."""
        prefix, prefix_pad = backbone.embed_prefix(batch)
        cache, positions, mask, hidden = self.prefill_prefix(backbone, prefix, prefix_pad, cache)
        return cache, positions, mask, self.condition_state(batch["state"], hidden, prefix_pad)

    def prefill_prefix(
        self, backbone: Backbone, prefix: Tensor, prefix_pad: Tensor, cache: StaticKVCache | None = None
    ) -> tuple[StaticKVCache, Tensor, Tensor, Tensor | None]:
        """-> (cache, step positions, step mask, the VLM hidden ``prefill_kw`` asked for, or None)."""
        b, p = prefix_pad.shape
        if cache is None:
            cache = backbone.decoder.new_cache(b, p + self.suffix_len, prefix.dtype, prefix.device)
        elif cache.k[0].shape[0] != b or cache.max_len != p + self.suffix_len:
            raise ValueError(
                f"cache holds batch {cache.k[0].shape[0]} x {cache.max_len} slots; this call needs "
                f"batch {b} x {p + self.suffix_len} (make it with FlowHead.new_cache)"
            )
        _, mask, positions = prefix_layout(prefix_pad)
        out = backbone.decoder(
            [prefix, None], positions, mask, cache=cache, cache_pos=0, attend_cache=False, **self.prefill_kw()
        )
        n_valid = prefix_pad.long().sum(-1, keepdim=True)  # [B, 1]
        step_positions = n_valid + torch.arange(self.suffix_len, device=prefix.device)[None]
        return cache, step_positions, self.step_mask(prefix_pad), out.hidden

    def denoise_step(
        self,
        backbone: Backbone,
        cache: StaticKVCache,
        state: Tensor,
        x_t: Tensor,
        t: Tensor,
        positions: Tensor,
        mask: Tensor,
    ) -> Tensor:
        """One velocity evaluation against the cached prefix. state [B, S(+extra)] (conditioned,
        from ``prefill``), x_t [B, H, A], t [B] -> v fp32 [B, H, A].

        Only the suffix tokens run; their k/v overwrite the cache's suffix slots by index. pi05
        ignores ``state`` (it is in the prompt).
        """
        suffix, cond = self.embed_suffix(state, x_t, t)
        p = cache.max_len - self.suffix_len
        out = backbone.decoder(
            [None, suffix], positions, mask, cache=cache, cache_pos=p, attend_cache=True, cond=[None, cond]
        )
        return self.action_out_proj(out.expert[:, self.n_state :]).float()

    def compile_decoding(self, **kwargs: Any) -> None:
        """torch.compile the prefix pass and the denoise step apart (fullgraph), as the token head's
        ``compile_decoding``: a graph 1/N the size of the unrolled sampler, so it compiles ~N times
        faster for N steps. ``kwargs`` (e.g. ``mode="reduce-overhead"`` for CUDA graphs) go to the
        denoise step only: the prefix pass runs once per call, and graphed, its outputs would be
        overwritten by the next replay. CUDA graphs also need a reused cache marked static
        (``new_cache(...).mark_static()``), since the step writes it in place."""
        self.prefill = torch.compile(self.prefill, fullgraph=True, dynamic=False)
        self.denoise_step = torch.compile(
            self.denoise_step, **{"fullgraph": True, "dynamic": False, **kwargs}
        )

    def sample(
        self,
        backbone: Backbone,
        batch: Batch,
        noise: Tensor | None = None,
        num_steps: int | None = None,
        cache: StaticKVCache | None = None,
        noise_scale: float | None = None,
        generator: torch.Generator | None = None,
    ) -> ActionOutput:
        """Euler integration from t=1 (noise) to t=0. -> ActionOutput(actions fp32 [B, H, A], None).
        ``noise_scale``: this call's temperature instead of the config's (bidirectional decoding
        samples candidates at 1 from a policy whose recipe samples its mode, at 0). ``generator``
        draws the noise when none is given, and ``head_options.step_noise``'s per-step noise.

        Fixed shapes and no host syncs: compilable without graph breaks (the loop unrolls).
        """
        c = self.cfg
        n = num_steps or c.head_options.num_denoise_steps
        b = batch["state"].shape[0]
        device = batch["state"].device
        shape = (b, c.action_horizon, c.action_dim)
        x = torch.randn(shape, device=device, generator=generator) if noise is None else noise.float()
        x = x * (c.head_options.noise_scale if noise_scale is None else noise_scale)  # noise: standard normal
        cache, positions, mask, state = self.prefill(backbone, batch, cache)
        dt = -1.0 / n
        sigma = c.head_options.step_noise * math.sqrt(-dt)  # 0: deterministic (the default)
        for i in range(n):
            t = torch.full((b,), 1.0 + i * dt, device=device)
            x = x + dt * self.denoise_step(backbone, cache, state, x, t, positions, mask)
            if sigma:  # the stochastic sampler vla rl trains (flow/rl.py's flow_sample)
                x = x + sigma * torch.randn(shape, device=device, generator=generator)
        return ActionOutput(x)

    def uncached_state(self, backbone: Backbone, prefix: Tensor, prefix_pad: Tensor, state: Tensor) -> Tensor:
        """``condition_state`` for the uncached reference sampler (an add-on that reads the prefix
        pass overrides it)."""
        return self.condition_state(state, None, prefix_pad)

    def sample_uncached(
        self, backbone: Backbone, batch: Batch, noise: Tensor, num_steps: int | None = None
    ) -> Tensor:
        """Reference sampler that recomputes the whole sequence every step (for tests). -> [B, H, A]."""
        n = num_steps or self.cfg.head_options.num_denoise_steps
        prefix, prefix_pad = backbone.embed_prefix(batch)
        state = self.uncached_state(backbone, prefix, prefix_pad, batch["state"])
        x, dt = noise.float() * self.cfg.head_options.noise_scale, -1.0 / n
        for i in range(n):
            t = torch.full((x.shape[0],), 1.0 + i * dt, device=x.device)
            x = x + dt * self.velocity_full(backbone, prefix, prefix_pad, state, x, t)
        return x
