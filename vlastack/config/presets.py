"""Presets as functions: ``tiny`` (trains on a CPU in minutes) to the exact public shapes."""

from __future__ import annotations

from dataclasses import replace

from vlastack.config.heads import FlowOptions
from vlastack.config.schema import (
    Config,
    DataConfig,
    DecoderConfig,
    EvalConfig,
    ModelConfig,
    NormConfig,
    TrainConfig,
    VisionConfig,
)


def tiny() -> Config:
    """Trains at several steps/s at batch 32 on a 2-core CPU. 64x64 images, patch 8."""
    d = DecoderConfig(width=128, depth=2, heads=4, kv_heads=1, head_dim=32, mlp_dim=384, vocab_size=260)
    return Config(
        model=ModelConfig(
            vision=VisionConfig(image_size=64, patch_size=8, width=128, depth=2, heads=4, mlp_dim=384),
            vlm=d,
            expert=replace(d, width=64, mlp_dim=192, vocab_size=1),
            action_horizon=16,
            action_dim=8,
            state_dim=8,
            camera_names=("scene", "wrist"),
            max_text_len=24,
        ),
        train=TrainConfig(steps=1500, batch_size=32, lr=1e-3, warmup_steps=50),
        eval=EvalConfig(steps_per_chunk=8, image_size=64),
    )


def small() -> Config:
    """About 100M parameters: a ViT-S/16-like encoder, a 12-layer 512-wide VLM, a 256-wide expert."""
    d = DecoderConfig(width=512, depth=12, heads=8, kv_heads=2, head_dim=64, mlp_dim=2048, vocab_size=32000)
    return Config(
        model=ModelConfig(
            vision=VisionConfig(image_size=224, patch_size=16, width=384, depth=12, heads=6, mlp_dim=1536),
            vlm=d,
            expert=replace(d, width=256, mlp_dim=1024, vocab_size=1),
            action_horizon=50,
            action_dim=32,
            state_dim=32,
            camera_names=("base_0_rgb", "left_wrist_0_rgb"),
            max_text_len=48,
        ),
        train=TrainConfig(batch_size=8, lr=1e-4),
        eval=EvalConfig(image_size=224),
    )


def pi0() -> Config:
    """The exact Pi0 shapes: SigLIP So400m/14 + Gemma-2B + a Gemma-300M-like action expert."""
    return Config(
        model=ModelConfig(),
        train=TrainConfig(batch_size=32, lr=2.5e-5, precision="bf16", activation_checkpointing=True),
        eval=EvalConfig(image_size=224),
    )


def pi05() -> Config:
    """The public Pi0.5 shapes (LeRobot/openpi ``pi05_base``): pi0's encoder, VLM and expert, with
    the state written into a 200-token prompt and the flow time in the expert's adaptive norms."""
    return Config(
        model=ModelConfig(head_options=FlowOptions(variant="pi05"), max_text_len=200),
        data=DataConfig(norm=NormConfig(state="quantiles", action="quantiles")),
        train=TrainConfig(batch_size=32, lr=2.5e-5, precision="bf16", activation_checkpointing=True),
        eval=EvalConfig(image_size=224),
    )


PRESETS = {"tiny": tiny, "small": small, "pi0": pi0, "pi05": pi05}

# A preset's model defaults for a variant chosen on top of it (``load_config`` applies them unless
# the YAML or an override sets the key). Pi0.5 writes the state into the prompt: the tiny preset's
# 24 tokens leave no room for it ("Task: ..., State: " plus up to 4 bytes per state dim), so its
# Pi0.5 gets 88 (the 8-dim state's 57 bytes and 30 of instruction).
VARIANT_DEFAULTS: dict[str, dict[str, dict[str, object]]] = {"tiny": {"pi05": {"max_text_len": 88}}}
