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

from vlastack.config.errors import _check, _positive


@dataclass(frozen=True)
class HeadSpec:
    """What ``model.head=<name>`` builds, and what config-time code must know before any model is
    built. What a head can do at run time (compile its decode step, serve fast, answer real-time
    chunking requests, take decoding options) is asked of the head itself: methods that refuse by
    default (``models/heads/base.py``, ``models/heads/serving.py``)."""

    cls: str  # "module:Class" of the head
    # Its class with the grounding add-on (``model.grounding.points > 0``); None: refuses grounding.
    grounded: str | None = None
    # The decoder runs the action expert for it (suffix tokens, ``model.expert``, ``vla info``).
    uses_expert: bool = False
    # Denoising steps that can be guided by an action prefix (real-time chunking, its training).
    denoise: bool = False
    # ``vla export-lerobot`` writes it as a LeRobot policy.
    export_lerobot: bool = False
    # Decodes discrete action tokens: an action tokenizer fitted before training (``vla plan``
    # fits it, too), decoding options.
    action_tokens: bool = False
    # "module:Class" of what serves it in ``Policy`` (models/heads/serving.py: plain sampling,
    # every optional capability refused, unless the head's folder has its own).
    serving: str = "vlastack.models.heads.serving:HeadServing"
    # A frozen dataclass of the head's own options, ``model.head_options`` (checked in its
    # ``__post_init__``, like every config section; a checkpoint's config keeps only its own
    # head's); None: the head has none. The one place a head's options live.
    options_cls: Any = None


@dataclass(frozen=True)
class FlowOptions:
    """``model.head=flow`` (``models/heads/flow/``): ``model.head_options.<key>``."""

    # "pi0": a state token in the suffix, the flow time mixed into the action tokens. "pi05": the
    # state written into the prompt as 256-bin tokens, no state token, and the flow time
    # conditioning the action expert's adaptive RMSNorms (models/heads/flow/head.py, docs/pi05.md).
    variant: str = "pi0"
    num_denoise_steps: int = 10  # Euler steps from noise (t=1) to actions (t=0)
    # Sampling temperature: the flow starts from noise_scale * N(0, I). 1 samples the learned
    # distribution; < 1 moves toward its mode, which helps small, under-trained policies.
    noise_scale: float = 1.0
    # Noise added at every Euler step, x sqrt(1/n): the stochastic sampler `vla rl` trains
    # (rl.flow_sigma, models/heads/flow/rl.py). 0 = the deterministic sampler (openpi's, LeRobot's).
    # A serving choice: `vla eval --decode step_noise=0.3`.
    step_noise: float = 0.0
    # Periods of the sinusoidal flow-time embedding (openpi's values).
    time_min_period: float = 4e-3
    time_max_period: float = 4.0

    def __post_init__(self) -> None:
        _check(self.variant in ("pi0", "pi05"), "variant", f"must be 'pi0' or 'pi05', got {self.variant!r}")
        _positive(self, "num_denoise_steps")
        _check(self.noise_scale >= 0, "noise_scale", f"must be >= 0, got {self.noise_scale}")
        _check(self.step_noise >= 0, "step_noise", f"must be >= 0 (0 = deterministic), got {self.step_noise}")
        _check(self.time_min_period > 0, "time_min_period", "must be > 0")
        _check(self.time_max_period > self.time_min_period, "time_max_period", "must exceed time_min_period")


@dataclass(frozen=True)
class TokenHeadConfig:
    """Discrete action tokens (RT-2/OpenVLA bins, FAST). The options of ``model.head=tokens``.

    Tokenizers need actions in [-1, 1]: train token heads with ``data.norm.action=quantiles``.
    ``decoding='parallel'`` (OpenVLA-OFT) needs the fixed-length ``tokenizer='bins'``.
    """

    tokenizer: str = "bins"  # bins | fast
    num_bins: int = 256
    placement: str = "overwrite_last"  # overwrite_last | skip_special | new_rows
    fast_scale: float = 10.0
    fast_vocab_size: int = 1024
    max_action_tokens: int = 64
    decoding: str = "autoregressive"  # autoregressive | parallel
    temperature: float = 0.0
    regression_head: bool = False  # OFT-style L1 head for parallel decoding
    # The state enters the prompt as one continuous token (a Linear into the VLM width) or, as in
    # pi05, as one discrete token per dim (``state_bins`` uniform bins over [-1, 1]).
    state_input: str = "continuous"  # continuous | discrete
    state_bins: int = 256
    # Decoding options (docs/model.md, "Token head"). Sampling at temperature > 0 is seeded by
    # Policy(seed=...); top_p < 1 samples from the smallest set of ids holding top_p of the mass.
    top_p: float = 1.0
    # Hard cap on generated tokens (0: what the tokenizer needs: H*A bins, max_action_tokens + 1).
    max_decode_steps: int = 0
    # A chunk whose tokens do not decode (e.g. a FAST sequence cut by the cap): "zero" returns
    # zeros, "repeat_last" has Policy repeat its last valid chunk; both flag it (valid=False) and
    # Policy.decode_stats counts it.
    invalid_decode: str = "zero"  # zero | repeat_last
    # Decode among the action ids (+ end) only; False: the whole vocabulary, as LeRobot's pi0-FAST.
    constrained: bool = True
    # FAST, with constrained: also only ids whose BPE pieces keep the DCT coefficients written
    # <= H*A, and the end id exactly at H*A, so every finished sequence decodes to a full chunk.
    # False: any action id at any point (a sequence may expand to the wrong count: invalid).
    exact_length: bool = True
    # "pi0_fast": the LeRobot/openpi pi0-FAST layout (state in the prompt text, "<bos>" closes the
    # prompt block, the model writes "Action: " + FAST ids + "|"); set by `vla import`.
    sequence: str = "vlastack"  # vlastack | pi0_fast
    # Training targets. bin_sigma (bins): a Gaussian over neighbouring bins (std in bins) instead
    # of one-hot; label_smoothing: uniform smoothing; l1_weight: the L1 head's loss weight;
    # first_step_weight (bins): the loss weight of the chunk's first step, the one a policy that
    # re-plans every step executes, against 1 for every later step.
    bin_sigma: float = 0.0
    label_smoothing: float = 0.0
    l1_weight: float = 1.0
    first_step_weight: float = 1.0

    def __post_init__(self) -> None:
        _check(
            self.state_input in ("continuous", "discrete"),
            "state_input",
            f"must be 'continuous' or 'discrete', got {self.state_input!r}",
        )
        _check(self.state_bins >= 2, "state_bins", f"must be >= 2, got {self.state_bins}")
        _check(self.bin_sigma >= 0, "bin_sigma", f"must be >= 0, got {self.bin_sigma}")
        _check(
            0 <= self.label_smoothing < 1, "label_smoothing", f"must be in [0, 1), got {self.label_smoothing}"
        )
        _check(self.l1_weight >= 0, "l1_weight", f"must be >= 0, got {self.l1_weight}")
        _check(self.first_step_weight > 0, "first_step_weight", f"must be > 0, got {self.first_step_weight}")
        _check(
            self.first_step_weight == 1.0 or self.tokenizer == "bins",
            "first_step_weight",
            "applies to bins only (a FAST token mixes every step of the chunk); leave it at 1.0",
        )
        _check(
            self.tokenizer in ("bins", "fast"),
            "tokenizer",
            f"must be 'bins' or 'fast', got {self.tokenizer!r}",
        )
        _check(
            self.placement in ("overwrite_last", "skip_special", "new_rows"),
            "placement",
            f"must be overwrite_last | skip_special | new_rows, got {self.placement!r}",
        )
        _check(
            self.decoding in ("autoregressive", "parallel"),
            "decoding",
            f"must be 'autoregressive' or 'parallel', got {self.decoding!r}",
        )
        _positive(self, "num_bins", "fast_scale", "fast_vocab_size", "max_action_tokens")
        _check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        _check(
            self.decoding != "parallel" or self.tokenizer == "bins",
            "decoding",
            "parallel decoding predicts a fixed number of tokens: it needs tokenizer='bins', not 'fast'",
        )
        _check(
            not self.regression_head or self.decoding == "parallel",
            "regression_head",
            "the L1 regression head reads the parallel action positions: set decoding='parallel'",
        )
        _check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(
            self.max_decode_steps >= 0,
            "max_decode_steps",
            f"must be >= 0 (0 = off), got {self.max_decode_steps}",
        )
        _check(
            self.invalid_decode in ("zero", "repeat_last"),
            "invalid_decode",
            f"must be 'zero' or 'repeat_last', got {self.invalid_decode!r}",
        )
        _check(
            self.sequence in ("vlastack", "pi0_fast"),
            "sequence",
            f"must be 'vlastack' or 'pi0_fast', got {self.sequence!r}",
        )
        _check(
            self.sequence == "vlastack" or (self.tokenizer == "fast" and self.decoding == "autoregressive"),
            "sequence",
            "the pi0_fast layout is autoregressive FAST: needs tokenizer='fast', decoding='autoregressive'",
        )


@dataclass(frozen=True)
class OFTOptions:
    """``model.head=oft`` (``models/heads/oft/``): ``model.head_options.<key>``."""

    hidden: int = 256  # width of the MLP from each action query's hidden state to its action
    l1: bool = True  # L1 loss (OpenVLA-OFT's choice); False: MSE

    def __post_init__(self) -> None:
        _check(self.hidden > 0, "hidden", f"must be > 0, got {self.hidden}")


HEAD_SPECS: dict[str, HeadSpec] = {
    "flow": HeadSpec(
        cls="vlastack.models.heads.flow:FlowHead",
        grounded="vlastack.models.heads.flow:GroundedFlowHead",
        uses_expert=True,
        denoise=True,
        export_lerobot=True,
        serving="vlastack.models.heads.flow.serving:FlowServing",
        options_cls=FlowOptions,
    ),
    "tokens": HeadSpec(
        cls="vlastack.models.heads.tokens:TokenHead",
        grounded="vlastack.models.heads.tokens:GroundedTokenHead",
        action_tokens=True,
        serving="vlastack.models.heads.tokens.serving:TokenServing",
        options_cls=TokenHeadConfig,
    ),
    "oft": HeadSpec(
        cls="vlastack.models.heads.oft:OFTHead",
        grounded="vlastack.models.heads.oft:GroundedOFTHead",
        options_cls=OFTOptions,
    ),
}
HEAD_NAMES = tuple(HEAD_SPECS)
