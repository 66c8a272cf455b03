"""Non-finite detection used by the trainer to skip bad steps."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


def is_finite(x: Tensor | float) -> bool:
    """True if a scalar tensor or float is neither NaN nor inf (one host sync for a tensor)."""
    if isinstance(x, Tensor):
        return bool(torch.isfinite(x).all())
    return x == x and abs(x) != float("inf")


def nonfinite_grads(params: Iterable[nn.Parameter] | nn.Module, names: bool = True) -> list[str]:
    """Names (or indices) of parameters whose gradient holds a NaN or inf (for error messages)."""
    items = params.named_parameters() if isinstance(params, nn.Module) else enumerate(params)
    bad = []
    for n, p in items:
        g = p.grad
        if g is not None and not bool(torch.isfinite(g).all()):
            bad.append(str(n))
    return bad
