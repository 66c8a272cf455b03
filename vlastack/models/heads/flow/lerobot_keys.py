"""The flow head's tensors in LeRobot/openpi ``pi0`` and ``pi05`` checkpoints (the backbone's are
``models/convert/lerobot.py``'s): which checkpoint key is which of our head's parameters, both
ways, and which variant a checkpoint is.

Keys here are canonical (``convert.lerobot.canonical_key``: no ``model.`` prefix, openpi's layout).
pi0 has ``state_proj`` and ``action_time_mlp_{in,out}``; pi05 has ``time_mlp_{in,out}`` (its flow
time feeds the expert's adaptive norms, which are backbone tensors) and no state projection.
"""

from __future__ import annotations

import re

_HEAD_MODULES = r"state_proj|action_in_proj|action_out_proj|action_time_mlp_in|action_time_mlp_out|time_mlp_in|time_mlp_out"

# Checkpoint key -> our key (``convert.lerobot`` appends these to the backbone's rules).
HEAD_RULES: list[tuple[str, str | None]] = [(rf"({_HEAD_MODULES})\.(.*)", r"head.\1.\2")]


def head_to_checkpoint(key: str) -> str | None:
    """Our ``head.*`` key -> the checkpoint's canonical key; None for a key that is not the head's."""
    m = re.fullmatch(rf"head\.({_HEAD_MODULES})\.(.*)", key)
    return f"{m[1]}.{m[2]}" if m else None


def checkpoint_kind(keys: set[str]) -> str:
    """``"pi05"`` (``time_mlp_in``, adaptive expert norms) or ``"pi0"`` (``state_proj``), from a
    checkpoint's canonical keys: the value of ``model.head_options.variant`` it needs."""
    if "time_mlp_in.weight" in keys:
        return "pi05"
    if "state_proj.weight" in keys:
        return "pi0"
    raise ValueError("checkpoint has neither state_proj (pi0) nor time_mlp_in (pi05) weights")
