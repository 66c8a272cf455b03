"""A token head as the stochastic policy ``vla rl`` reinforces (``TokenServing.rl_sample`` /
``rl_logprobs``): the log-probability of its sampled action tokens.

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
