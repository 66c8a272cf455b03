"""Observation checking and batching: the one place that turns env observations into a model batch.

An observation is ``{"images": {cam: uint8 [H, W, 3] or [3, H, W]}, "state": float [S_env],
"prompt": str}``. openpi-style flat keys are accepted too: ``observation/state``,
``observation/<camera name>``, ``observation/image`` (the first camera) and
``observation/wrist_image`` (the first camera whose name contains "wrist", else LeRobot's
LIBERO ``image2``).

Every check raises ``ObsError`` (a ``ValueError``) naming the key, so the server can send the
reason back to the client. Limits are checked before anything is allocated.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import torch

from vlastack.batch import Batch
from vlastack.data.transforms import fit_image
from vlastack.models.prompt import tokenize_prompt

MAX_IMAGE_SIDE = 4096
MAX_PROMPT_CHARS = 4096


class ObsError(ValueError):
    """An observation does not match the policy's input spec."""


@dataclass(frozen=True)
class InputSpec:
    """What a policy accepts. ``state_dim`` is the env's (unpadded) state dim."""

    camera_names: tuple[str, ...]
    state_dim: int
    image_size: int
    prompt_required: bool = True
    default_prompt: str = ""
    max_image_side: int = MAX_IMAGE_SIDE
    max_prompt_chars: int = MAX_PROMPT_CHARS
    aliases: dict[str, str] = field(default_factory=dict)  # flat openpi key -> camera name
    image_resize: str = "stretch"  # model.image_resize: "stretch" or "pad" (aspect ratio kept)
    action_dim: int = 0  # the env's action dim and the chunk length, for ``action_prefix`` (0: none)
    action_horizon: int = 0

    @staticmethod
    def make(
        camera_names: tuple[str, ...],
        state_dim: int,
        image_size: int,
        default_prompt: str = "",
        image_resize: str = "stretch",
        action_dim: int = 0,
        action_horizon: int = 0,
    ) -> InputSpec:
        aliases = {f"observation/{c}": c for c in camera_names}
        aliases.setdefault("observation/image", camera_names[0])
        # LeRobot's LIBERO datasets and checkpoints call the wrist camera "image2": openpi's LIBERO
        # client (observation/wrist_image) must reach it too.
        wrist = [c for c in camera_names if "wrist" in c] or [c for c in camera_names if c == "image2"]
        if wrist:
            aliases.setdefault("observation/wrist_image", wrist[0])
        return InputSpec(
            tuple(camera_names), state_dim, image_size, not default_prompt, default_prompt,
            aliases=aliases, image_resize=image_resize, action_dim=action_dim,
            action_horizon=action_horizon,
        )  # fmt: skip


@dataclass
class Obs:
    """A checked observation: images HWC uint8 by camera name, state float32 [S_env], prompt."""

    images: dict[str, np.ndarray]
    state: np.ndarray
    prompt: str
    # Real-time chunking (infer/realtime.py): the previous chunk's actions from this request's step
    # on, float32 [n, A_env] in env units; how many of them execute before this chunk arrives
    # (None: unknown); and the method, "rtc_inference" (guided) or "rtc_training" (clean prefix).
    action_prefix: np.ndarray | None = None
    inference_delay: int | None = None
    rtc_method: str = "rtc_inference"
    # Whose query this is, for state a head keeps between queries (a token head's last valid chunk
    # under ``invalid_decode=repeat_last``): one episode or client, never read from the wire. 0: the
    # policy's own single caller; None: a query with no history (one HTTP request). Set by
    # ``Policy.infer_batch(streams=...)`` (episodes side by side) and the server (a connection).
    stream: Hashable | None = 0


IMAGE_TYPES = "uint8 (0..255) or float32 in [0, 1]"


def image_pixels(name: str, x: np.ndarray) -> np.ndarray:
    """The one pixel check of every path (Python API, websocket, HTTP): uint8 passes; floats in
    [0, 1] become uint8 (x 255, rounded); anything else (floats outside [0, 1], NaN, other
    integer types) is an ``ObsError`` naming the key, its dtype and its range. Never wraps."""
    if x.dtype == np.uint8:
        return x
    finite = x.dtype.kind != "f" or bool(np.isfinite(x).all())
    if x.dtype.kind == "f" and finite and (x.size == 0 or (x.min() >= 0 and x.max() <= 1)):
        return np.rint(x.astype(np.float32) * 255).astype(np.uint8)
    if not finite:
        values = "NaN/inf"
    elif x.size and x.dtype.kind in "fiub":
        values = f"[{x.min()}, {x.max()}]"
    else:
        values = "n/a"
    raise ObsError(f"image {name!r} must be {IMAGE_TYPES}, got dtype {x.dtype} with values {values}")


def _image(name: str, x: object, spec: InputSpec) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise ObsError(f"image {name!r} must be a {IMAGE_TYPES} array [H, W, 3], got {type(x).__name__}")
    if x.ndim != 3 or 3 not in (x.shape[0], x.shape[-1]):
        raise ObsError(f"image {name!r} must be [H, W, 3] or [3, H, W], got shape {list(x.shape)}")
    if x.shape[-1] != 3:  # CHW, as openpi's ALOHA client sends
        x = np.moveaxis(x, 0, -1)
    h, w = x.shape[:2]
    if not (1 <= h <= spec.max_image_side and 1 <= w <= spec.max_image_side):
        raise ObsError(f"image {name!r} is {h}x{w}; each side must be in [1, {spec.max_image_side}]")
    return image_pixels(name, x)


def check_obs(obs: object, spec: InputSpec) -> Obs:
    """Validate an observation dict against ``spec`` -> ``Obs``; raises ``ObsError``."""
    if not isinstance(obs, dict):
        raise ObsError(f"observation must be a dict, got {type(obs).__name__}")
    images: dict[str, np.ndarray] = {}
    state, prompt, rtc = None, None, {}
    for key, value in obs.items():
        if not isinstance(key, str):
            raise ObsError(f"observation keys must be strings, got {key!r:.80}")
        if key == "images":
            if not isinstance(value, dict):
                raise ObsError(f"'images' must be a dict camera name -> array, got {type(value).__name__}")
            for cam, img in value.items():
                if cam not in spec.camera_names:
                    raise ObsError(
                        f"unknown camera {cam!r:.80}; this policy's cameras: {list(spec.camera_names)}"
                    )
                images[cam] = _image(cam, img, spec)
        elif key in spec.aliases:
            cam = spec.aliases[key]
            images[cam] = _image(key, value, spec)
        elif key in ("state", "observation/state"):
            state = value
        elif key == "prompt":
            prompt = value
        elif key in RTC_KEYS:
            rtc[key] = value
        else:
            raise ObsError(
                f"unknown observation key {key!r:.80}; expected 'images', 'state', 'prompt', "
                f"one of {sorted(spec.aliases)} or (real-time chunking) {list(RTC_KEYS)}"
            )
    if not images:
        raise ObsError(f"observation has no image; give at least one of cameras {list(spec.camera_names)}")
    if not isinstance(state, np.ndarray) or state.dtype.kind != "f":
        got = type(state).__name__ if not isinstance(state, np.ndarray) else f"dtype {state.dtype}"
        raise ObsError(f"'state' must be a float array [{spec.state_dim}], got {got}")
    if state.shape != (spec.state_dim,):
        raise ObsError(f"'state' must have shape [{spec.state_dim}], got {list(state.shape)}")
    if not np.isfinite(state).all():
        raise ObsError("'state' contains NaN or inf")
    with np.errstate(over="ignore"):
        state32 = state.astype(np.float32)
    if not np.isfinite(state32).all():  # e.g. 1e300 as float64: inf once float32
        raise ObsError(f"'state' has values beyond float32's range (max |x| = {np.abs(state).max():.3g})")
    if prompt is None:
        if spec.prompt_required:
            raise ObsError("'prompt' is required (a string instruction)")
        prompt = spec.default_prompt
    if not isinstance(prompt, str):
        raise ObsError(f"'prompt' must be a string, got {type(prompt).__name__}")
    if len(prompt) > spec.max_prompt_chars:
        raise ObsError(f"'prompt' has {len(prompt)} characters; at most {spec.max_prompt_chars}")
    return Obs(images, state32, prompt, **_check_rtc(rtc, spec))


RTC_KEYS = ("action_prefix", "inference_delay", "rtc_method")


def _check_rtc(rtc: dict, spec: InputSpec) -> dict:
    """The real-time chunking keys of an observation -> ``Obs`` fields; raises ``ObsError``."""
    prefix, delay = rtc.get("action_prefix"), rtc.get("inference_delay")
    method = rtc.get("rtc_method", "rtc_inference")
    if method not in ("rtc_inference", "rtc_training", "bid"):
        raise ObsError(f"'rtc_method' must be 'rtc_inference', 'rtc_training' or 'bid', got {method!r:.80}")
    if prefix is None:
        if delay is not None:
            raise ObsError("'inference_delay' needs 'action_prefix' (the previous chunk's leftover actions)")
        return {}
    if not spec.action_dim:
        raise ObsError("this policy does not take 'action_prefix'")
    if not isinstance(prefix, np.ndarray) or prefix.dtype.kind != "f":
        raise ObsError(
            f"'action_prefix' must be a float array [n, {spec.action_dim}], got {type(prefix).__name__}"
        )
    if prefix.ndim != 2 or prefix.shape[1] != spec.action_dim or not 1 <= len(prefix) <= spec.action_horizon:
        raise ObsError(
            f"'action_prefix' must have shape [n, {spec.action_dim}] (the env's action dims, in its order) "
            f"with 1 <= n <= {spec.action_horizon}, got {list(prefix.shape)}"
        )
    if not np.isfinite(prefix).all():
        raise ObsError("'action_prefix' contains NaN or inf")
    if delay is not None and (
        isinstance(delay, bool) or not isinstance(delay, int | np.integer) or delay < 0
    ):
        raise ObsError(
            f"'inference_delay' must be an integer >= 0 (control steps) or absent, got {delay!r:.80}"
        )
    return {
        "action_prefix": prefix.astype(np.float32),
        "inference_delay": None if delay is None else int(delay),
        "rtc_method": method,
    }


def build_batch(
    obs_list: list[Obs],
    spec: InputSpec,
    model_state_dim: int,
    max_text_len: int,
    tokenizer,
    normalizer,
    state_in_prompt: bool = False,
    advantage: bool | None = None,
) -> Batch:
    """Checked observations -> model batch (see vlastack/batch.py) on the CPU.

    Images are resized to ``spec.image_size`` as in training (``spec.image_resize``); absent cameras are
    zeros with ``image_mask`` False; state is normalized and zero-padded to ``model_state_dim``.
    ``state_in_prompt`` (Pi0.5): the prompt is built from the instruction and the normalized state.
    ``advantage``: RECAP's indicator written after the instruction (``models/prompt.py``).
    """
    b, n, s = len(obs_list), len(spec.camera_names), spec.image_size
    images = torch.zeros(b, n, 3, s, s, dtype=torch.uint8)
    image_mask = torch.zeros(b, n, dtype=torch.bool)
    tokens = torch.zeros(b, max_text_len, dtype=torch.long)
    token_mask = torch.zeros(b, max_text_len, dtype=torch.bool)
    state = torch.zeros(b, model_state_dim, dtype=torch.float32)
    for i, o in enumerate(obs_list):
        for j, cam in enumerate(spec.camera_names):
            if cam in o.images:
                chw = torch.from_numpy(np.array(o.images[cam])).permute(
                    2, 0, 1
                )  # copy: wire arrays are read-only
                images[i, j] = fit_image(chw, s, spec.image_resize)
                image_mask[i, j] = True
        st = np.asarray(normalizer.normalize("observation.state", o.state), dtype=np.float32)
        ids, mask = tokenize_prompt(tokenizer, o.prompt, st, max_text_len, state_in_prompt, advantage)
        tokens[i], token_mask[i] = torch.from_numpy(ids), torch.from_numpy(mask)
        state[i, : st.shape[0]] = torch.from_numpy(st)
    return {
        "images": images,
        "image_mask": image_mask,
        "tokens": tokens,
        "token_mask": token_mask,
        "state": state,
    }
