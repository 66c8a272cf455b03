"""The action-head spec registry: one ``HeadSpec`` per ``model.head`` name (torchtitan's TrainSpec
is the model). Adding a head is its own file plus one entry here (docs/adding-a-head.md).

A spec names the head's classes as "module:Class" strings, so ``model.head`` is checked before any
model code (torch modules) is imported (``vlastack.models.heads`` resolves them), and says what the
head can do. Code outside the heads asks for a capability (``cfg.head_spec.denoise``), never for a
head by name: a head that lacks a capability gets a clear error or a one-line warning where it is
asked for, never a silent no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlastack.config.errors import _check


@dataclass(frozen=True)
class HeadSpec:
    """What ``model.head=<name>`` builds and what it can do."""

    cls: str  # "module:Class" of the head
    # Its class with the grounding add-on (``model.grounding.points > 0``); None: refuses grounding.
    grounded: str | None = None
    # ``model.variant`` values it takes ("pi05": state in the prompt, adaptive norms).
    variants: tuple[str, ...] = ("pi0",)
    # The decoder runs the action expert for it (suffix tokens, ``model.expert``, ``vla info``).
    uses_expert: bool = False
    # Its sampler draws random numbers: ``Policy`` hands it its seeded generator (``generator=``).
    seeded_sampling: bool = False
    # ``head.compile_decoding()`` compiles its per-step hot part (``Policy(compile=True)``).
    compile_decoding: bool = False
    # Denoising steps that can be guided by an action prefix (real-time chunking, its training).
    denoise: bool = False
    # ``Policy(fast=True)``: infer/fastpath.py's prepared weights and captured sampler.
    fast_path: bool = False
    # ``vla export-lerobot`` writes it as a LeRobot policy.
    export_lerobot: bool = False
    # Decodes discrete action tokens: ``model.tokens`` options, decoding options and counters,
    # an action tokenizer fitted before training (``vla plan`` fits it, too).
    action_tokens: bool = False
    # The ``model.*`` keys that are this head's own options. A checkpoint's config keeps only its
    # head's (no other head's options in it); missing ones load as their defaults.
    options: tuple[str, ...] = ()
    # A frozen dataclass of the head's own options, kept in ``model.head_options`` (checked in its
    # ``__post_init__``, like every config section); None: the head has none there.
    options_cls: Any = None


@dataclass(frozen=True)
class OFTOptions:
    """``model.head=oft`` (``models/heads/oft.py``): ``model.head_options.<key>``."""

    hidden: int = 256  # width of the MLP from each action query's hidden state to its action
    l1: bool = True  # L1 loss (OpenVLA-OFT's choice); False: MSE

    def __post_init__(self) -> None:
        _check(self.hidden > 0, "hidden", f"must be > 0, got {self.hidden}")


HEAD_SPECS: dict[str, HeadSpec] = {
    "flow": HeadSpec(
        cls="vlastack.models.heads.flow:FlowHead",
        grounded="vlastack.models.heads.grounding:GroundedFlowHead",
        variants=("pi0", "pi05"),
        uses_expert=True,
        compile_decoding=True,
        denoise=True,
        fast_path=True,
        export_lerobot=True,
        options=("variant", "num_denoise_steps", "noise_scale", "time_min_period", "time_max_period"),
    ),
    "tokens": HeadSpec(
        cls="vlastack.models.heads.tokens:TokenHead",
        grounded="vlastack.models.heads.grounded_tokens:GroundedTokenHead",
        seeded_sampling=True,
        compile_decoding=True,
        action_tokens=True,
        options=("tokens",),
    ),
    "oft": HeadSpec(cls="vlastack.models.heads.oft:OFTHead", options_cls=OFTOptions),
}
HEAD_NAMES = tuple(HEAD_SPECS)
