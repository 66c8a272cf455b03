"""Nested training state <-> (safetensors tensors + JSON skeleton), with no pickle.

``flatten(obj)`` walks dicts/lists/tuples; every tensor goes to a flat ``{key: tensor}`` map (for
safetensors) and is replaced in the skeleton by ``{"__tensor__": key}``. Dict keys keep their
type (optimizer states use int keys), tuples stay tuples. Only tensors, numbers, strings, bools
and None are accepted, so loading never constructs arbitrary objects.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from vlastack.fileio import BadFileError, load_safetensors, read_json


def flatten(obj: Any, tensors: dict[str, torch.Tensor] | None = None, prefix: str = "t") -> tuple[Any, dict]:
    """-> (JSON-able skeleton, {key: tensor})."""
    tensors = {} if tensors is None else tensors
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}.{len(tensors)}"
        t = obj.detach()
        if hasattr(t, "full_tensor"):  # DTensor
            t = t.full_tensor()
        tensors[key] = t.cpu().clone().contiguous()
        return {"__tensor__": key}, tensors
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, str | int):
                raise TypeError(f"state dict key {k!r} must be str or int")
            items.append([k, flatten(v, tensors, prefix)[0]])
        return {"__dict__": items}, tensors
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten(v, tensors, prefix)[0] for v in obj]}, tensors
    if isinstance(obj, list):
        return [flatten(v, tensors, prefix)[0] for v in obj], tensors
    if isinstance(obj, np.ndarray):
        return flatten(torch.from_numpy(obj.copy()), tensors, prefix)
    if isinstance(obj, np.generic):
        return obj.item(), tensors
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj, tensors
    raise TypeError(f"cannot store {type(obj).__name__} in training state (no pickle)")


def unflatten(skel: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(skel, dict):
        if "__tensor__" in skel:
            return tensors[skel["__tensor__"]]
        if "__dict__" in skel:
            return {k: unflatten(v, tensors) for k, v in skel["__dict__"]}
        if "__tuple__" in skel:
            return tuple(unflatten(v, tensors) for v in skel["__tuple__"])
        raise ValueError(f"malformed training state entry {list(skel)[:3]}")
    if isinstance(skel, list):
        return [unflatten(v, tensors) for v in skel]
    return skel


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_state(obj: Any, folder: str | Path, name: str) -> None:
    """Write ``<name>.safetensors`` + ``<name>.json`` under ``folder`` (fsynced)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    skel, tensors = flatten(obj)
    save_file(tensors, str(folder / f"{name}.safetensors"))
    fsync_file(folder / f"{name}.safetensors")
    _fsync_write(folder / f"{name}.json", json.dumps(skel).encode())


def load_state(folder: str | Path, name: str) -> Any:
    """Inverse of ``save_state``; a truncated or corrupt file raises ``BadFileError`` naming it."""
    folder = Path(folder)
    skel = read_json(folder / f"{name}.json")
    tensors = load_safetensors(folder / f"{name}.safetensors")
    try:
        return unflatten(skel, tensors)
    except (KeyError, TypeError, ValueError) as e:  # skeleton and tensors do not belong together
        raise BadFileError(folder / f"{name}.json", "does not match its .safetensors", repr(e)) from None


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str | Path) -> None:
    """fsync every file under ``folder`` and the folders themselves (so a rename is durable)."""
    folder = Path(folder)
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            fsync_file(p)
    for d in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        fsync_file(d)


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    _fsync_write(tmp, text.encode())
    os.replace(tmp, path)
    fsync_file(path.parent)


# ----------------------------------------------------------------------------- RNG


def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG the training step can touch: torch (CPU, CUDA), numpy, python, extra generators."""
    np_state = np.random.get_state()
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": np_state[1].astype(np.int64),
            "pos": np_state[2],
            "has_gauss": np_state[3],
            "gauss": np_state[4],
        },
        "python": random.getstate(),
        "generators": {k: g.get_state() for k, g in (generators or {}).items()},
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    for k, g in (generators or {}).items():
        if k in state["generators"]:
            g.set_state(state["generators"][k])
