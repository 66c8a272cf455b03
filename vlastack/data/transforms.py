"""Image transforms in plain torch, uint8 in and out, on any device (no torchvision).

All take images [..., 3, H, W] uint8 (leading dims are flattened into a batch) and an optional
``torch.Generator`` on the images' device for reproducible randomness. Each image in a batch gets
its own random crop / jitter. Arithmetic is float32 internally; results are rounded back to uint8.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _flat(images: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    if images.dim() < 3 or images.shape[-3] != 3:
        raise ValueError(f"images must be [..., 3, H, W], got {tuple(images.shape)}")
    lead = tuple(images.shape[:-3])
    return images.reshape(-1, *images.shape[-3:]), lead


def _to_uint8(x: Tensor) -> Tensor:
    return x.round_().clamp_(0, 255).to(torch.uint8)


def resize(images: Tensor, size: int | tuple[int, int]) -> Tensor:
    """Bilinear (antialiased when shrinking) resize to ``size`` = (H, W) or a square side."""
    h, w = (size, size) if isinstance(size, int) else size
    x, lead = _flat(images)
    if x.shape[-2:] == (h, w):
        return images
    out = F.interpolate(x.float(), size=(h, w), mode="bilinear", align_corners=False, antialias=True)
    return _to_uint8(out).reshape(*lead, 3, h, w)


def random_resized_crop(
    images: Tensor,
    scale: tuple[float, float] = (0.9, 1.0),
    size: int | tuple[int, int] | None = None,
    generator: torch.Generator | None = None,
    return_boxes: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Crop a random box covering ``scale`` of the area (same aspect ratio), resize to ``size``.

    One ``grid_sample`` call for the whole batch, so it is cheap on a GPU. ``return_boxes``: also
    return each image's box, fp32 [*lead, 3] = (side, cx, cy) in ``affine_grid``'s [-1, 1]
    coordinates, for ``crop_uv``.
    """
    x, lead = _flat(images)
    n, _, h, w = x.shape
    oh, ow = (h, w) if size is None else ((size, size) if isinstance(size, int) else size)
    dev = x.device
    area = torch.empty(n, device=dev).uniform_(scale[0], scale[1], generator=generator)
    side = area.sqrt()  # fraction of width and height kept
    cx = (torch.rand(n, device=dev, generator=generator) * 2 - 1) * (1 - side)
    cy = (torch.rand(n, device=dev, generator=generator) * 2 - 1) * (1 - side)
    theta = torch.zeros(n, 2, 3, device=dev)
    theta[:, 0, 0], theta[:, 1, 1], theta[:, 0, 2], theta[:, 1, 2] = side, side, cx, cy
    grid = F.affine_grid(theta, [n, 3, oh, ow], align_corners=False)
    out = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    out = _to_uint8(out).reshape(*lead, 3, oh, ow)
    if return_boxes:
        return out, torch.stack([side, cx, cy], -1).reshape(*lead, 3)
    return out


def crop_uv(uv: Tensor, boxes: Tensor) -> Tensor:
    """Points (u, v) as fractions of an image [B, 2 x points] -> where they land in its crop,
    boxes [B, 3] from ``random_resized_crop(..., return_boxes=True)``. The crop maps output x_o
    in [-1, 1] to input x_i = side * x_o + c, so u_o = ((2 u_i - 1 - c) / side + 1) / 2. A point
    the crop cuts off lands outside [0, 1] (the attention loss skips such points)."""
    pts = uv.float().reshape(uv.shape[0], -1, 2)
    side, centre = boxes[:, None, :1].float(), boxes[:, None, 1:].float()
    return (((2 * pts - 1 - centre) / side + 1) / 2).reshape(uv.shape).to(uv.dtype)


def resize_with_pad(images: Tensor, height: int, width: int) -> Tensor:
    """openpi/LeRobot ``resize_with_pad_torch`` for float images in [0, 1]: [B, 3, H, W] -> [B, 3,
    height, width], aspect ratio kept (bilinear, clamped), zero padding centred."""
    _, _, h, w = images.shape
    if (h, w) == (height, width):
        return images
    ratio = max(w / width, h / height)
    rh, rw = int(h / ratio), int(w / ratio)
    out = F.interpolate(images, size=(rh, rw), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    top, left = (height - rh) // 2, (width - rw) // 2
    return F.pad(out, (left, width - rw - left, top, height - rh - top), value=0.0)


def fit_image(images: Tensor, size: int, mode: str = "stretch") -> Tensor:
    """uint8 [..., 3, H, W] -> [..., 3, size, size] by ``model.image_resize``: ``stretch`` (``resize``)
    or ``pad`` (``resize_with_pad`` on [0, 1] floats, as openpi/LeRobot do, rounded back to uint8)."""
    if mode == "stretch":
        return resize(images, size)
    if mode != "pad":
        raise ValueError(f"image resize mode must be 'stretch' or 'pad', got {mode!r}")
    x, lead = _flat(images)
    if x.shape[-2:] == (size, size):
        return images
    out = resize_with_pad(x.float() / 255.0, size, size) * 255.0
    return _to_uint8(out).reshape(*lead, 3, size, size)


def color_jitter(images: Tensor, strength: float, generator: torch.Generator | None = None) -> Tensor:
    """Random brightness, contrast and saturation factors in [1 - strength, 1 + strength]."""
    if strength <= 0:
        return images
    x, lead = _flat(images)
    n = x.shape[0]
    x = x.float()

    def factor() -> Tensor:
        f = torch.empty(n, 1, 1, 1, device=x.device).uniform_(1 - strength, 1 + strength, generator=generator)
        return f

    x = x * factor()
    gray = (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]).clamp(0, 255)
    mean = gray.mean(dim=(-2, -1), keepdim=True)
    x = (x - mean) * factor() + mean
    gray = 0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]
    x = (x - gray) * factor() + gray
    return _to_uint8(x).reshape(*lead, *images.shape[-3:])


def augment(
    images: Tensor,
    crop_scale: float = 1.0,
    jitter: float = 0.0,
    generator: torch.Generator | None = None,
    uv: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The training augmentation of ``cfg.data``: random crop (area in [crop_scale, 1]) + jitter.

    ``uv`` [B, 2 x points]: points as fractions of the first camera's image (the attention
    supervision's targets, ``env_uv``); then returns (images, uv moved with that camera's crop),
    so the targets stay on the pixels they name."""
    boxes = None
    if crop_scale < 1.0:
        images, boxes = random_resized_crop(images, (crop_scale, 1.0), generator=generator, return_boxes=True)
    if jitter > 0:
        images = color_jitter(images, jitter, generator=generator)
    if uv is None:
        return images
    return images, (uv if boxes is None else crop_uv(uv, boxes[:, 0]))


def augment_batch(
    batch: dict[str, Tensor],
    crop_scale: float = 1.0,
    jitter: float = 0.0,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """``augment`` applied to a training batch: its images, and its attention targets (``env_uv``,
    moved with the first camera's crop) where it has them; absent cameras stay zero. The batch
    itself when there is nothing to do (crop_scale 1, no jitter)."""
    if crop_scale >= 1.0 and jitter <= 0:
        return batch
    out = dict(batch)
    if "env_uv" in batch:
        imgs, out["env_uv"] = augment(
            batch["images"], crop_scale, jitter, generator=generator, uv=batch["env_uv"]
        )
    else:
        imgs = augment(batch["images"], crop_scale, jitter, generator=generator)
    out["images"] = imgs * batch["image_mask"][:, :, None, None, None].to(imgs.dtype)
    return out
