"""Discrete action tokenizers (RT-2/OpenVLA bins in ``base.py``, FAST in ``fast.py``) and the
factories that build or load one. See ``base.py`` for the shared interface.

The factories live here, not in ``base.py``, so that ``fast.py`` (a subclass of the base) and the
factories (which build both kinds) import without a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from vlastack.models.action_tokens.base import (
    CONFIG_FILE,
    PLACEMENTS,
    ActionTokenizer,
    BinTokenizer,
    TokenPlacement,
)
from vlastack.models.action_tokens.fast import FastTokenizer
from vlastack.models.action_tokens.pi_fast import PiFastTokenizer

__all__ = [
    "CONFIG_FILE",
    "PLACEMENTS",
    "ActionTokenizer",
    "BinTokenizer",
    "FastTokenizer",
    "PiFastTokenizer",
    "TokenPlacement",
    "load_action_tokenizer",
    "make_action_tokenizer",
]


def make_action_tokenizer(
    token_cfg, vocab_size: int, horizon: int, action_dim: int, special_ids: Iterable[int] = ()
) -> ActionTokenizer:
    """Build an (unfitted, for FAST) tokenizer from a ``TokenHeadConfig``.

    ``vocab_size``/``special_ids`` describe the LM text tokenizer (e.g. pad/bos/eos ids).
    """
    if token_cfg.tokenizer == "bins":
        placement = TokenPlacement(token_cfg.placement, token_cfg.num_bins, vocab_size, special_ids)
        return BinTokenizer(horizon, action_dim, placement, token_cfg.num_bins)
    if token_cfg.tokenizer == "fast":
        # Reserve the configured BPE size up front so the LM size is known before fitting.
        placement = TokenPlacement(token_cfg.placement, token_cfg.fast_vocab_size, vocab_size, special_ids)
        return FastTokenizer(horizon, action_dim, placement, scale=token_cfg.fast_scale)
    raise ValueError(f"unknown action tokenizer {token_cfg.tokenizer!r}; expected 'bins' or 'fast'")


def load_action_tokenizer(directory: str | Path) -> ActionTokenizer:
    """Inverse of ``ActionTokenizer.save``: the tokenizer kind the folder names."""
    return ActionTokenizer.load(directory)
