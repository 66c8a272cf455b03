"""Action heads behind one interface (``base.ActionHead``), built by ``model.head`` from the spec
registry ``config.HEAD_SPECS`` (``config/heads.py``: each head's classes and capabilities).

- ``flow``: Pi0 / Pi0.5 flow matching with an action expert (``flow/``);
- ``tokens``: discrete action tokens from the VLM's LM head: bins, FAST, parallel (``tokens/``);
- ``oft``: OpenVLA-OFT-style parallel decoding of a whole chunk with L1 regression (``oft/``);
- add-on: ``model.grounding.points > 0`` builds the spec's ``grounded`` class: ``GroundedFlowHead``
  (``flow/grounded.py``) or ``GroundedTokenHead`` (``tokens/grounded.py``), sharing ``grounding.py``.

Each head is a folder that owns everything about it: its layers, loss and sampler, how it serves
(its spec's ``serving``: ``serving.py``'s ``HeadServing`` unless it has its own), its fast path.

Adding a head: docs/adding-a-head.md. (Every registered head is listed above: a test checks it.)
"""

from __future__ import annotations

import importlib

from vlastack.config import HEAD_SPECS, ModelConfig
from vlastack.models.heads.base import ActionHead, ActionOutput, HeadBase
from vlastack.models.heads.flow import FlowHead, GroundedFlowHead
from vlastack.models.heads.serving import HeadServing
from vlastack.models.heads.tokens import GroundedTokenHead, TokenHead


def resolve(path: str) -> type[ActionHead]:
    """A spec's "module:Class" string -> the class."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# The registry lives in config.HEAD_SPECS (one entry per head); here its names become classes.
HEADS: dict[str, type[ActionHead]] = {name: resolve(spec.cls) for name, spec in HEAD_SPECS.items()}
GROUNDED: dict[str, type[ActionHead]] = {
    name: resolve(spec.grounded) for name, spec in HEAD_SPECS.items() if spec.grounded
}
# Every head's serving options with their defaults: a server's command line passes them all, and
# a head accepts another head's option at its default (serving.py).
HeadServing.ALL_OPTIONS = {
    k: v for spec in HEAD_SPECS.values() for k, v in resolve(spec.serving).OPTIONS.items()
}
HeadServing.ALL_DECODING = tuple(
    sorted({k for spec in HEAD_SPECS.values() for k in resolve(spec.serving).DECODING})
)

__all__ = [
    "GROUNDED",
    "HEADS",
    "ActionHead",
    "ActionOutput",
    "FlowHead",
    "GroundedFlowHead",
    "GroundedTokenHead",
    "HeadBase",
    "HeadServing",
    "TokenHead",
    "head_class",
    "serving_class",
]


def serving_class(cfg: ModelConfig) -> type[HeadServing]:
    """What serves ``cfg``'s head in ``Policy`` (its spec's ``serving``)."""
    return resolve(cfg.head_spec.serving)


def head_class(cfg: ModelConfig) -> type[ActionHead]:
    """The head class ``cfg`` asks for (``cfg.head``, with its add-ons)."""
    spec = cfg.head_spec
    if cfg.grounding.points:  # the config refuses grounding for a head whose spec has none
        assert spec.grounded is not None, cfg.head
        return resolve(spec.grounded)
    return resolve(spec.cls)
