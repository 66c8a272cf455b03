"""The config tree's dataclasses: one per section, each checking its own values with ``_check``
(see ``vlastack.config`` for the whole picture)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from vlastack.config.errors import _check, _positive
from vlastack.config.heads import HEAD_SPECS, FlowOptions, HeadSpec

# What an action means: "delta" moves the robot relative to where it is, "absolute" names where it
# should be (sim/env.py). Meta-World and LIBERO take deltas, as LeRobot's environments do.
ACTION_REPRESENTATIONS = ("delta", "absolute")

# ----------------------------------------------------------------------------- model


@dataclass(frozen=True)
class VisionConfig:
    """SigLIP-style ViT. Defaults are SigLIP So400m/14 at 224 px (256 patches)."""

    image_size: int = 224
    patch_size: int = 14
    width: int = 1152
    depth: int = 27
    heads: int = 16
    mlp_dim: int = 4304
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        _positive(self, "image_size", "patch_size", "width", "depth", "heads", "mlp_dim")
        _check(
            self.image_size % self.patch_size == 0,
            "image_size",
            f"{self.image_size} is not divisible by patch_size {self.patch_size}",
        )
        _check(self.width % self.heads == 0, "width", f"{self.width} not divisible by heads {self.heads}")

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class DecoderConfig:
    """Gemma-style decoder (RMSNorm(1+w), RoPE, GQA, GeGLU-tanh). Used for the VLM and the expert.

    Defaults are Gemma-2B. ``vocab_size`` is ignored for the action expert.
    """

    width: int = 2048
    depth: int = 18
    heads: int = 8
    kv_heads: int = 1
    head_dim: int = 256
    mlp_dim: int = 16384
    vocab_size: int = 257152
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        _positive(self, "width", "depth", "heads", "kv_heads", "head_dim", "mlp_dim", "vocab_size")
        _check(
            self.heads % self.kv_heads == 0,
            "kv_heads",
            f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})",
        )


@dataclass(frozen=True)
class GroundingConfig:
    """Object grounding for the flow head; off while ``points == 0`` (see models/grounding.py).

    A head on the VLM's prefix, queried by the instruction, regresses ``points`` privileged 3-D
    positions per frame (the dataset feature ``observation.environment_state``, normalized) from
    the images. Its prediction enters the action expert beside the state. Training feeds the
    recorded positions plus N(0, ``noise``^2) instead (teacher forcing) and adds ``weight`` x the
    head's MSE to the loss, and ``attend_weight`` x a loss on where its attention looks.
    """

    points: int = 0
    # The VLM layer whose output the head reads (negative: from the end). The demo measured the
    # last layer of 2 at 61% success, the first at 3%: binding a color word to a patch takes both.
    layer: int = -1
    key_dim: int = 64
    noise: float = 0.1  # in normalized units
    weight: float = 1.0
    # Per-sample probability of feeding the recorded positions in training; otherwise the head's
    # own prediction, as at inference (0.5 measured 28% against 61% for 1.0 in the demo).
    teacher_forcing: float = 1.0
    # Weight of a loss on the head's attention: where the first camera images each point
    # (observation.environment_uv.<camera>). It binds the instruction to the named object's
    # patches from the start instead of after a seed-dependent wait (see models/grounding.py).
    attend_weight: float = 0.0
    # Which dims of observation.environment_state are the points, x, y, z each (empty: all of it,
    # which then has 3 x points dims). Meta-World's 39-d state holds the object at 4:7 and the
    # goal at 36:39, so its recipes pick [4, 5, 6, 36, 37, 38].
    state_index: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check(self.points >= 0, "points", f"must be >= 0 (0 = off), got {self.points}")
        _check(
            not self.state_index or len(self.state_index) == 3 * self.points,
            "state_index",
            f"picks x, y, z of each of the {self.points} points: needs {3 * self.points} indices "
            f"(or none), got {len(self.state_index)}",
        )
        _check(
            all(isinstance(i, int) and i >= 0 for i in self.state_index),
            "state_index",
            f"must be indices >= 0 into observation.environment_state, got {list(self.state_index)}",
        )
        _positive(self, "key_dim")
        _check(self.noise >= 0, "noise", f"must be >= 0, got {self.noise}")
        _check(self.weight >= 0, "weight", f"must be >= 0, got {self.weight}")
        _check(self.attend_weight >= 0, "attend_weight", f"must be >= 0, got {self.attend_weight}")
        _check(
            self.points > 0 or not self.attend_weight,
            "attend_weight",
            "supervises the grounding head's attention: needs grounding.points > 0",
        )
        _check(
            0 <= self.teacher_forcing <= 1,
            "teacher_forcing",
            f"must be in [0, 1], got {self.teacher_forcing}",
        )

    @property
    def dim(self) -> int:
        return 3 * self.points


@dataclass(frozen=True)
class ModelConfig:
    vision: VisionConfig = field(default_factory=VisionConfig)
    vlm: DecoderConfig = field(default_factory=DecoderConfig)
    expert: DecoderConfig = field(
        default_factory=lambda: DecoderConfig(width=1024, depth=18, mlp_dim=4096, vocab_size=1)
    )
    head: str = "flow"  # a name in the head registry, config.HEAD_NAMES (config/heads.py)
    grounding: GroundingConfig = field(default_factory=GroundingConfig)
    action_horizon: int = 50
    action_dim: int = 32
    state_dim: int = 32
    camera_names: tuple[str, ...] = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
    # How a camera image becomes image_size x image_size, in training and serving alike: "stretch"
    # (bilinear to the square) or "pad" (openpi/LeRobot resize-with-pad: aspect ratio kept, black
    # borders), which imported Pi0/Pi0.5 checkpoints were pretrained with.
    image_resize: str = "stretch"
    max_text_len: int = 48
    # "byte": a file-free byte-level tokenizer; otherwise a folder with tokenizer.json/.model.
    tokenizer: str = "byte"
    # What the actions mean ("delta" | "absolute", ACTION_REPRESENTATIONS), carried to Policy, the
    # server's /metadata and exports so a chunk never runs in the wrong one. "auto": taken from the
    # training data's record (``vla data generate`` writes one); it stays "auto" = unspecified for
    # data that does not say and for checkpoints that never trained here (imports).
    action_representation: str = "auto"
    # The head's own options: its ``HeadSpec.options_cls`` (flow: FlowOptions, tokens:
    # TokenHeadConfig, oft: OFTOptions; ``model.head_options.<key>`` in YAML and overrides); None
    # for a head without any. Saved only with that head, so adding a head never changes another
    # head's checkpoints. (Configs written before this field: config.io.LEGACY_HEAD_KEYS.)
    head_options: Any = None
    # RECAP (pi*0.6; rl/recap.py, docs/rl.md): the prompt ends with an advantage indicator,
    # "Advantage: positive" or "negative". Training reads each frame's from the dataset's
    # ``advantage.positive`` column (``vla recap label`` writes it); Policy asks for "positive".
    # A Pi0 prompt keeps its first max_text_len - 21 byte tokens of the instruction: raise
    # max_text_len by 21 over the start's to keep all it read.
    advantage_conditioning: bool = False

    def __post_init__(self) -> None:
        _check(self.head in HEAD_SPECS, "head", f"must be one of {list(HEAD_SPECS)}, got {self.head!r}")
        spec = self.head_spec
        other = tuple(
            sp.options_cls for sp in HEAD_SPECS.values() if sp.options_cls not in (None, spec.options_cls)
        )
        if isinstance(self.head_options, other):
            # another head's options, carried over by ``replace(cfg, head=...)``: as an override
            # of ``model.head`` does (config/io.py), the new head starts from its own defaults
            object.__setattr__(self, "head_options", None)
        if spec.options_cls is None:
            _check(self.head_options is None, "head_options", f"head {self.head!r} takes no head_options")
        elif self.head_options is None:  # the head's defaults
            object.__setattr__(self, "head_options", spec.options_cls())
        else:
            _check(
                isinstance(self.head_options, spec.options_cls),
                "head_options",
                f"head {self.head!r} takes {spec.options_cls.__name__}, got {type(self.head_options).__name__}",
            )
        _positive(self, "action_horizon", "action_dim", "state_dim", "max_text_len")
        _check(
            self.action_representation in ("auto", *ACTION_REPRESENTATIONS),
            "action_representation",
            f"must be 'auto', 'delta' or 'absolute', got {self.action_representation!r}",
        )
        if self.state_in_prompt and self.tokenizer == "byte":
            # The Pi0.5 prompt (models/prompt.py) at its shortest: BOS, a 1-byte instruction, every
            # state dim a 1-digit bin. A prompt cut short loses the state, silently: refuse it here;
            # the dataset (every task, 3-digit bins) and each served request are checked exactly.
            least = 1 + len(f"Task: x, State: {' '.join(['0'] * self.state_dim)};\nAction: ")
            _check(
                self.max_text_len >= least,
                "max_text_len",
                f"{self.max_text_len} tokens cannot hold a Pi0.5 prompt (instruction and the "
                f"{self.state_dim}-dim state): it needs at least {least} plus the instruction; "
                f"set model.max_text_len to {least + 32} or more",
            )
        _check(len(self.camera_names) > 0, "camera_names", "needs at least one camera")
        _check(len(set(self.camera_names)) == len(self.camera_names), "camera_names", "names must be unique")
        _check(
            self.image_resize in ("stretch", "pad"),
            "image_resize",
            f"must be 'stretch' or 'pad', got {self.image_resize!r}",
        )
        e, v = self.expert, self.vlm
        for k in ("heads", "kv_heads", "head_dim", "depth"):
            _check(
                getattr(e, k) == getattr(v, k),
                f"expert.{k}",
                f"must equal vlm.{k} ({getattr(v, k)}) because the expert attends jointly with the "
                f"VLM layer by layer; got {getattr(e, k)}",
            )
        g = self.grounding
        _check(
            not (g.points and self.state_in_prompt),
            "grounding.points",
            "grounding feeds the state token, which the flow head's variant='pi05' does not have: set "
            "grounding.points=0",
        )
        if g.points:
            _check(
                spec.grounded is not None,
                "grounding.points",
                f"head {self.head!r} does not take the grounding add-on (heads that do: "
                f"{sorted(n for n, sp in HEAD_SPECS.items() if sp.grounded)}): set grounding.points=0",
            )
            _check(
                not g.attend_weight or self.image_resize == "stretch",
                "grounding.attend_weight",
                "the recorded image positions assume image_resize='stretch'",
            )
            _check(
                not spec.action_tokens or self.head_options.state_input == "continuous",
                "grounding.points",
                "grounding feeds the token head's continuous state token: needs "
                "head_options.state_input='continuous'",
            )
            _check(
                -v.depth <= g.layer < v.depth,
                "grounding.layer",
                f"must be in [-{v.depth}, {v.depth}) for vlm.depth {v.depth}, got {g.layer}",
            )

    def with_head_options(self, **changes: Any) -> ModelConfig:
        """This config with some of its head's options changed (``replace`` for ``head_options``)."""
        return replace(self, head_options=replace(self.head_options, **changes))

    @property
    def head_spec(self) -> HeadSpec:
        """What ``head`` builds and can do (``config/heads.py``)."""
        return HEAD_SPECS[self.head]

    @property
    def num_cameras(self) -> int:
        return len(self.camera_names)

    @property
    def adarms(self) -> bool:
        """The action expert's norms are adaptive, conditioned on the flow time (Pi0.5)."""
        return self._pi05

    @property
    def state_in_prompt(self) -> bool:
        """The state is discretised into the text prompt (Pi0.5), not fed as a suffix token."""
        return self._pi05

    @property
    def _pi05(self) -> bool:
        # The flow head's Pi0.5 variant (``model.head_options.variant``); every other head is
        # Pi0-style (a state token, plain norms). The backbone and the data pipeline ask the two
        # properties above, never for the variant.
        return isinstance(self.head_options, FlowOptions) and self.head_options.variant == "pi05"

    @property
    def grounding_layer(self) -> int:
        """``grounding.layer`` as an index in [0, vlm.depth)."""
        return self.grounding.layer % self.vlm.depth

    @property
    def prefix_len(self) -> int:
        """Image tokens + text tokens (the bidirectional prefix block)."""
        return self.num_cameras * self.vision.num_patches + self.max_text_len


# ----------------------------------------------------------------------------- data / train / eval


@dataclass(frozen=True)
class NormConfig:
    """Normalization mode per feature key: mean_std | min_max | quantiles (q01/q99 -> [-1, 1])."""

    state: str = "mean_std"
    action: str = "mean_std"
    env_state: str = "mean_std"  # observation.environment_state (model.grounding targets)

    def __post_init__(self) -> None:
        for k in ("state", "action", "env_state"):
            v = getattr(self, k)
            _check(v in ("mean_std", "min_max", "quantiles", "identity"), k, f"unknown mode {v!r}")


@dataclass(frozen=True)
class DataConfig:
    path: str = ""
    episodes: tuple[int, ...] = ()  # empty = all
    streaming: bool = False
    shuffle_buffer: int = 1000
    num_workers: int = 2
    prefetch_factor: int = 2
    pin_memory: bool = True
    persistent_workers: bool = True
    norm: NormConfig = field(default_factory=NormConfig)
    # Where the state/action statistics come from: "dataset" (computed from this dataset, with the
    # modes of data.norm) or "init_from" (kept from the train.init_from checkpoint, formulas included:
    # fine-tuning on data from the robot the checkpoint was trained for).
    norm_stats: str = "dataset"
    # Image augmentation (plain torch, on uint8).
    random_crop_scale: float = 1.0  # 1.0 = off; e.g. 0.9 keeps 90% of the area
    color_jitter: float = 0.0
    video_tolerance_s: float = 1e-4

    def __post_init__(self) -> None:
        _check(self.num_workers >= 0, "num_workers", f"must be >= 0, got {self.num_workers}")
        _positive(self, "shuffle_buffer", "prefetch_factor")
        _check(0 < self.random_crop_scale <= 1, "random_crop_scale", "must be in (0, 1]")
        _check(0 <= self.color_jitter < 1, "color_jitter", "must be in [0, 1)")
        _check(
            self.norm_stats in ("dataset", "init_from"),
            "norm_stats",
            f"must be 'dataset' or 'init_from', got {self.norm_stats!r}",
        )


@dataclass(frozen=True)
class RTCTrainConfig:
    """Training-time real-time chunking (arXiv 2512.05964; infer/realtime.py, docs/rtc.md).

    Each sample draws a delay d uniform in [0, ``max_delay``]: its first d actions are given clean
    (flow time 0, the committed prefix) and left out of the loss. 0 = off. Flow head, pi0 variant.
    """

    max_delay: int = 0

    def __post_init__(self) -> None:
        _check(self.max_delay >= 0, "max_delay", f"must be >= 0 (0 = off), got {self.max_delay}")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 3e-4
    lr_vision: float | None = None  # None = lr; 0 freezes the part
    lr_vlm: float | None = None
    lr_expert: float | None = None
    # The action head's own layers (head.*); None: lr_expert for a head that drives the action
    # expert (flow: they are its input and output layers), lr for one that does not (tokens).
    lr_head: float | None = None
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    precision: str = "fp32"  # fp32 | bf16 | fp16 | auto (measured at start: train/precision.py)
    optimizer: str = "adamw"  # adamw | adamw8bit
    ema_decay: float = 0.0  # 0 = off
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    activation_checkpointing: bool = False
    compile: bool = False
    # What train.compile compiles: "model" (forward and backward one graph each: most fusion) or
    # "blocks" (each transformer block apart; identical blocks share one graph, so the first step
    # compiles in half the time: 66 s against 134 s cold on a 2-core AVX2 EPYC, but the demo's
    # steps ran ~17% slower there in training). FSDP always compiles blocks.
    compile_scope: str = "model"
    parallel: str = "none"  # none | ddp | fsdp | hsdp (shard within a node, replicate across nodes)
    seed: int = 0
    log_every: int = 10
    save_every: int = 500
    keep_last: int = 3
    # "policy": each checkpoint is a policy folder (weights gathered to rank 0) plus the training
    # state. "sharded": torch.distributed.checkpoint shards, one file per rank, nothing gathered;
    # resumes on any world size; the policy folder is written at the end (train/sharded.py).
    # "auto": sharded under FSDP2/HSDP, policy otherwise.
    checkpoint_format: str = "auto"
    eval_every: int = 0  # 0 = off
    max_bad_steps: int = 5
    anomaly_guard: bool = False  # stop at the first non-finite step, naming the module and batch
    out_dir: str = "runs/train"
    preload: bool = False  # decode the whole dataset into memory once (small datasets)
    # keep the preloaded samples in <run>/preload/ (safetensors, memory-mapped back): a resumed run
    # skips the decoding (MT50: ~21 min on 2 cores); the file is named by what the samples depend on
    preload_cache: bool = False
    init_from: str = ""  # a model folder (save_pretrained) to start from, e.g. for LoRA
    num_threads: int = 0  # torch CPU threads; 0 = torch's default
    rtc: RTCTrainConfig = field(default_factory=RTCTrainConfig)

    def __post_init__(self) -> None:
        for part in ("lr_vision", "lr_vlm", "lr_expert", "lr_head"):
            v = getattr(self, part)
            _check(v is None or v >= 0, part, f"must be >= 0 (0 freezes the part) or unset, got {v}")
        _positive(self, "steps", "batch_size", "grad_accum", "log_every", "save_every", "keep_last")
        _check(self.max_bad_steps >= 1, "max_bad_steps", "must be >= 1")
        _check(self.num_threads >= 0, "num_threads", "must be >= 0 (0 = default)")
        _check(self.lr >= 0, "lr", "must be >= 0")
        _check(not self.preload_cache or self.preload, "preload_cache", "needs train.preload=true")
        _check(
            self.precision in ("fp32", "bf16", "fp16", "auto"),
            "precision",
            f"must be fp32|bf16|fp16|auto, got {self.precision!r}",
        )
        _check(self.optimizer in ("adamw", "adamw8bit"), "optimizer", f"unknown optimizer {self.optimizer!r}")
        _check(
            self.parallel in ("none", "ddp", "fsdp", "hsdp"),
            "parallel",
            f"must be none|ddp|fsdp|hsdp, got {self.parallel!r}",
        )
        _check(
            self.checkpoint_format in ("auto", "policy", "sharded"),
            "checkpoint_format",
            f"must be auto|policy|sharded, got {self.checkpoint_format!r}",
        )
        _check(
            self.compile_scope in ("model", "blocks"),
            "compile_scope",
            f"must be model|blocks, got {self.compile_scope!r}",
        )
        _check(0 <= self.ema_decay < 1, "ema_decay", "must be in [0, 1)")
        _check(self.lora_rank >= 0, "lora_rank", "must be >= 0")
        _check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        _check(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 = off)")


EXECUTION_METHODS = ("sync", "naive_async", "temporal_ensemble", "rtc_inference", "rtc_training", "bid")
GUIDANCE_MODES = ("vjp", "identity")  # ExecutionConfig.guidance


@dataclass(frozen=True)
class ExecutionConfig:
    """How chunks execute while the next one computes (infer/realtime.py, docs/rtc.md).

    ``delay``: inference delay d in control steps: simulated exactly in evaluation (d steps run
    from the old chunk while the new one is computed from the observation at request time); -1 =
    measured live (the runtime's robust estimate). ``horizon``: steps executed from each chunk
    before the next request (s; 0 = ``eval.steps_per_chunk``), raised to d when d is larger.
    """

    method: str = "sync"  # sync | naive_async | temporal_ensemble | rtc_inference | rtc_training | bid
    delay: int = 0
    horizon: int = 0
    guidance_max: float = 5.0  # rtc_inference: the guidance weight clip (beta)
    # rtc_inference: how the error toward the leftover enters each denoising step. "vjp": through
    # the vector-Jacobian product of the clean-chunk estimate (the paper's); "identity": the
    # weighted error itself, as LeRobot 0.6.1's RTCProcessor does (no backward pass: the cost of
    # plain sampling). docs/rtc.md measures both.
    guidance: str = "vjp"
    # bid: candidate chunks sampled per request; the one closest to the executing chunk's
    # leftover runs (bidirectional decoding's backward coherence, arXiv 2408.17355)
    bid_samples: int = 8
    # bid: the candidates' sampling temperature; a recipe that samples its mode (noise_scale 0,
    # e.g. the demo's) would give K identical candidates
    bid_noise_scale: float = 1.0
    # RTC methods: actions of the executing chunk sent as the prefix, at least d (0: all it has
    # left). Shorter: the soft-guided region ends sooner and the new chunk follows the new
    # observation more, at the cost of larger jumps after the committed part.
    overlap: int = 0
    # RTC methods: the policy is told at least this many committed actions even when the delay
    # is shorter (0 = the delay). At d = 0 a chunk then starts with the executing chunk's next
    # action and continues from it instead of starting afresh: a plan change never jumps at the
    # switch. Training-time RTC feeds them clean; inference-time RTC weights them fully.
    min_commit: int = 0
    delay_warmup: int = 2  # live delay: the first latencies (compile, caches) are not counted
    delay_quantile: float = 0.9  # live delay: this quantile of the recent latencies (in steps)

    def __post_init__(self) -> None:
        _check(
            self.method in EXECUTION_METHODS,
            "method",
            f"must be one of {' | '.join(EXECUTION_METHODS)}, got {self.method!r}",
        )
        _check(self.delay >= -1, "delay", f"must be >= 0 (steps) or -1 (measured live), got {self.delay}")
        _check(self.horizon >= 0, "horizon", f"must be >= 0 (0 = eval.steps_per_chunk), got {self.horizon}")
        _check(self.guidance_max > 0, "guidance_max", f"must be > 0, got {self.guidance_max}")
        _check(
            self.guidance in GUIDANCE_MODES,
            "guidance",
            f"must be one of {' | '.join(GUIDANCE_MODES)}, got {self.guidance!r}",
        )
        _check(self.bid_samples >= 1, "bid_samples", f"must be >= 1, got {self.bid_samples}")
        _check(self.bid_noise_scale > 0, "bid_noise_scale", f"must be > 0, got {self.bid_noise_scale}")
        _check(self.overlap >= 0, "overlap", f"must be >= 0 (0 = the whole leftover), got {self.overlap}")
        _check(self.min_commit >= 0, "min_commit", f"must be >= 0 (0 = the delay), got {self.min_commit}")
        _check(self.delay_warmup >= 0, "delay_warmup", f"must be >= 0, got {self.delay_warmup}")
        _check(0 < self.delay_quantile <= 1, "delay_quantile", "must be in (0, 1]")


@dataclass(frozen=True)
class EvalConfig:
    suite: str = "builtin"
    tasks: tuple[str, ...] = ()  # empty = every task of the suite
    episodes: int = 100
    seed: int = 1_000_000  # evaluation seeds start here: disjoint from data-generation seeds
    num_workers: int = 2
    steps_per_chunk: int = 8
    temporal_ensemble: float = 0.0  # 0 = off, else exponential weight
    image_size: int = 64  # rendered size; the policy resizes to its own input
    videos: int = 4
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    # "spread": ``episodes`` in all, episode i on task i % n with seed ``seed + i``. "per_task":
    # ``episodes`` of every task, episode j with seed ``seed + j`` (lerobot-eval's numbering).
    seed_scheme: str = "spread"
    render_quality: str = "lerobot"  # Meta-World's renderer: "lerobot" (exact) or "fast" (sim/metaworld.py)
    max_steps: int = (
        0  # episode limit; 0 = the task's own (builtin: per task; Meta-World 500, as lerobot-eval)
    )
    # What the env's actions mean: "auto" = the policy's model.action_representation (delta for
    # baselines and policies that do not say), or "delta" / "absolute" (builtin and dynamic suites).
    action_representation: str = "auto"
    # Episodes a worker runs side by side, their observations batched into one forward pass per
    # step (vlastack flow policies, synchronous execution; others run one at a time). 1 = one at
    # a time. 16 made the demo's evaluation ~3x faster on 2 cores (batch-1 inference is mostly
    # Python overhead); results differ from one at a time only by the batch's float rounding.
    batch_episodes: int = 1
    # "" = local worker processes (num_workers). Otherwise a Ray cluster to spread the episodes
    # over, one CPU each (sim/ray_pool.py): "auto" (the cluster this machine joined with `ray
    # start`), "HOST:PORT", "ray://HOST:10001", or "local" (a Ray instance started here). Needs Ray.
    ray_address: str = ""
    # LIBERO: the envs per task lerobot-eval would run (its eval.batch_size, N), whose reset
    # counts an episode's fixture placement depends on (sim/libero.py): episode j is then placed
    # as lerobot-eval's default async rollout with N envs places it. 1: lerobot-eval at batch 1.
    lerobot_batch_size: int = 1

    def __post_init__(self) -> None:
        _positive(self, "episodes", "steps_per_chunk", "image_size", "batch_episodes", "lerobot_batch_size")
        _check(self.num_workers >= 0, "num_workers", "must be >= 0")
        _check(self.max_steps >= 0, "max_steps", f"must be >= 0 (0 = the task's own), got {self.max_steps}")
        _check(
            self.seed_scheme in ("spread", "per_task"),
            "seed_scheme",
            f"must be 'spread' or 'per_task', got {self.seed_scheme!r}",
        )
        _check(
            self.render_quality in ("lerobot", "fast"),
            "render_quality",
            f"must be 'lerobot' or 'fast', got {self.render_quality!r}",
        )
        _check(
            self.action_representation in ("auto", *ACTION_REPRESENTATIONS),
            "action_representation",
            f"must be 'auto', 'delta' or 'absolute', got {self.action_representation!r}",
        )
        _check(
            self.execution.method != "temporal_ensemble" or self.temporal_ensemble > 0,
            "execution.method",
            "temporal_ensemble needs its weight: set eval.temporal_ensemble > 0 (e.g. 0.1)",
        )


@dataclass(frozen=True)
class RLConfig:
    """``vla rl``: on-policy fine-tuning of a trained policy in simulation (vlastack/rl/, docs/rl.md).

    GRPO as SimpleVLA-RL runs it: each iteration rolls out ``groups`` env seeds ``group_size``
    times each with the policy sampling its action tokens at ``temperature`` (a flow head: its
    denoising steps with ``flow_sigma`` noise, one "token" per step); an episode's reward is the
    task's success (0/1; ``progress_reward`` shapes failures); its advantage is the reward minus
    its group's mean over the group's std; groups whose episodes all agree carry no signal and are
    dropped; the update is
    ``epochs`` passes of the PPO-clip surrogate per token (clip-higher: ``clip_low``/``clip_high``),
    plus ``kl_coef`` x the k3 KL to the starting policy."""

    method: str = "grpo"
    iterations: int = 20
    groups: int = 8  # env seeds per iteration
    group_size: int = 8  # rollouts per seed (GRPO's group)
    # empty = eval.tasks (every task of eval.suite); they take turns over the groups, so a task
    # named twice ([push, push, stack]) gets twice the groups of the others
    tasks: tuple[str, ...] = ()
    env_seed: int = 3_000_000  # rollout seeds start here: disjoint from data (0..) and eval (1e6) seeds
    temperature: float = 1.0  # token heads: sampling temperature of the rollouts (evaluation stays greedy)
    # flow heads: std of the noise added at every denoising step, x sigma sqrt(|dt|) (Flow-Noise /
    # ReinFlow); evaluation keeps the deterministic sampler
    flow_sigma: float = 0.3
    # flow heads: the chunk's log-probability sums its first flow_logp_steps actions (0 = all H).
    # Set to eval.steps_per_chunk, the noise on actions the episode never runs is not credited
    # with the episode's reward (less variance, a small bias: that noise still reaches the run
    # actions through the later denoising steps' attention).
    flow_logp_steps: int = 0
    lr: float = 1.0e-5
    weight_decay: float = 0.0
    epochs: int = 1  # passes over an iteration's decisions
    minibatch: int = 256  # decisions per gradient step
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO's clip-higher: low-probability tokens may grow further
    kl_coef: float = 0.0  # SimpleVLA-RL runs without; > 0 keeps a frozen copy of the start
    # Reward shaping: a failed episode earns progress_reward x its progress (the share of its
    # distance to done it closed, the env's info["distance"]: sim's Task.distance, Meta-World's
    # obj_to_target), a success 1. 0 = the sparse success reward (SimpleVLA-RL's). Below 1, so any
    # success outranks any failure; > 0 makes all-failure groups informative.
    progress_reward: float = 0.0
    # Imitation anchor (rl/anchor.py): each gradient step adds imitation_coef x the policy's own
    # training loss on imitation_batch frames of imitation_data (demonstrations, LeRobot v3), so
    # the tasks the rollouts do not reward keep what they were taught. 0 = off.
    imitation_coef: float = 0.0
    imitation_data: str = ""
    imitation_batch: int = 32
    max_grad_norm: float = 1.0
    drop_uniform_groups: bool = True  # dynamic sampling: all-success / all-failure groups skipped
    seed: int = 0  # the sampling noise (per iteration: resumes draw the same tokens)
    num_threads: int = 0  # torch CPU threads; 0 = torch's default
    # Rollout envs: 0 = in this process; n = n worker processes stepping them at once (rl/envs.py),
    # or n Ray actors of one CPU each on the cluster at ray_address ("local", "auto", HOST:PORT).
    env_workers: int = 0
    ray_address: str = ""
    save_every: int = 1  # iterations between checkpoints
    keep_last: int = 2
    # Greedy evaluation every eval_every iterations (0 = off) on eval_episodes validation seeds
    # from eval_seed (spread over the tasks): the success curve; the test seeds stay for `vla eval`.
    eval_every: int = 0
    eval_episodes: int = 40
    eval_seed: int = 2_000_000

    def __post_init__(self) -> None:
        _check(self.method == "grpo", "method", f"must be 'grpo', got {self.method!r}")
        _check(self.flow_sigma > 0, "flow_sigma", f"must be > 0 (rollouts sample), got {self.flow_sigma}")
        _check(
            self.flow_logp_steps >= 0,
            "flow_logp_steps",
            f"must be >= 0 (0 = the whole chunk), got {self.flow_logp_steps}",
        )
        _positive(
            self, "iterations", "groups", "group_size", "epochs", "minibatch", "save_every", "keep_last"
        )
        _check(self.group_size >= 2, "group_size", "GRPO compares rollouts of one seed: needs >= 2")
        _check(self.temperature > 0, "temperature", f"must be > 0 (rollouts sample), got {self.temperature}")
        _check(self.lr >= 0 and self.weight_decay >= 0, "lr", "lr and weight_decay must be >= 0")
        _check(
            0 <= self.clip_low < 1 and self.clip_high >= 0,
            "clip_low",
            "need 0 <= clip_low < 1, clip_high >= 0",
        )
        _check(self.kl_coef >= 0, "kl_coef", f"must be >= 0, got {self.kl_coef}")
        _check(
            0 <= self.progress_reward < 1,
            "progress_reward",
            f"must be in [0, 1) (a failure's most, below a success's 1), got {self.progress_reward}",
        )
        _check(self.imitation_coef >= 0, "imitation_coef", f"must be >= 0, got {self.imitation_coef}")
        _check(
            not self.imitation_coef or bool(self.imitation_data),
            "imitation_data",
            "rl.imitation_coef > 0 needs the demonstrations to imitate: set rl.imitation_data=<dataset folder>",
        )
        _check(self.imitation_batch > 0, "imitation_batch", f"must be > 0, got {self.imitation_batch}")
        _check(self.max_grad_norm > 0, "max_grad_norm", f"must be > 0, got {self.max_grad_norm}")
        _check(self.num_threads >= 0, "num_threads", "must be >= 0 (0 = default)")
        _check(
            self.env_workers >= 0,
            "env_workers",
            f"must be >= 0 (0 = in this process), got {self.env_workers}",
        )
        _check(
            not self.ray_address or self.env_workers > 0,
            "ray_address",
            "runs the rollout envs as rl.env_workers Ray actors: set rl.env_workers > 0 too",
        )
        _check(self.eval_every >= 0, "eval_every", "must be >= 0 (0 = off)")
        _positive(self, "eval_episodes")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rl: RLConfig = field(default_factory=RLConfig)

    def __post_init__(self) -> None:
        _check(
            self.eval.steps_per_chunk <= self.model.action_horizon,
            "eval.steps_per_chunk",
            f"({self.eval.steps_per_chunk}) cannot exceed model.action_horizon ({self.model.action_horizon})",
        )
        _check(
            self.rl.flow_logp_steps <= self.model.action_horizon,
            "rl.flow_logp_steps",
            f"({self.rl.flow_logp_steps}) cannot exceed model.action_horizon ({self.model.action_horizon})",
        )
        _check(
            self.data.norm_stats == "dataset" or bool(self.train.init_from),
            "data.norm_stats",
            "'init_from' keeps the statistics of train.init_from's checkpoint: set train.init_from",
        )
        h = self.model.action_horizon
        _check(
            self.train.rtc.max_delay < h,
            "train.rtc.max_delay",
            f"({self.train.rtc.max_delay}) must be below model.action_horizon ({h})",
        )
        _check(
            not self.train.rtc.max_delay or (self.model.head_spec.denoise and not self.model.adarms),
            "train.rtc.max_delay",
            "training-time RTC gives each action token its own flow time: needs a head with denoising "
            f"steps ({[n for n, sp in HEAD_SPECS.items() if sp.denoise]}), variant=pi0 (pi05's adaptive norms take one time per sample)",
        )
