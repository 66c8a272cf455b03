"""Pi0 flow-matching action head (openpi convention: t=1 is noise, t=0 is data).

Suffix tokens = [state token, H action tokens], embedded by the action expert's input layers.
Block-causal mask: prefix (images + text) bidirectional; the state token starts a block; the action
tokens form the last block. Training regresses the velocity u = eps - a at x_t = t*eps + (1-t)*a.
Sampling runs the prefix once into a static KV cache, then N Euler steps over the suffix only.

With ``model.grounding`` on, the state token's input is [state | grounding] where grounding is
``GroundingHead``'s prediction from the prefix (sampling) or the recorded positions plus noise
(training; the head's regression loss is added, and with ``attend_weight`` a loss on where it
looks). See models/grounding.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig
from vlastack.models.grounding import GroundingHead, attention_loss
from vlastack.nn.attention import block_causal_mask
from vlastack.nn.kv_cache import StaticKVCache

if TYPE_CHECKING:
    from vlastack.models.vla import VLA


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


class FlowHead(nn.Module):
    """Action-expert input/output layers plus the flow-matching loss and Euler sampler."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.expert.width
        g = cfg.grounding
        self.grounding = (
            GroundingHead(cfg.vlm.width, cfg.num_cameras * cfg.vision.num_patches, g.points, g.key_dim,
                          eps=cfg.vlm.norm_eps)
            if g.points else None
        )  # fmt: skip
        self.state_proj = nn.Linear(cfg.state_dim + g.dim, w)
        self.action_in_proj = nn.Linear(cfg.action_dim, w)
        self.action_time_mlp_in = nn.Linear(2 * w, w)
        self.action_time_mlp_out = nn.Linear(w, w)
        self.action_out_proj = nn.Linear(w, cfg.action_dim)

    @property
    def suffix_len(self) -> int:
        return 1 + self.cfg.action_horizon

    def suffix_block_starts(self, device: torch.device) -> Tensor:
        """[1 + H] bool: the state token and the first action token each start a block."""
        starts = torch.zeros(self.suffix_len, dtype=torch.bool, device=device)
        starts[:2] = True
        return starts

    def _decoder_kw(self) -> dict:
        """The prefix outputs a forward needs: the grounding head's layer, if any."""
        if self.grounding is None:
            return {"vlm_output": False}
        layer = self.cfg.grounding_layer
        return {"vlm_output": layer == self.cfg.vlm.depth - 1, "vlm_hidden_at": layer}

    def condition_state(self, state: Tensor, hidden: Tensor | None, prefix_pad: Tensor) -> Tensor:
        """state [B, S] -> the state token's input [B, S + G]: the grounding prediction appended."""
        if self.grounding is None:
            return state
        return torch.cat([state, self.grounding(hidden, prefix_pad).to(state.dtype)], dim=-1)

    def predict_grounding(self, vla: VLA, batch: Batch) -> Tensor:
        """The grounding head's prediction, normalized units. -> fp32 [B, G]."""
        if self.grounding is None:
            raise ValueError("this model has no grounding head (model.grounding.points is 0)")
        prefix, pad = vla.embed_prefix(batch)
        return self.grounding(self._prefill(vla, prefix, pad)[3], pad)

    def embed_suffix(self, state: Tensor, x_t: Tensor, t: Tensor) -> Tensor:
        """state [B, S(+G)], x_t [B, H, A], t [B] -> suffix tokens [B, 1 + H, We]."""
        c = self.cfg
        state_tok = self.state_proj(state)[:, None]
        act = self.action_in_proj(x_t)
        temb = sincos_time_embedding(t, c.expert.width, c.time_min_period, c.time_max_period)
        temb = temb[:, None].expand(-1, c.action_horizon, -1).to(act.dtype)
        h = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(torch.cat([act, temb], dim=-1))))
        return torch.cat([state_tok.to(h.dtype), h], dim=1)

    def velocity_full(
        self, vla: VLA, prefix: Tensor, prefix_pad: Tensor, state: Tensor, x_t: Tensor, t: Tensor
    ) -> Tensor:
        """Uncached: prefix + suffix through the joint decoder; ``state`` is the conditioned state
        [B, S(+G)]. -> v fp32 [B, H, A]."""
        b, p = prefix_pad.shape
        suffix = self.embed_suffix(state, x_t, t)
        pad = torch.cat([prefix_pad, prefix_pad.new_ones(b, self.suffix_len)], dim=1)
        starts = torch.cat([prefix_pad.new_zeros(p), self.suffix_block_starts(prefix.device)])
        mask = block_causal_mask(pad, starts)
        positions = pad.long().cumsum(-1) - 1
        out = vla.decoder([prefix, suffix], positions, mask, vlm_output=False)[1]
        return self.action_out_proj(out[:, 1:]).float()

    def loss(
        self, vla: VLA, batch: Batch, noise: Tensor | None = None, time: Tensor | None = None
    ) -> dict[str, Tensor]:
        """Flow-matching MSE over real (unpadded) steps and dims. -> {"loss": scalar fp32, ...}."""
        actions = batch["actions"].float()
        b = actions.shape[0]
        eps = torch.randn_like(actions) if noise is None else noise.float()
        t = sample_time(b, actions.device) if time is None else time.float()
        x_t = t[:, None, None] * eps + (1 - t[:, None, None]) * actions
        u = eps - actions
        prefix, prefix_pad = vla.embed_prefix(batch)
        state, g = batch["state"], self.cfg.grounding
        if self.grounding is None:
            v = self.velocity_full(vla, prefix, prefix_pad, state, x_t, t)
        else:
            target = batch["env_state"].float()
            forced = target + g.noise * torch.randn_like(target)  # teacher forcing: recorded + noise
            v, pred, look = self._velocity_grounded(vla, prefix, prefix_pad, state, forced, x_t, t)
        weight = (~batch["action_is_pad"])[:, :, None] & batch["action_dim_mask"][:, None, :]
        weight = weight.float()
        se = (v - u).pow(2) * weight
        loss = se.sum() / weight.sum().clamp(min=1.0)
        out = {"loss": loss, "mse_per_sample": se.sum((1, 2)) / weight.sum((1, 2)).clamp(min=1.0)}
        if self.grounding is not None:
            ground = (pred - target).pow(2).mean()
            out.update(flow_loss=loss, grounding_loss=ground, loss=loss + g.weight * ground)
            if g.attend_weight:
                grid = self.cfg.vision.image_size // self.cfg.vision.patch_size
                attend = attention_loss(look, batch["env_uv"], grid)
                out.update(attend_loss=attend, loss=out["loss"] + g.attend_weight * attend)
        return out

    def _velocity_grounded(
        self,
        vla: VLA,
        prefix: Tensor,
        prefix_pad: Tensor,
        state: Tensor,
        forced: Tensor,
        x_t: Tensor,
        t: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Training with grounding: the prefix runs first, into a cache (with gradients), then the
        suffix against it, as in sampling. The same math as the joint pass, and 8% faster on the
        demo model, since prefix queries skip the suffix keys. The state token gets ``forced``
        [B, G], or per sample with probability 1 - ``teacher_forcing`` the head's own prediction.
        -> (v fp32 [B, H, A], prediction fp32 [B, G], the head's attention fp32 [B, K, image tokens])."""
        cache, positions, mask, hidden = self._prefill(vla, prefix, prefix_pad)
        pred, look = self.grounding.attend(hidden, prefix_pad)
        fed, tf = forced, self.cfg.grounding.teacher_forcing
        if tf < 1:
            fed = torch.where(torch.rand(pred.shape[0], 1, device=pred.device) < tf, forced, pred)
        state = torch.cat([state, fed.to(state.dtype)], dim=-1)
        return self.denoise_step(vla, cache, state, x_t, t, positions, mask), pred, look

    # ------------------------------------------------------------------ sampling

    def step_mask(self, prefix_pad: Tensor) -> Tensor:
        """Mask for suffix queries over the cache slots [prefix | suffix]: bool [B, 1, 1+H, P+1+H]."""
        b, p = prefix_pad.shape
        s = self.suffix_len
        suffix = block_causal_mask(prefix_pad.new_ones(b, s), self.suffix_block_starts(prefix_pad.device))
        return torch.cat([prefix_pad[:, None, None, :].expand(b, 1, s, p), suffix], dim=-1)

    def new_cache(
        self, vla: VLA, batch_size: int, dtype: torch.dtype, device: torch.device | str
    ) -> StaticKVCache:
        """A cache that fits this model's prefix + suffix, to reuse across ``sample`` calls.
        ``dtype``: the k/v dtype the decoder computes in (bf16 under bf16 autocast)."""
        return vla.decoder.new_cache(batch_size, self.cfg.prefix_len + self.suffix_len, dtype, device)

    def prefill(
        self, vla: VLA, batch: Batch, cache: StaticKVCache | None = None
    ) -> tuple[StaticKVCache, Tensor, Tensor, Tensor]:
        """Run the prefix once into ``cache`` (every slot is rewritten before it is read), or a
        fresh one. -> (cache, step positions [B, 1+H], step mask, conditioned state [B, S(+G)])."""
        prefix, prefix_pad = vla.embed_prefix(batch)
        cache, positions, mask, hidden = self._prefill(vla, prefix, prefix_pad, cache)
        return cache, positions, mask, self.condition_state(batch["state"], hidden, prefix_pad)

    def _prefill(
        self, vla: VLA, prefix: Tensor, prefix_pad: Tensor, cache: StaticKVCache | None = None
    ) -> tuple[StaticKVCache, Tensor, Tensor, Tensor | None]:
        """-> (cache, step positions, step mask, VLM hidden for the grounding head or None)."""
        b, p = prefix_pad.shape
        if cache is None:
            cache = vla.decoder.new_cache(b, p + self.suffix_len, prefix.dtype, prefix.device)
        elif cache.k[0].shape[0] != b or cache.max_len != p + self.suffix_len:
            raise ValueError(
                f"cache holds batch {cache.k[0].shape[0]} x {cache.max_len} slots; this call needs "
                f"batch {b} x {p + self.suffix_len} (make it with FlowHead.new_cache)"
            )
        positions = prefix_pad.long().cumsum(-1) - 1
        mask = block_causal_mask(prefix_pad, prefix_pad.new_zeros(p))
        outs = vla.decoder(
            [prefix, None],
            positions,
            mask,
            cache=cache,
            cache_pos=0,
            attend_cache=False,
            **self._decoder_kw(),
        )
        n_valid = prefix_pad.long().sum(-1, keepdim=True)  # [B, 1]
        step_positions = n_valid + torch.arange(self.suffix_len, device=prefix.device)[None]
        return cache, step_positions, self.step_mask(prefix_pad), outs[2] if self.grounding else None

    def denoise_step(
        self,
        vla: VLA,
        cache: StaticKVCache,
        state: Tensor,
        x_t: Tensor,
        t: Tensor,
        positions: Tensor,
        mask: Tensor,
    ) -> Tensor:
        """One velocity evaluation against the cached prefix. state [B, S(+G)] (conditioned, from
        ``prefill``), x_t [B, H, A], t [B] -> v fp32 [B, H, A].

        Only the 1+H suffix tokens run; their k/v overwrite the cache's suffix slots by index.
        """
        suffix = self.embed_suffix(state, x_t, t)
        p = cache.max_len - self.suffix_len
        _, out = vla.decoder([None, suffix], positions, mask, cache=cache, cache_pos=p, attend_cache=True)
        return self.action_out_proj(out[:, 1:]).float()

    def compile_decoding(self, **kwargs) -> None:
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
        vla: VLA,
        batch: Batch,
        noise: Tensor | None = None,
        num_steps: int | None = None,
        cache: StaticKVCache | None = None,
    ) -> Tensor:
        """Euler integration from t=1 (noise) to t=0. -> normalized actions fp32 [B, H, A].

        Fixed shapes and no host syncs: compilable without graph breaks (the loop unrolls).
        """
        c = self.cfg
        n = num_steps or c.num_denoise_steps
        b = batch["state"].shape[0]
        device = batch["state"].device
        x = torch.randn(b, c.action_horizon, c.action_dim, device=device) if noise is None else noise.float()
        x = x * c.noise_scale  # noise is standard normal; the config sets the temperature
        cache, positions, mask, state = self.prefill(vla, batch, cache)
        dt = -1.0 / n
        for i in range(n):
            t = torch.full((b,), 1.0 + i * dt, device=device)
            x = x + dt * self.denoise_step(vla, cache, state, x, t, positions, mask)
        return x

    def sample_uncached(self, vla: VLA, batch: Batch, noise: Tensor, num_steps: int | None = None) -> Tensor:
        """Reference sampler that recomputes the whole sequence every step (for tests). -> [B, H, A]."""
        n = num_steps or self.cfg.num_denoise_steps
        prefix, prefix_pad = vla.embed_prefix(batch)
        hidden = self._prefill(vla, prefix, prefix_pad)[3] if self.grounding is not None else None
        state = self.condition_state(batch["state"], hidden, prefix_pad)
        x, dt = noise.float() * self.cfg.noise_scale, -1.0 / n
        for i in range(n):
            t = torch.full((x.shape[0],), 1.0 + i * dt, device=x.device)
            x = x + dt * self.velocity_full(vla, prefix, prefix_pad, state, x, t)
        return x
