"""GRPO's pieces for a token head: the log-probability of sampled action tokens, group-relative
advantages, and the clipped surrogate loss.

The policy is the distribution the rollouts sampled from: the head's logits at each action
position, restricted as ``TokenHead.pick`` restricts them (``constrained``: action ids and the end
id only; length-constrained FAST: pieces that still fit the chunk, the end id exactly when it is
full), divided by the sampling temperature. ``token_logprobs`` recomputes it with one
teacher-forced pass in the inference layout (the grounded head reads its own grounding, not the
recorded one), which equals the cached decode that sampled the tokens
(tests/models/test_token_decoding.py; tests/rl/test_grpo.py checks the greedy tokens are its argmax).
"""

from __future__ import annotations

import torch
from torch import Tensor

from vlastack.batch import Batch


def sampled_logits(model: torch.nn.Module, batch: Batch, ids: Tensor) -> tuple[Tensor, Tensor]:
    """The logits the decoder picked each of ``ids`` [B, L] from, restricted as ``pick`` restricts
    them (disallowed ids -inf). -> (logits fp32 [B, L, V], mask bool [B, L]: the positions that
    were sampled, up to and including the first end token; later rows are left unrestricted)."""
    head = model.head
    if ids.ndim != 2 or ids.shape[1] != head.num_steps:
        raise ValueError(
            f"ids must be [B, {head.num_steps}] (the head's decode length), got {tuple(ids.shape)}"
        )
    h = head._run(model, batch, head.embed_ids(model, ids[:, :-1]), causal=True)  # [B, L, W]
    logits = head.logits(model, h).float()  # [B, L, V]
    if head.end_id is None:
        mask = torch.ones_like(ids, dtype=torch.bool)
    else:
        is_end = (ids == head.end_id).long()
        mask = (is_end.cumsum(-1) - is_end) == 0  # nothing before this position was the end
    if head.cfg.head_options.constrained:
        allowed = head.allowed_ids[None, None].expand_as(logits)
        if head.length_constrained:
            lens = head.piece_len[ids]  # symbols each id writes [B, L]
            room = (head.chunk_symbols - (lens.cumsum(-1) - lens))[..., None]  # before each position
            allowed = allowed & (head.piece_len[None, None] <= room)
            allowed = torch.where(head.is_end[None, None], room == 0, allowed)
        # Past the end nothing was sampled; leaving those rows unmasked keeps their softmax finite
        # (a row of -inf gives NaN gradients even where the loss multiplies it by 0).
        logits = logits.masked_fill(~(allowed | ~mask[..., None]), float("-inf"))
    return logits, mask


def token_logprobs(
    model: torch.nn.Module, batch: Batch, ids: Tensor, temperature: float
) -> tuple[Tensor, Tensor]:
    """Log-probabilities of the sampled LM ids [B, L] under ``model`` at ``temperature``.

    -> (logp fp32 [B, L], mask bool [B, L] as in ``sampled_logits``; 0 in ``logp`` outside it)."""
    logits, mask = sampled_logits(model, batch, ids)
    logp = (logits / temperature).log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    return torch.where(mask, logp, torch.zeros_like(logp)), mask


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
