"""``vla export``: the full sampler as an artifact that runs without Python, plus a JSON sidecar.

The exported graph is ``ExportedSampler``: prefix pass + N Euler steps (or the token head's
decoding), with the state normalization and action unnormalization baked in, so callers feed env
units and get env units back. Noise is an explicit input, which makes every run deterministic.

| input      | dtype   | shape            | meaning                                             |
|------------|---------|------------------|-----------------------------------------------------|
| images     | uint8   | [B, N, 3, S, S]  | cameras in ``camera_names`` order, already resized  |
| image_mask | bool    | [B, N]           | False for an absent camera (its image is ignored)   |
| tokens     | int64   | [B, L]           | tokenized prompt (see the sidecar's ``tokenizer``)  |
| token_mask | bool    | [B, L]           | True on real tokens                                 |
| state      | float32 | [B, S_env]       | env units (normalized inside the graph)             |
| noise      | float32 | [B, H, A]        | standard normal (ignored by the token head)         |
| -> actions | float32 | [B, H, A_env]    | env units                                           |

Formats: ``pt2`` (``torch.export`` + AOTInductor package, loads from C++ via
``torch::inductor::AOTIModelPackageLoader``), ``onnx`` (dynamo exporter, runs in onnxruntime),
``torchscript`` (a trace of the exported graph, for older libtorch). Every export is compared with
eager PyTorch on random inputs and the result is stored in the sidecar.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlastack.config import to_dict
from vlastack.infer.policy import ACTION_KEY, STATE_KEY, Policy

FORMATS = {"pt2": "policy.pt2", "onnx": "policy.onnx", "torchscript": "policy.ts"}
INPUT_NAMES = ("images", "image_mask", "tokens", "token_mask", "state", "noise")
SIDE_CAR = "policy.json"
DEFAULT_TOL = 1e-4


class ExportedSampler(nn.Module):
    """Env-unit inputs (see the module table) -> actions float32 [B, H, A_env] in env units."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.model = policy.model
        self.normalizer = policy.normalizer
        self.pad_state = policy.cfg.state_dim - policy.state_dim
        self.action_dim = policy.action_dim

    def forward(
        self,
        images: Tensor,
        image_mask: Tensor,
        tokens: Tensor,
        token_mask: Tensor,
        state: Tensor,
        noise: Tensor,
    ) -> Tensor:
        state = F.pad(self.normalizer.normalize(STATE_KEY, state), (0, self.pad_state))
        batch = {
            "images": images,
            "image_mask": image_mask,
            "tokens": tokens,
            "token_mask": token_mask,
            "state": state,
        }
        out = self.model.sample_actions(batch, noise=noise)
        return self.normalizer.unnormalize(ACTION_KEY, out.float()[..., : self.action_dim])


def input_spec(policy: Policy, batch_size: int) -> dict[str, tuple[str, list[int]]]:
    c = policy.cfg
    s, n = c.vision.image_size, c.num_cameras
    return {
        "images": ("uint8", [batch_size, n, 3, s, s]),
        "image_mask": ("bool", [batch_size, n]),
        "tokens": ("int64", [batch_size, c.max_text_len]),
        "token_mask": ("bool", [batch_size, c.max_text_len]),
        "state": ("float32", [batch_size, policy.state_dim]),
        "noise": ("float32", [batch_size, c.action_horizon, c.action_dim]),
    }


def example_inputs(policy: Policy, batch_size: int = 1, seed: int = 0) -> tuple[Tensor, ...]:
    """Random well-formed inputs: real tokenized prompt, one camera masked when there are several."""
    g = torch.Generator().manual_seed(seed)
    spec = input_spec(policy, batch_size)
    images = torch.randint(0, 256, spec["images"][1], generator=g, dtype=torch.uint8)
    image_mask = torch.ones(spec["image_mask"][1], dtype=torch.bool)
    if image_mask.shape[1] > 1:
        image_mask[:, -1] = False
    ids, mask = policy.tokenizer.tokenize("pick up the red cube", policy.cfg.max_text_len)
    tokens = torch.from_numpy(ids)[None].repeat(batch_size, 1)
    token_mask = torch.from_numpy(mask)[None].repeat(batch_size, 1)
    state = torch.randn(spec["state"][1], generator=g)
    noise = torch.randn(spec["noise"][1], generator=g)
    return images, image_mask, tokens, token_mask, state, noise


def tokenizer_info(policy: Policy) -> dict[str, Any]:
    tok = policy.tokenizer
    info: dict[str, Any] = {
        "spec": policy.cfg.tokenizer,
        "max_len": policy.cfg.max_text_len,
        "pad_id": tok.pad_id,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "vocab_size": tok.vocab_size,
        "prompt_cleaning": "strip, '_' and newlines -> ' ', append '\\n'; BOS first; truncate, right-pad",
    }
    if policy.cfg.tokenizer == "byte":
        info["byte_offset"] = 4  # id = utf-8 byte + 4 (see vlastack/models/tokenizer.py)
    return info


def _run_artifact(fmt: str, path: Path, args: tuple[Tensor, ...]) -> np.ndarray:
    if fmt == "pt2":
        runner = torch._inductor.aoti_load_package(str(path))
        return runner(*args).numpy()
    if fmt == "torchscript":
        return torch.jit.load(str(path))(*args).numpy()
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    return sess.run(None, feeds)[0]


def export_policy(
    policy: Policy,
    fmt: str,
    out_dir: str | Path,
    batch_size: int = 1,
    tol: float = DEFAULT_TOL,
    seed: int = 0,
) -> dict[str, Any]:
    """Write ``out_dir/policy.<ext>`` + ``policy.json``; check against eager. -> the sidecar dict.

    Raises ``ValueError`` if the artifact's max abs difference from eager exceeds ``tol``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {sorted(FORMATS)}, got {fmt!r}")
    c = policy.cfg
    policy.model.head.check_exportable()
    if getattr(c.head_options, "step_noise", 0) > 0:  # the graph's only randomness is its noise input
        raise ValueError(
            f"the exported sampler takes its noise as an input and adds none per step; this policy "
            f"samples with head_options.step_noise={c.head_options.step_noise}: export it with step_noise=0"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / FORMATS[fmt]
    module = ExportedSampler(policy).eval()
    args = example_inputs(policy, batch_size, seed)
    t0 = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(module, args)
        if fmt == "pt2":
            torch._inductor.aoti_compile_and_package(ep, package_path=str(path))
        elif fmt == "torchscript":
            # Tracing the exported graph, not the eager model: it is already flat (no Python
            # control flow on shapes), so the trace cannot bake in a wrong branch.
            torch.jit.trace(ep.module(), args, check_trace=False).save(str(path))
        else:
            torch.onnx.export(
                ep,
                args,
                str(path),
                input_names=list(INPUT_NAMES),
                output_names=["actions"],
                dynamo=True,
                external_data=False,
                verbose=False,
            )
    export_s = time.perf_counter() - t0
    # Check on inputs the export never saw.
    check_args = example_inputs(policy, batch_size, seed + 1)
    with torch.no_grad():
        ref = module(*check_args).numpy()
        got = _run_artifact(fmt, path, check_args)
    diff = float(np.abs(got - ref).max())
    c = policy.cfg
    sidecar = {
        "format": fmt,
        "artifact": path.name,
        "batch_size": batch_size,
        "inputs": [
            {"name": k, "dtype": d, "shape": s} for k, (d, s) in input_spec(policy, batch_size).items()
        ],
        "outputs": [
            {
                "name": "actions",
                "dtype": "float32",
                "shape": [batch_size, c.action_horizon, policy.action_dim],
            }
        ],
        "normalization": {
            "baked_in": True,
            "note": "state input and actions output are env units; the stats below are already in the graph",
            **policy.normalizer.to_dict(),
        },
        "tokenizer": tokenizer_info(policy),
        "camera_names": list(c.camera_names),
        "image_size": c.vision.image_size,
        "image_preprocess": "uint8 RGB, resized to image_size (bilinear); the graph maps 0..255 to [-1, 1]",
        "head": c.head,
        "head_options": to_dict(c.head_options) if c.head_options is not None else {},
        "action_horizon": c.action_horizon,
        "state_dim": policy.state_dim,
        "action_dim": policy.action_dim,
        # What the actions mean (delta | absolute | unspecified): a runtime must execute them as such.
        "action_representation": policy.action_representation,
        "check": {"max_abs_diff": diff, "tolerance": tol, "passed": diff <= tol, "export_seconds": export_s},
        "torch_version": torch.__version__,
    }
    (out / SIDE_CAR).write_text(json.dumps(sidecar, indent=2))
    print(f"{fmt}: wrote {path} in {export_s:.1f}s; max |artifact - eager| = {diff:.3g} (tolerance {tol:g})")
    if diff > tol:
        raise ValueError(f"{fmt} export differs from eager by {diff:.3g} > tolerance {tol:g}")
    return sidecar


def write_raw_inputs(args: tuple[Tensor, ...], out_dir: str | Path) -> Path:
    """Inputs for the C++ example: ``inputs.bin`` (raw, concatenated) + ``inputs.txt``, one line per
    tensor: ``name dtype ndim d0 d1 ... byte_offset byte_count``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines, offset, blobs = [], 0, []
    for name, t in zip(INPUT_NAMES, args):
        raw = t.contiguous().numpy().tobytes()
        dtype = str(t.dtype).removeprefix("torch.")
        lines.append(" ".join([name, dtype, str(t.dim()), *map(str, t.shape), str(offset), str(len(raw))]))
        blobs.append(raw)
        offset += len(raw)
    (out / "inputs.bin").write_bytes(b"".join(blobs))
    (out / "inputs.txt").write_text("\n".join(lines) + "\n")
    return out / "inputs.txt"
