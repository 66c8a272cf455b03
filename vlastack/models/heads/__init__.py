"""Action heads behind one interface (``base.ActionHead``), built by ``model.head`` from the spec
registry ``config.HEAD_SPECS`` (``config/heads.py``: each head's classes and capabilities).

- ``flow``: Pi0 / Pi0.5 flow matching with an action expert (``flow.py``);
- ``tokens``: discrete action tokens from the VLM's LM head: bins, FAST, parallel (``tokens.py``);
- ``oft``: OpenVLA-OFT-style parallel decoding of a whole chunk with L1 regression (``oft.py``);
- add-on: ``model.grounding.points > 0`` builds the spec's ``grounded`` class: ``GroundedFlowHead``
  (``grounding.py``) or ``GroundedTokenHead`` (``grounded_tokens.py``).

Adding a head: docs/adding-a-head.md. (Every registered head is listed above: a test checks it.)
"""

from __future__ import annotations

import importlib

from vlastack.config import HEAD_SPECS, ModelConfig
from vlastack.models.heads.base import ActionHead, ActionOutput, HeadBase
from vlastack.models.heads.flow import FlowHead
from vlastack.models.heads.grounded_tokens import GroundedTokenHead
from vlastack.models.heads.grounding import GroundedFlowHead
from vlastack.models.heads.tokens import TokenHead


def resolve(path: str) -> type[ActionHead]:
    """A spec's "module:Class" string -> the class."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# The registry lives in config.HEAD_SPECS (one entry per head); here its names become classes.
HEADS: dict[str, type[ActionHead]] = {name: resolve(spec.cls) for name, spec in HEAD_SPECS.items()}
GROUNDED: dict[str, type[ActionHead]] = {
    name: resolve(spec.grounded) for name, spec in HEAD_SPECS.items() if spec.grounded
}

__all__ = [
    "GROUNDED",
    "HEADS",
    "ActionHead",
    "ActionOutput",
    "FlowHead",
    "GroundedFlowHead",
    "GroundedTokenHead",
    "HeadBase",
    "TokenHead",
    "head_class",
]


def head_class(cfg: ModelConfig) -> type[ActionHead]:
    """The head class ``cfg`` asks for (``cfg.head``, with its add-ons)."""
    spec = cfg.head_spec
    if cfg.grounding.points:  # the config refuses grounding for a head whose spec has none
        assert spec.grounded is not None, cfg.head
        return resolve(spec.grounded)
    return resolve(spec.cls)
