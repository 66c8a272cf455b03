"""Weight initialisation shared by the backbone and the heads."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from vlastack.nn.norms import AdaRMSNorm


@torch.no_grad()
def lecun_init_(modules: Iterable[nn.Module], std: float = 0.02) -> None:
    """LeCun-normal init, N(0, 1/fan_in), for the linear and conv weights among ``modules``, N(0,
    ``std``) for embeddings, zero biases; adaptive norms' dense layers stay zero (``AdaRMSNorm``)
    and meta tensors are skipped. Modules are visited in the order given (it fixes the RNG draws)."""
    modules = list(modules)
    keep = {id(m.dense) for m in modules if isinstance(m, AdaRMSNorm)}
    for m in modules:
        if id(m) in keep:
            continue
        if isinstance(m, nn.Linear | nn.Conv2d | nn.Embedding) and m.weight.device.type != "meta":
            fan_in = m.weight[0].numel()
            nn.init.normal_(m.weight, std=std if isinstance(m, nn.Embedding) else fan_in**-0.5)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
