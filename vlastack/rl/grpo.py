"""GRPO's head-agnostic pieces: group-relative advantages and the clipped surrogate loss. What a
head samples and its log-probabilities are the head's own (``rl_sample`` / ``rl_logprobs`` of its
serving class: ``models/heads/flow/rl.py``, ``models/heads/tokens/rl.py``)."""

from __future__ import annotations

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, groups: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """GRPO: each episode's reward minus its group's mean, over the group's std.

    rewards fp32 [E], groups int64 [E] (episodes of one seed share a group id). -> (advantages
    fp32 [E], informative bool [E]: the group's rewards differ; the others get advantage 0)."""
    n = int(groups.max()) + 1 if groups.numel() else 0
    count = torch.zeros(n).index_add_(0, groups, torch.ones_like(rewards))
    mean = torch.zeros(n).index_add_(0, groups, rewards) / count.clamp(min=1)
    var = torch.zeros(n).index_add_(0, groups, (rewards - mean[groups]) ** 2) / count.clamp(min=1)
    std = var.sqrt()
    informative = std[groups] > eps
    adv = torch.where(informative, (rewards - mean[groups]) / (std[groups] + eps), torch.zeros_like(rewards))
    return adv, informative


def clipped_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO-clip surrogate per token, averaged over every sampled token of the minibatch
    (DAPO's token-level mean), + ``kl_coef`` x the k3 estimate of KL(policy || reference).

    logp, old_logp, ref_logp fp32 [B, L]; adv fp32 [B] (the episode's, on each of its tokens);
    mask bool [B, L]. -> (loss, stats: clip fraction, KL, ratio deviation)."""
    m = mask.float()
    n = m.sum().clamp(min=1.0)
    # A flow step's log-ratio sums H x A dims and can leave exp's range after a large update;
    # the clamp only bites far outside the clip range, where the surrogate is flat or pessimistic.
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    a = adv[:, None]
    surr = torch.minimum(ratio * a, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * a)
    loss = -(surr * m).sum() / n
    stats = {}
    with torch.no_grad():
        clipped = ((ratio < 1.0 - clip_low) & (a < 0)) | ((ratio > 1.0 + clip_high) & (a > 0))
        stats["clip_fraction"] = (clipped.float() * m).sum() / n
        stats["ratio_dev"] = ((ratio - 1.0).abs() * m).sum() / n
    if ref_logp is not None:
        d = (ref_logp - logp).clamp(-20.0, 20.0)  # as the ratio: a flow step's sum can overflow exp
        kl = torch.exp(d) - d - 1.0  # k3: unbiased, >= 0
        stats["kl"] = (kl.detach() * m).sum() / n
        if kl_coef > 0:
            loss = loss + kl_coef * (kl * m).sum() / n
    return loss, stats
