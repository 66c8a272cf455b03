"""The batch format shared by data, model, training, evaluation and serving.

A batch is a plain ``dict[str, Tensor]`` (so DataLoader collation, ``torch.compile`` and
``torch.export`` all handle it) with these keys. B = batch, N = cameras, H = action horizon,
A = ``model.action_dim``, S = ``model.state_dim``, L = ``model.max_text_len``.

| key               | dtype            | shape            | meaning                                        |
|-------------------|------------------|------------------|------------------------------------------------|
| images            | uint8 or float32 | [B, N, 3, H, W]  | uint8 0..255, or float in [-1, 1]              |
| image_mask        | bool             | [B, N]           | True where the camera is present               |
| tokens            | int64            | [B, L]           | tokenized instruction, right-padded            |
| token_mask        | bool             | [B, L]           | True on real tokens                            |
| state             | float32          | [B, S]           | normalized proprio state, zero-padded to S     |
| actions           | float32          | [B, H, A]        | normalized action chunk (training only)        |
| action_is_pad     | bool             | [B, H]           | True on steps past the episode end (training)  |
| action_dim_mask   | bool             | [B, A]           | True on real (unpadded) action dims (training) |
| env_state         | float32          | [B, G]           | normalized grounding targets (training, only   |
|                   |                  |                  | with ``model.grounding``; G = 3 x points)      |
| env_uv            | float32          | [B, 2 x points]  | each point's (u, v) in the first camera, as    |
|                   |                  |                  | fractions of the image (training, only with    |
|                   |                  |                  | ``model.grounding.attend_weight`` > 0)         |

Images of a camera that is absent are zeros with ``image_mask`` False; padded text positions have
``token_mask`` False. Models must give the same outputs whatever the values at masked positions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vlastack.config import ModelConfig

OBS_KEYS = ("images", "image_mask", "tokens", "token_mask", "state")
TRAIN_KEYS = ("actions", "action_is_pad", "action_dim_mask")

Batch = dict[str, Tensor]


def expected_shapes(cfg: ModelConfig, batch_size: int) -> dict[str, tuple[int, ...]]:
    s = cfg.vision.image_size
    return {
        "images": (batch_size, cfg.num_cameras, 3, s, s),
        "image_mask": (batch_size, cfg.num_cameras),
        "tokens": (batch_size, cfg.max_text_len),
        "token_mask": (batch_size, cfg.max_text_len),
        "state": (batch_size, cfg.state_dim),
        "actions": (batch_size, cfg.action_horizon, cfg.action_dim),
        "action_is_pad": (batch_size, cfg.action_horizon),
        "action_dim_mask": (batch_size, cfg.action_dim),
        "env_state": (batch_size, cfg.grounding.dim),
        "env_uv": (batch_size, 2 * cfg.grounding.points),
    }


_DTYPES = {
    "images": (torch.uint8, torch.float32, torch.bfloat16, torch.float16),
    "image_mask": (torch.bool,),
    "tokens": (torch.int64, torch.int32),
    "token_mask": (torch.bool,),
    "state": (torch.float32, torch.bfloat16, torch.float16),
    "actions": (torch.float32, torch.bfloat16, torch.float16),
    "action_is_pad": (torch.bool,),
    "action_dim_mask": (torch.bool,),
    "env_state": (torch.float32, torch.bfloat16, torch.float16),
    "env_uv": (torch.float32,),
}


def validate_batch(batch: Batch, cfg: ModelConfig, train: bool = False) -> int:
    """Raise ``ValueError`` naming the key if ``batch`` does not fit ``cfg``; returns B."""
    if not isinstance(batch, dict):
        raise TypeError(f"batch must be a dict of tensors, got {type(batch).__name__}")
    keys = OBS_KEYS + (TRAIN_KEYS if train else ())
    if train and cfg.grounding.points:
        keys += ("env_state",) + (("env_uv",) if cfg.grounding.attend_weight else ())
    missing = [k for k in keys if k not in batch]
    if missing:
        raise ValueError(f"batch is missing keys {missing}; expected {list(keys)}")
    b = batch["images"].shape[0]
    shapes = expected_shapes(cfg, b)
    for k in keys:
        t = batch[k]
        if not isinstance(t, Tensor):
            raise TypeError(f"batch[{k!r}] must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shapes[k]:
            raise ValueError(
                f"batch[{k!r}] has shape {tuple(t.shape)}, expected {shapes[k]} for this model config"
            )
        if t.dtype not in _DTYPES[k]:
            raise ValueError(f"batch[{k!r}] has dtype {t.dtype}, expected one of {_DTYPES[k]}")
    return b


def to_device(batch: Batch, device: torch.device | str, non_blocking: bool = True) -> Batch:
    """Copy every tensor to ``device``; ``non_blocking`` overlaps copies from pinned memory."""
    return {
        k: v.to(device, non_blocking=non_blocking) if isinstance(v, Tensor) else v for k, v in batch.items()
    }


def dummy_batch(
    cfg: ModelConfig,
    batch_size: int = 2,
    train: bool = True,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> Batch:
    """A random but well-formed batch: uint8 images, some padded text, one missing camera."""
    g = torch.Generator().manual_seed(seed)
    sh = expected_shapes(cfg, batch_size)
    lengths = torch.randint(1, cfg.max_text_len + 1, (batch_size,), generator=g)
    token_mask = torch.arange(cfg.max_text_len)[None] < lengths[:, None]
    image_mask = torch.ones(sh["image_mask"], dtype=torch.bool)
    if cfg.num_cameras > 1:
        image_mask[0, -1] = False
    images = torch.randint(0, 256, sh["images"], generator=g, dtype=torch.uint8)
    images = images * image_mask[:, :, None, None, None].to(torch.uint8)
    vocab = max(2, min(cfg.vlm.vocab_size, 256))
    batch: Batch = {
        "images": images,
        "image_mask": image_mask,
        "tokens": torch.randint(1, vocab, sh["tokens"], generator=g) * token_mask,
        "token_mask": token_mask,
        "state": torch.randn(sh["state"], generator=g),
    }
    if train:
        horizon = cfg.action_horizon
        batch["actions"] = torch.randn(sh["actions"], generator=g)
        is_pad = torch.zeros(sh["action_is_pad"], dtype=torch.bool)
        is_pad[0, horizon - max(1, horizon // 4) :] = True
        batch["action_is_pad"] = is_pad
        dim_mask = torch.ones(sh["action_dim_mask"], dtype=torch.bool)
        dim_mask[:, max(1, cfg.action_dim - 2) :] = False
        batch["action_dim_mask"] = dim_mask
        if cfg.grounding.points:
            batch["env_state"] = torch.randn(sh["env_state"], generator=g)
            if cfg.grounding.attend_weight:
                batch["env_uv"] = torch.rand(sh["env_uv"], generator=g)
    return to_device(batch, device, non_blocking=False)
