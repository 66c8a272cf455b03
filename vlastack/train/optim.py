"""Optimizer pieces: per-part parameter groups, AdamW (or 8-bit AdamW), warmup + cosine, EMA.

Parts of a ``VLA`` (for ``train.lr_vision`` / ``lr_vlm`` / ``lr_expert`` / ``lr_head``; a learning
rate of 0 freezes the part):

- vision: ``vision.*`` and ``projector.*``
- expert: ``decoder.layers.*.expert.*`` and ``decoder.expert_norm.*``
- head: ``head.*``, the head's own layers (``lr_head`` None: ``lr_expert`` for a head that drives
  the action expert, whose input and output layers they are; ``lr`` for one that does not)
- vlm: the rest of ``decoder.*`` (embeddings, VLM blocks, final norm)

Weight decay applies to matrices only (not to norms, biases or 1-d parameters).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vlastack.config import TrainConfig

PARTS = ("vision", "vlm", "expert", "head")


def part_of(name: str) -> str:
    """Which part a parameter name of a ``VLA`` belongs to (see module docstring)."""
    n = name.removeprefix("module.").removeprefix("_orig_mod.")
    if n.startswith(("vision.", "projector.")):
        return "vision"
    if n.startswith("head."):
        return "head"
    if ".expert." in n or n.startswith("decoder.expert_norm"):
        return "expert"
    return "vlm"


def part_lrs(cfg: TrainConfig, uses_expert: bool = True) -> dict[str, float]:
    """Learning rate per part; ``uses_expert``: the head drives the action expert (its spec's)."""
    head = cfg.lr_head if cfg.lr_head is not None else (cfg.lr_expert if uses_expert else None)
    lrs = {"vision": cfg.lr_vision, "vlm": cfg.lr_vlm, "expert": cfg.lr_expert, "head": head}
    return {k: cfg.lr if v is None else v for k, v in lrs.items()}


def _uses_expert(model: nn.Module) -> bool:
    cfg = getattr(model, "cfg", None)  # a VLA's ModelConfig
    return cfg.head_spec.uses_expert if hasattr(cfg, "head_spec") else True


def freeze_parts(model: nn.Module, cfg: TrainConfig) -> list[str]:
    """Set ``requires_grad=False`` on the parts whose learning rate is 0. Returns the frozen parts."""
    frozen = [p for p, lr in part_lrs(cfg, _uses_expert(model)).items() if lr == 0]
    for name, p in model.named_parameters():
        if part_of(name) in frozen:
            p.requires_grad_(False)
    return frozen


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """One group per (part, decay) with parameters that require grad; ``base_lr`` kept per group."""
    lrs = part_lrs(cfg, _uses_expert(model))
    groups: dict[tuple[str, bool], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decay = p.ndim >= 2 and "embed" not in name
        groups.setdefault((part_of(name), decay), []).append(p)
    out = []

    # The head's groups sort beside the expert's (within each decay flag): the gradient norm sums
    # the groups' parameters in this order, so it (and the fp32 losses) stay bit-identical to
    # before the head had its own group, when its parameters ended the expert's.
    def order(item: tuple[tuple[str, bool], list]) -> tuple[str, bool, bool]:
        part, decay = item[0]
        return ("expert" if part == "head" else part, decay, part == "head")

    for (part, decay), params in sorted(groups.items(), key=order):
        out.append(
            {
                "params": params,
                "lr": lrs[part],
                "base_lr": lrs[part],
                "weight_decay": cfg.weight_decay if decay else 0.0,
                "name": f"{part}{'' if decay else '.no_decay'}",
            }
        )
    if not out:
        raise ValueError("no trainable parameters: every part is frozen (lr 0) or requires_grad is False")
    return out


def build_optimizer(model: nn.Module, cfg: TrainConfig, fused: bool | None = None) -> torch.optim.Optimizer:
    """AdamW over ``param_groups`` (or bitsandbytes' 8-bit AdamW). ``fused``: None picks by the
    parameters' device (fused kernels on CUDA, foreach elsewhere); ``vla plan`` sets it to simulate
    another device's step, whose temporaries differ (foreach holds a full-size temporary per
    moment update, fused none)."""
    groups = param_groups(model, cfg)
    if cfg.optimizer == "adamw8bit":
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise ValueError(
                "train.optimizer=adamw8bit needs bitsandbytes: pip install -e '.[bnb]' "
                "(or use train.optimizer=adamw)"
            ) from None
        return bnb.optim.AdamW8bit(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    if fused is None:
        fused = next(p.device for g in groups for p in g["params"]).type == "cuda"
    # fused kernels on CUDA; foreach elsewhere. Neither changes the math.
    kw = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, **kw)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup from 0 to 1 over ``warmup_steps``, then cosine down to ``min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class WarmupCosine(torch.optim.lr_scheduler.LRScheduler):
    """``lr = base_lr * lr_factor(step)`` per group; the state is plain numbers (JSON-friendly)."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: TrainConfig, last_epoch: int = -1) -> None:
        self.tcfg = cfg
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        f = lr_factor(self.last_epoch, self.tcfg)
        return [base * f for base in self.base_lrs]

    def state_dict(self) -> dict:
        return {k: v for k, v in super().state_dict().items() if k not in ("tcfg", "optimizer")}


def run_settings(optimizer: torch.optim.Optimizer) -> list[tuple[float, float]]:
    """(base lr, weight decay) per group, as this run's config set them (before a resume loads the
    saved state over them)."""
    return [(g["initial_lr"], g["weight_decay"]) for g in optimizer.param_groups]


def put_settings(
    optimizer: torch.optim.Optimizer, scheduler: WarmupCosine, settings: list[tuple[float, float]]
) -> None:
    """After loading a checkpoint: this run's (base lr, weight decay) per group, and the lr at the
    resumed step on this run's schedule. The saved optimizer and scheduler carry the settings the
    run started with, so a resume with train.lr=... would otherwise keep the old lr while its log
    says the setting changed. Unchanged settings give back the saved numbers exactly."""
    scheduler.base_lrs = [lr for lr, _ in settings]
    now = scheduler.get_lr()
    for g, (lr, wd), cur in zip(optimizer.param_groups, settings, now, strict=True):
        g["initial_lr"], g["base_lr"], g["weight_decay"], g["lr"] = lr, lr, wd, cur
    scheduler._last_lr = list(now)


class EMA:
    """Exponential moving average of the trainable parameters, kept in fp32.

    ``shadow[i] = decay * shadow[i] + (1 - decay) * param[i]`` after every optimizer step. Under
    FSDP2 parameters are DTensors and the average is kept on the local shards.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        params = dict(model.named_parameters())
        self.shadow = [_local(params[n]).detach().float().clone() for n in self.names]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        params = dict(model.named_parameters())
        cur = [_local(params[n]).detach().float() for n in self.names]
        torch._foreach_lerp_(self.shadow, cur, 1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.shadow))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = [n for n in self.names if n not in state]
        if missing:
            raise ValueError(f"EMA state lacks {missing[:3]}")
        for i, n in enumerate(self.names):
            self.shadow[i].copy_(state[n])

    @torch.no_grad()
    def swap(self, model: nn.Module) -> None:
        """Exchange model weights and EMA weights (call twice to restore)."""
        params = dict(model.named_parameters())
        for i, n in enumerate(self.names):
            p = _local(params[n])
            tmp = p.detach().clone()
            p.copy_(self.shadow[i].to(p.dtype))
            self.shadow[i].copy_(tmp.float())


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2), the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t
