"""Hand-written LoRA: ``y = x W^T + b + scale * dropout(x) A^T B^T``, with merge and unmerge.

Applied by module-name patterns (``apply_lora(model, ["q_proj", "v_proj"], rank=8)``); after it
only LoRA parameters are trainable. B starts at zero so a fresh adapter leaves outputs unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import torch
from torch import Tensor, nn


class LoRALinear(nn.Module):
    """Wraps an ``nn.Linear``: [..., in] -> [..., out]. ``lora_A`` [r, in], ``lora_B`` [out, r]."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float = 16.0, dropout: float = 0.0) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"LoRA rank must be > 0, got {rank}")
        self.base = base
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        dev, dt = base.weight.device, base.weight.dtype
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=dev, dtype=dt))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=dev, dtype=dt))
        if dev.type != "meta":
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False

    @property
    def weight(self) -> Tensor:  # so code that reads `.weight` (e.g. dtype checks) keeps working
        return self.base.weight

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        if self.merged:
            return y
        # in place on the base output (autograd does not keep it): no [..., out] temporaries beyond the
        # adapter's own product, which is what the step's transient memory is made of
        low = self.dropout(x) @ self.lora_A.t().to(x.dtype)  # [..., r]
        return y.add_(low @ self.lora_B.t().to(x.dtype), alpha=self.scaling)

    def delta_weight(self) -> Tensor:
        """[out, in]"""
        return (self.lora_B.float() @ self.lora_A.float()) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        if not self.merged:
            self.base.weight += self.delta_weight().to(self.base.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        if self.merged:
            self.base.weight -= self.delta_weight().to(self.base.weight.dtype)
            self.merged = False


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(re.search(p, name) for p in patterns)


def apply_lora(
    model: nn.Module,
    targets: Iterable[str],
    rank: int,
    alpha: float = 16.0,
    dropout: float = 0.0,
    exclude: Iterable[str] = (),
) -> list[str]:
    """Replace every ``nn.Linear`` whose qualified name matches a ``targets`` regex (and no
    ``exclude`` regex) with a ``LoRALinear``; freeze everything else. Returns the wrapped names.
    """
    targets, exclude = list(targets), list(exclude)
    wrapped = []
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and _matches(name, targets) and not _matches(name, exclude):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, LoRALinear(module, rank, alpha, dropout))
            wrapped.append(name)
    if not wrapped:
        raise ValueError(f"LoRA targets {targets} matched no nn.Linear module")
    for n, p in model.named_parameters():
        p.requires_grad_(".lora_A" in n or ".lora_B" in n or n.startswith(("lora_A", "lora_B")))
    return wrapped


def lora_modules(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def merge_lora(model: nn.Module) -> None:
    for m in lora_modules(model):
        m.merge()


def unmerge_lora(model: nn.Module) -> None:
    for m in lora_modules(model):
        m.unmerge()


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the adapter tensors (what a LoRA fine-tune saves)."""
    return {k: v for k, v in model.state_dict().items() if ".lora_A" in k or ".lora_B" in k}


def remove_lora(model: nn.Module) -> None:
    """Merge adapters and put the plain ``nn.Linear`` back (for export)."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            module.merge()
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.base)
