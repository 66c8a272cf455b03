"""One typed config tree: frozen dataclasses, presets as functions, YAML, dotted overrides.

    cfg = load_config("tiny", yaml_path=None, overrides=["model.expert.depth=4"])
    save_yaml(cfg, "run/config.yaml"); cfg2 = load_yaml("run/config.yaml")

``schema.py`` holds the dataclasses, ``presets.py`` the presets, ``io.py`` YAML and overrides; this
module re-exports them. A new hyperparameter is one field in ``schema.py`` plus its one use site. Each dataclass checks its own
values in ``__post_init__`` with ``_check``; the tree builders re-raise with the dotted path so a
user always sees which key is wrong (``ValueError: model.expert.depth: ...``).
"""

from __future__ import annotations

from vlastack.config.errors import ConfigError
from vlastack.config.heads import HEAD_NAMES, HEAD_SPECS, FlowOptions, HeadSpec, OFTOptions, TokenHeadConfig
from vlastack.config.io import (
    apply_overrides,
    from_dict,
    load_config,
    load_yaml,
    model_config_from_dict,
    packaged_yaml,
    parse_override,
    save_yaml,
    to_dict,
)
from vlastack.config.presets import (
    PRESETS,
    pi0,
    pi05,
    small,
    tiny,
)
from vlastack.config.schema import (
    ACTION_REPRESENTATIONS,
    EXECUTION_METHODS,
    GUIDANCE_MODES,
    Config,
    DataConfig,
    DecoderConfig,
    EvalConfig,
    ExecutionConfig,
    GroundingConfig,
    ModelConfig,
    NormConfig,
    RLConfig,
    RTCTrainConfig,
    TrainConfig,
    VisionConfig,
)

__all__ = [
    "ACTION_REPRESENTATIONS",
    "EXECUTION_METHODS",
    "GUIDANCE_MODES",
    "HEAD_NAMES",
    "HEAD_SPECS",
    "PRESETS",
    "Config",
    "ConfigError",
    "DataConfig",
    "DecoderConfig",
    "EvalConfig",
    "ExecutionConfig",
    "FlowOptions",
    "GroundingConfig",
    "HeadSpec",
    "ModelConfig",
    "NormConfig",
    "OFTOptions",
    "RLConfig",
    "RTCTrainConfig",
    "TokenHeadConfig",
    "TrainConfig",
    "VisionConfig",
    "apply_overrides",
    "from_dict",
    "load_config",
    "load_yaml",
    "model_config_from_dict",
    "packaged_yaml",
    "parse_override",
    "pi0",
    "pi05",
    "save_yaml",
    "small",
    "tiny",
    "to_dict",
]
