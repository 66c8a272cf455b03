"""One optimizer step: micro-batches with autocast and (fp16) loss scaling, no sync on the
non-stepping micro-steps, global-norm clipping, and skipping of non-finite steps."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from vlastack.batch import Batch
from vlastack.train.parallel import all_reduce_mean, no_grad_sync

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepResult:
    loss: float  # mean over micro-batches and ranks (NaN/inf when the step was bad)
    grad_norm: float  # global norm before clipping (NaN when not computed)
    ok: bool  # the optimizer applied the update
    scaled_skip: bool = False  # fp16: GradScaler found inf/NaN gradients and skipped (not an error)
    # Every other scalar the head returns (flow_loss, grounding_loss; the token head's ce, l1,
    # token_accuracy), mean over this rank's micro-batches: for logging only, not all-reduced.
    parts: dict[str, float] = field(default_factory=dict)


def autocast_ctx(device_type: str, precision: str):
    if precision not in DTYPES:  # "auto" is made concrete by the Trainer (train/precision.py)
        raise ValueError(
            f"precision {precision!r}: expected one of {sorted(DTYPES)}; resolve train.precision=auto "
            "first with vlastack.train.precision.resolve_auto"
        )
    dt = DTYPES[precision]
    if dt is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dt)


def make_scaler(device_type: str, precision: str) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler(device_type) if precision == "fp16" else None


def grad_norm_(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients (all ranks); clips in place when ``max_norm > 0``."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor, already reduced over shards
        norm = norm.full_tensor()
    return norm


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[Batch],
    *,
    device_type: str = "cpu",
    precision: str = "fp32",
    scaler: torch.amp.GradScaler | None = None,
    grad_clip: float = 1.0,
    loss_kwargs: list[dict] | None = None,
) -> StepResult:
    """Accumulate gradients over ``micro_batches`` and step ``optimizer`` once.

    Each micro-batch loss is divided by the number of micro-batches, so the update equals one
    step on their union (for equal-weight losses). Autocast stays on under FSDP2's bf16
    ``MixedPrecisionPolicy`` too: the model computes some inputs in fp32 on purpose (the flow
    interpolation, the time embedding) and feeds them to linears whose params are then bf16;
    autocast casts them (without it they raise a dtype mismatch). A non-finite loss (on any rank)
    skips the update and reports ``ok=False``.
    """
    n = len(micro_batches)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    total = torch.zeros((), device=micro_batches[0]["state"].device)
    part_sums: dict[str, torch.Tensor] = {}
    head = getattr(getattr(model, "module", model), "head", None)  # under DDP/FSDP: .module
    for i, mb in enumerate(micro_batches):
        kw = loss_kwargs[i] if loss_kwargs else {}
        extra = head.host_inputs(mb) if head is not None and hasattr(head, "host_inputs") else None
        if extra:  # eager, outside a compiled forward
            mb = {**mb, **extra}
        with no_grad_sync(model, skip=i < n - 1), autocast_ctx(device_type, precision):
            out = model(mb, **kw)
            loss = out["loss"] / n
        (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.detach().float()
        for k, v in out.items():
            if k != "loss" and isinstance(v, torch.Tensor) and v.dim() == 0:
                part_sums[k] = part_sums.get(k, 0.0) + v.detach().float() / n
    mean_loss = all_reduce_mean(total)
    loss_val = float(mean_loss)  # the step's one host sync; the parts below ride on it
    parts = {k: float(v) for k, v in part_sums.items()}
    if not torch.isfinite(mean_loss):
        optimizer.zero_grad(set_to_none=True)
        return StepResult(loss_val, float("nan"), ok=False, parts=parts)
    if scaler is not None:
        scaler.unscale_(optimizer)
    norm = float(grad_norm_(params, grad_clip))
    if scaler is not None:
        scale_before = scaler.get_scale()
        scaler.step(optimizer)  # skips the update itself when gradients hold inf/NaN
        scaler.update()
        skipped = scaler.get_scale() < scale_before
        optimizer.zero_grad(set_to_none=True)
        return StepResult(loss_val, norm, ok=not skipped, scaled_skip=skipped, parts=parts)
    if not (norm == norm and abs(norm) != float("inf")):
        optimizer.zero_grad(set_to_none=True)
        return StepResult(loss_val, norm, ok=False, parts=parts)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_val, norm, ok=True, parts=parts)
