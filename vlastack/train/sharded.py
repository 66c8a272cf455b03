"""What a training checkpoint holds of the model, the optimizer and the EMA, two ways.

- **Gathered** (``train.checkpoint_format=policy``): the whole state on CPU (under FSDP2 every
  shard is gathered to every rank, rank 0 writes), so each checkpoint is also a policy folder that
  ``vla eval`` and ``Policy.from_pretrained`` read.
- **Sharded** (``train.checkpoint_format=sharded``; ``auto`` picks it under FSDP2/HSDP):
  ``torch.distributed.checkpoint`` writes each rank's own shards into ``<ckpt>/dcp/`` (one file per
  rank, plus ``.metadata``) and gathers nothing. A load reshards to whatever world size the resumed
  run has (2 -> 1 -> 4): DCP reads the slices each rank's new shards need. The policy folder is
  gathered once, at the end (``<run>/final``), and at evaluation steps (the evaluator reads it).

Under DDP and in one process the tensors are whole on every rank; DCP writes each tensor once
(its save planner spreads replicated tensors over the ranks), so no rank writes a full copy either.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from vlastack.config import Config
from vlastack.models.vla import VLA
from vlastack.nn.lora import apply_lora, lora_state_dict, remove_lora
from vlastack.train import checkpoint as ck

DCP_DIR = "dcp"


def is_sharded(ckpt: str | Path) -> bool:
    """``ckpt`` was written by ``save_sharded`` (``dcp/.metadata``), not as a policy folder."""
    return (Path(ckpt) / DCP_DIR / ".metadata").is_file()


# ----------------------------------------------------------------------------- gathered


def export_policy(
    state: dict[str, torch.Tensor],
    folder: Path,
    cfg: Config,
    head: nn.Module,
    normalizer: Any,
    data_root: Any,
) -> None:
    """A policy folder (weights + config.json, config.yaml, norm_stats.json) from a full state;
    LoRA runs: the adapter alone too, and the weights merged. ``head``: the live model's head, for
    what is not a tensor (e.g. a fitted action tokenizer)."""
    with torch.device("meta"):
        m = VLA(cfg.model)
    t = cfg.train
    if t.lora_rank > 0:
        apply_lora(m, t.lora_targets, t.lora_rank, t.lora_alpha, t.lora_dropout, m.unreachable_linears)
        # merging writes into the base weights: copy, since ``state`` may alias the live model
        state = {k: v.clone() for k, v in state.items()}
    m.load_state_dict(state, assign=True)
    m.head.copy_extra_from(head)
    if t.lora_rank > 0:
        save_file(
            {k: v.contiguous() for k, v in lora_state_dict(m).items()}, str(folder / "adapter.safetensors")
        )
        remove_lora(m)  # merge: the exported weights are plain and load without LoRA code
    m.save_pretrained(folder)
    ck.write_common(folder, cfg, normalizer, data_root)


def checkpoint_bytes(model: nn.Module, optimizer: torch.optim.Optimizer, ema: bool) -> int:
    """About what one checkpoint writes: the weights (twice with EMA) and the optimizer state."""
    weights = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    optim = sum(
        v.numel() * v.element_size()
        for st in optimizer.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor)
    )
    return weights * (2 if ema else 1) + optim


def full_model_state(model: nn.Module, fsdp: bool) -> dict[str, torch.Tensor]:
    """The whole model state dict on CPU (a collective under FSDP2: every rank must call)."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def set_full_model_state(model: nn.Module, state: dict[str, torch.Tensor], fsdp: bool) -> None:
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(state)


def full_optim_state(model: nn.Module, optimizer: torch.optim.Optimizer, fsdp: bool) -> dict:
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(model, optimizer, options=opts)
    return optimizer.state_dict()


def set_full_optim_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, fsdp: bool) -> None:
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=opts)
    else:
        optimizer.load_state_dict(state)


# ----------------------------------------------------------------------------- sharded


def _ema_state(model: nn.Module, ema) -> dict[str, torch.Tensor]:
    """The EMA shadow as DCP state: under FSDP2 each local shard wrapped as a DTensor laid out as
    its parameter is (so DCP knows which slice of the whole tensor it is), else the tensor itself."""
    from torch.distributed.tensor import DTensor

    params = dict(model.named_parameters())
    out = {}
    for name, shadow in ema.state_dict().items():
        p = params[name]
        if isinstance(p, DTensor):
            out[name] = DTensor.from_local(
                shadow, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
            )
        else:
            out[name] = shadow
    return out


def _state(model: nn.Module, optimizer: torch.optim.Optimizer, ema) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    if ema is not None:
        state["ema"] = _ema_state(model, ema)
    return state


@contextmanager
def _quiet_single_process():
    # One process without a process group is a supported case (DCP says it assumes it): not news.
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


def save_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, ema) -> None:
    """Every rank writes its own shards of model, optimizer and EMA to ``folder/dcp`` (collective)."""
    import torch.distributed.checkpoint as dcp

    with _quiet_single_process():
        dcp.save(_state(model, optimizer, ema), checkpoint_id=str(Path(folder) / DCP_DIR))


def load_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, ema) -> None:
    """Read ``folder/dcp`` into this run's model, optimizer and EMA, at this run's world size and
    layout, whatever the writer's were (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(model, optimizer, ema)
    with _quiet_single_process():
        dcp.load(state, checkpoint_id=str(Path(folder) / DCP_DIR))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if ema is not None:
        local = {k: v.to_local() if hasattr(v, "to_local") else v for k, v in state["ema"].items()}
        ema.load_state_dict(local)


def rescale_position(position: int, n: int, batch_size: int, old_world: int, new_world: int) -> int:
    """The data position (global micro-batches, ``ResumableBatchSampler``) of a run resumed on
    ``new_world`` ranks from one written on ``old_world``: the same epoch, and as many of that
    epoch's samples behind it, rounded up (no sample of the epoch is seen twice; at most one
    global micro-batch's worth is skipped)."""
    if old_world == new_world:
        return position
    g_old, g_new = batch_size * old_world, batch_size * new_world
    epoch, k = divmod(position, n // g_old)
    return epoch * (n // g_new) + min(n // g_new, -(-k * g_old // g_new))
