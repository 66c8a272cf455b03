"""Action heads behind one interface (``base.ActionHead``), picked by ``model.head`` from ``HEADS``.

- ``flow``: Pi0 / Pi0.5 flow matching with an action expert (``flow.py``);
- ``tokens``: discrete action tokens from the VLM's LM head: bins, FAST, parallel (``tokens.py``);
- add-on: ``model.grounding.points > 0`` wraps the flow head in ``GroundedFlowHead`` (``grounding.py``)
  and the token head in ``GroundedTokenHead`` (``grounded_tokens.py``).

Adding a head: docs/adding-a-head.md.
"""

from __future__ import annotations

import importlib

from vlastack.config import HEAD_REGISTRY, ModelConfig
from vlastack.config.schema import GROUNDED_REGISTRY
from vlastack.models.heads.base import ActionHead, ActionOutput, HeadBase
from vlastack.models.heads.flow import FlowHead
from vlastack.models.heads.grounded_tokens import GroundedTokenHead
from vlastack.models.heads.grounding import GroundedFlowHead
from vlastack.models.heads.tokens import TokenHead


def _resolve(path: str) -> type[ActionHead]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# The registry lives in config.HEAD_REGISTRY (one line per head); here its names become classes.
HEADS: dict[str, type[ActionHead]] = {name: _resolve(path) for name, path in HEAD_REGISTRY.items()}
GROUNDED: dict[str, type[ActionHead]] = {name: _resolve(path) for name, path in GROUNDED_REGISTRY.items()}

__all__ = [
    "HEADS",
    "ActionHead",
    "ActionOutput",
    "FlowHead",
    "GroundedFlowHead",
    "GroundedTokenHead",
    "HeadBase",
    "TokenHead",
]


def head_class(cfg: ModelConfig) -> type[ActionHead]:
    """The head class ``cfg`` asks for (``cfg.head``, with its add-ons)."""
    if cfg.grounding.points:  # the config refuses grounding for a head not in GROUNDED
        return GROUNDED[cfg.head]
    return HEADS[cfg.head]
