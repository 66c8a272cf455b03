"""A flow head as the stochastic policy ``vla rl`` reinforces (``FlowServing.rl_sample`` /
``rl_logprobs``), with tractable log-probabilities (Flow-Noise / ReinFlow).

The deterministic Euler sampler ``x_{k+1} = x_k + dt v(x_k, t_k)`` becomes a Markov chain of
Gaussian steps by adding noise at every denoising step:

    x_{k+1} ~ N(x_k + dt v(x_k, t_k), sigma^2 |dt|),   k = 0 .. n-1,   dt = -1/n

so a chunk's log-probability given its trajectory ``x_0 .. x_n`` is the sum of ``n`` Gaussian
log-densities, each a function of the velocity network. GRPO then treats the ``n`` denoising steps
of a chunk as its "tokens" (``grpo.clipped_loss``: one ratio per step). ``x_0`` is the sampler's
own start (noise at ``head_options.noise_scale``); it has no parameters, so it cancels in every
ratio. ``sigma`` (``rl.flow_sigma``) is fixed, as in ReinFlow's fixed-noise variant.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vlastack.batch import Batch


def flow_sample(
    model: torch.nn.Module, batch: Batch, sigma: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """The cached sampler with noise at every step. -> (actions fp32 [B, H, A], the trajectory
    fp32 [B, n + 1, H, A], x_0 first)."""
    head, c = model.head, model.cfg
    n = c.head_options.num_denoise_steps
    b, dev = batch["state"].shape[0], batch["state"].device
    shape = (b, c.action_horizon, c.action_dim)
    x = torch.randn(shape, generator=generator, device=dev) * c.head_options.noise_scale
    cache, positions, mask, state = head.prefill(model, batch)
    dt = -1.0 / n
    traj = [x]
    for i in range(n):
        t = torch.full((b,), 1.0 + i * dt, device=dev)
        v = head.denoise_step(model, cache, state, x, t, positions, mask)
        x = x + dt * v + sigma * math.sqrt(-dt) * torch.randn(shape, generator=generator, device=dev)
        traj.append(x)
    return x, torch.stack(traj, dim=1)


def flow_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    traj: Tensor,
    sigma: float,
    real_dims: int,
    horizon: int = 0,
) -> tuple[Tensor, Tensor]:
    """Log-probability of each denoising step of ``traj`` [B, n + 1, H, A] under ``model``, over
    the first ``real_dims`` action dims (the padded ones are the model's, not the robot's) and the
    chunk's first ``horizon`` actions (0 = all H; ``rl.flow_logp_steps``).

    All ``B * n`` velocities in one pass with gradients: the prefix once, the n suffixes against it.
    -> (logp fp32 [B, n], mask bool [B, n], all True)."""
    head = model.head
    b, n1, h, a = traj.shape
    n = n1 - 1
    if n != model.cfg.head_options.num_denoise_steps:
        raise ValueError(
            f"trajectory has {n} steps, the head takes {model.cfg.head_options.num_denoise_steps}"
        )
    dt = -1.0 / n
    # The prefix runs once, with gradients, into a fresh cache; its k/v are then repeated for the
    # n steps, whose suffixes run as one batch of B * n against it: the cached sampler's own path,
    # ~n times cheaper than recomputing the prefix per step (velocity_full).
    cache, positions, mask, state = head.prefill(model, batch)
    cache.k = [k.repeat_interleave(n, 0) for k in cache.k]
    cache.v = [v.repeat_interleave(n, 0) for v in cache.v]
    xs = traj[:, :-1].reshape(b * n, h, a)
    ts = (1.0 + dt * torch.arange(n, device=traj.device, dtype=torch.float32)).repeat(b)
    v = head.denoise_step(
        model,
        cache,
        state.repeat_interleave(n, 0),
        xs,
        ts,
        positions.repeat_interleave(n, 0),
        mask.repeat_interleave(n, 0),
    ).view(b, n, h, a)
    std = sigma * math.sqrt(-dt)
    z = (traj[:, 1:] - (traj[:, :-1] + dt * v)) / std
    lp = -0.5 * z.pow(2) - math.log(std) - 0.5 * math.log(2 * math.pi)
    lp = lp[:, :, : horizon or h, :real_dims]
    return lp.sum((-1, -2)), torch.ones(b, n, dtype=torch.bool, device=traj.device)
