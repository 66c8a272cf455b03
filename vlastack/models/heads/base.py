"""The action-head interface: what ``VLA``, the trainer, ``Policy`` and the exporter may call.

A head turns the backbone's prefix into actions. It owns its own layers (``head.*`` weights), its
training loss and its sampler; it reads the backbone through ``Backbone`` only. Pick one by name
in ``models/heads/__init__.py`` ``HEADS`` (adding a head: docs/adding-a-head.md).

``ActionHead`` is the written protocol; ``HeadBase`` gives every optional hook a no-op default.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig
from vlastack.models.backbone import Backbone
from vlastack.nn.init import lecun_init_


class ActionOutput(NamedTuple):
    """A sampled chunk: actions fp32 [B, H, A] (normalized units) and valid bool [B] or None.

    ``valid`` False: the head could not decode a full chunk for that sample (e.g. a truncated
    FAST sequence); its actions are zeros that must not be executed. None: always valid (flow)."""

    actions: Tensor
    valid: Tensor | None = None


class ActionHead(Protocol):
    """What every head provides. ``backbone`` is the model's ``Backbone`` (``VLA`` is one)."""

    def __init__(self, cfg: ModelConfig) -> None: ...

    def loss(self, backbone: Backbone, batch: Batch, **kwargs: Any) -> dict[str, Tensor]:
        """Training loss -> {"loss": scalar fp32, other logged terms}. ``kwargs``: head-specific
        fixed randomness for tests (the flow head's ``noise`` and ``time``)."""
        ...

    def sample(
        self, backbone: Backbone, batch: Batch, noise: Tensor | None = None, **kwargs: Any
    ) -> ActionOutput:
        """A chunk for each sample. ``noise`` [B, H, A]: a flow head's starting noise (others ignore
        it); ``kwargs``: ``generator`` (every head takes it: the seeded draws of a sampler that
        draws, e.g. a token head at temperature > 0) and head-specific options (the flow head's
        ``num_steps``, ``cache``)."""
        ...

    def frozen_backbone_params(self, backbone: Backbone) -> list[str]:
        """Backbone parameter names (relative to ``backbone``) this head's loss cannot reach."""
        ...

    def prepare(self, dataset: Any) -> None:
        """Before training, with the training dataset (e.g. fit an action tokenizer)."""
        ...

    def copy_extra_from(self, other: ActionHead) -> None:
        """Take over ``other``'s non-weight state (e.g. a fitted tokenizer) when exporting a copy."""
        ...

    def save_extra(self, path: Path) -> None: ...

    def load_extra(self, path: Path) -> None: ...

    def check_exportable(self) -> None:
        """Raise ValueError when ``vla export`` cannot trace this head's sampler."""
        ...

    def compile_decoding(self, **kwargs: Any) -> None:
        """torch.compile the per-step hot part of ``sample`` (fullgraph, static shapes)."""
        ...

    def reset_parameters(self, std: float = 0.02) -> None:
        """Initialise the head's own layers; ``VLA`` calls it after initialising the backbone."""
        ...

    def loss_terms(self, batch: Batch) -> Tensor | None:
        """How many terms ``loss`` averages over in ``batch`` (e.g. real action steps x dims), so the
        trainer can divide every rank's sum by the global batch's count (``loss_denominator``);
        None: the loss is a plain mean over samples, or the head does not say."""
        ...

    def loss_draws(
        self, batch_size: int, actions_shape: tuple[int, ...], generator: torch.Generator
    ) -> dict | None:
        """The random draws of one training loss over ``batch_size`` samples, from ``generator``, in
        the order ``loss`` draws them itself; passed back to ``loss`` as its ``kwargs``. The trainer
        draws them for the global batch under DDP/FSDP and gives each rank its slice, so several
        ranks train as one process does on the same global batch. None: the loss draws in its own
        forward (each rank then draws its own: equal in distribution, not step for step)."""
        ...


class HeadBase(nn.Module):
    """No-op defaults for the optional hooks of ``ActionHead``."""

    def frozen_backbone_params(self, backbone: Backbone) -> list[str]:
        return []

    def reset_parameters(self, std: float = 0.02) -> None:
        lecun_init_(self.modules(), std)  # the backbone's init; override for a head's own

    def prepare(self, dataset: Any) -> None:
        pass

    def copy_extra_from(self, other: ActionHead) -> None:
        pass

    def save_extra(self, path: Path) -> None:
        pass

    def load_extra(self, path: Path) -> None:
        pass

    def check_exportable(self) -> None:
        pass

    def loss_terms(self, batch: Batch) -> Tensor | None:
        return None

    def loss_draws(
        self, batch_size: int, actions_shape: tuple[int, ...], generator: torch.Generator
    ) -> dict | None:
        return None

    def host_inputs(self, batch: Batch) -> dict[str, Tensor]:
        """Loss inputs the head computes on the host (numpy, a tokenizer library) before the
        training step, so a compiled step (``train.compile``, fullgraph) never meets them."""
        return {}

    def compile_decoding(self, **kwargs: Any) -> None:
        # A head without a compilable decode step says so: Policy(compile=True) must never be a
        # silent no-op (issue #36).
        warnings.warn(
            f"{type(self).__name__} has no compile_decoding(): compile=True leaves its sampling eager",
            stacklevel=2,
        )
