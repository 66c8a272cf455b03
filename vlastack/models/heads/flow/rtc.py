"""Real-time chunking samplers for the flow head: the next chunk agrees with what is committed.

While chunk k+1 is computed, the robot keeps executing chunk k; its first d actions (the delay)
are committed before chunk k+1 arrives. Two ways to make chunk k+1 continue them smoothly:

- ``guided_sample`` (inference-time RTC, arXiv 2506.07339): inpainting by PiGDM guidance at every
  Euler step. The target is the previous chunk's leftover actions; the soft mask ``prefix_weights``
  is 1 on the d committed actions, decays exponentially over the rest of the overlap and is 0
  past it. Each step adds ``w(t) * J^T (W * (Y - A1))`` to the denoising direction, where A1 is
  the step's prediction of the clean chunk and J = dA1/dx_t: one vector-Jacobian product per
  step. ``w(t)`` is clipped at ``beta``. Works for any flow checkpoint.
- ``prefix_sample`` (training-time RTC, arXiv 2512.05964): the d committed actions are fed clean
  with flow time 0 (``train.rtc.max_delay`` taught the model that input) and held fixed; no
  extra cost at inference.

Both read the head only through its public sampling steps (``prefill``, ``denoise_step``), so
the grounded flow head and any subclass work unchanged. Conventions as ``flow.py``: t = 1 is
noise, t = 0 data, Euler steps of dt = -1/n; chunks are in the model's normalized, padded space.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vlastack.batch import Batch
from vlastack.config import GUIDANCE_MODES
from vlastack.models.backbone import Backbone
from vlastack.models.heads.flow.head import FlowHead


def prefix_weights(horizon: int, delay: int, overlap: int) -> Tensor:
    """The soft inpainting mask -> fp32 [horizon]: 1 for i < ``delay`` (committed), then
    c_i (e^c_i - 1) / (e - 1) with c_i = (overlap - i) / (overlap - delay + 1) for i < ``overlap``
    (the previous chunk's leftover length), and 0 from ``overlap`` on (nothing to agree with)."""
    if not 0 <= overlap <= horizon:
        raise ValueError(f"overlap must be in [0, {horizon}], got {overlap}")
    d = max(0, min(delay, overlap))
    i = torch.arange(horizon, dtype=torch.float32)
    c = (overlap - i) / (overlap - d + 1)
    soft = c * torch.expm1(c) / (math.e - 1)
    return torch.where(i < d, 1.0, torch.where(i < overlap, soft, 0.0))


def guidance_weight(t: float, beta: float) -> float:
    """PiGDM's weight at flow time ``t`` (1 = noise), clipped at ``beta``. With tau = 1 - t (the
    paper's time), (1 - tau) / (tau r^2), r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2), which is
    (t^2 + (1 - t)^2) / (t (1 - t)): infinite at both ends, 2 at t = 0.5."""
    if t <= 0.0 or t >= 1.0:
        return beta
    return min(beta, (t * t + (1 - t) ** 2) / (t * (1 - t)))


def _detach_cache(cache) -> None:
    # The step writes its suffix k/v into the cache in place; cut last step's graph off so each
    # vector-Jacobian product only reaches its own step.
    cache.k = [k.detach() for k in cache.k]
    cache.v = [v.detach() for v in cache.v]


def guided_sample(
    head: FlowHead,
    backbone: Backbone,
    batch: Batch,
    target: Tensor,
    weights: Tensor,
    noise: Tensor,
    beta: float = 5.0,
    num_steps: int | None = None,
    guidance: str = "vjp",
) -> Tensor:
    """Inference-time RTC. ``target`` fp32 [B, H, A]: the previous chunk's leftover actions
    aligned to this chunk's steps (anything where ``weights`` is 0); ``weights`` fp32 [B, H, A]:
    ``prefix_weights`` per step times 1 on the env's action dims, 0 on padded ones. ``noise``
    [B, H, A] standard normal. ``guidance``: ``vjp`` (the paper's: the weighted error through
    the vector-Jacobian product of the clean-chunk estimate) or ``identity`` (the weighted error
    itself, as LeRobot's ``RTCProcessor``; no backward pass). -> actions fp32 [B, H, A] (normalized)."""
    c = head.cfg
    assert target.shape == noise.shape == weights.shape, (target.shape, noise.shape, weights.shape)
    if guidance not in GUIDANCE_MODES:
        raise ValueError(f"guidance must be one of {' | '.join(GUIDANCE_MODES)}, got {guidance!r}")
    n = num_steps or c.head_options.num_denoise_steps
    if guidance == "identity":  # no autograd: nothing to leave inference mode or unfreeze for
        with torch.no_grad():
            cache, positions, mask, state = head.prefill(backbone, batch)
            args = (noise.float() * c.head_options.noise_scale, target.float(), weights.float(), beta, n)
            return _guided_loop(head, backbone, cache, positions, mask, state, *args, vjp=False)
    # Guidance needs x's gradient. Under a caller's inference_mode (a robot loop, LeRobot's
    # select_action), enable_grad alone does not bring autograd back (LeRobot's guidance raises
    # there): leave inference mode, and copy tensors made in it, which autograd may not save.
    with torch.inference_mode(False):
        target, weights, noise = (_normal(t.float()) for t in (target, weights, noise))
        with torch.no_grad():
            cache, positions, mask, state = head.prefill(backbone, batch)
        x = noise * c.head_options.noise_scale
        # Only x needs a gradient: with the weights frozen, autograd records no weight-gradient paths.
        trainable = [p for p in backbone.parameters() if p.requires_grad]
        for p in trainable:
            p.requires_grad_(False)
        try:
            return _guided_loop(head, backbone, cache, positions, mask, state, x, target, weights, beta, n)
        finally:
            for p in trainable:
                p.requires_grad_(True)


def _normal(t: Tensor) -> Tensor:
    """``t``, or a normal copy of it if it is an inference tensor."""
    return t.clone() if t.is_inference() else t


def _guided_loop(
    head, backbone, cache, positions, mask, state, x, target, weights, beta, n, vjp=True
) -> Tensor:
    """Euler steps from t = 1 to 0, each pulled toward ``target`` by the weighted error between it
    and the step's clean-chunk estimate: through the estimate's VJP (``vjp``), or as it is."""
    b, dt = x.shape[0], -1.0 / n
    for i in range(n):
        tval = 1.0 + i * dt
        t = torch.full((b,), tval, device=x.device)
        if not vjp:
            v = head.denoise_step(backbone, cache, state, x, t, positions, mask)
            g = (target - (x - tval * v)) * weights
            x = x + dt * (v - guidance_weight(tval, beta) * g)
            continue
        _detach_cache(cache)
        x_in = x.detach().requires_grad_(True)
        with torch.enable_grad():
            v = head.denoise_step(backbone, cache, state, x_in, t, positions, mask)
            clean = x_in - tval * v  # the step's prediction of the final chunk
            err = (target - clean) * weights
            (g,) = torch.autograd.grad(clean, x_in, err.detach())
        # g moves x toward the target; the Euler step runs backwards in t, so it enters as -g.
        x = (x + dt * (v.detach() - guidance_weight(tval, beta) * g)).detach()
    return x


def prefix_sample(
    head: FlowHead,
    backbone: Backbone,
    batch: Batch,
    prefix: Tensor,
    prefix_len: Tensor,
    noise: Tensor,
    num_steps: int | None = None,
) -> Tensor:
    """Training-time RTC. ``prefix`` fp32 [B, H, A]: the committed actions in its first
    ``prefix_len`` long [B] steps (the rest is ignored); they are fed with flow time 0 and kept.
    -> actions fp32 [B, H, A] (normalized), equal to ``prefix`` on the committed steps."""
    c = head.cfg
    b, h, _ = noise.shape
    assert prefix.shape == noise.shape and prefix_len.shape == (b,), (prefix.shape, prefix_len.shape)
    committed = torch.arange(h, device=noise.device)[None] < prefix_len.to(noise.device)[:, None]
    n = num_steps or c.head_options.num_denoise_steps
    cache, positions, mask, state = head.prefill(backbone, batch)
    prefix = prefix.float()
    x = torch.where(committed[..., None], prefix, noise.float() * c.head_options.noise_scale)
    dt = -1.0 / n
    for i in range(n):
        t = torch.where(committed, 0.0, 1.0 + i * dt)  # [B, H]: a flow time per action token
        x = x + dt * head.denoise_step(backbone, cache, state, x, t, positions, mask)
        x = torch.where(committed[..., None], prefix, x)
    return x
