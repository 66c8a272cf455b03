"""Lean safetensors reading: the header alone (names, dtypes, shapes) and one tensor at a time.

``read_tensor`` reads the bytes with ``readinto`` straight into the tensor that the model keeps, so
loading a checkpoint costs one copy of the weights in memory. Reading through a memory map
(``safe_open``) would also leave every touched page of the file mapped into the process until the
handle closes: peak RSS near twice the weights for a 3B model.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from vlastack.fileio import read_json, safetensors_header

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


def read_header(file: str | Path) -> dict[str, TensorInfo]:
    """One ``.safetensors`` file's table of contents: name -> ``TensorInfo`` (no tensor data read;
    every entry checked against the file first: ``fileio.safetensors_header``)."""
    file = Path(file)
    if not file.is_file():
        raise ValueError(f"missing weights file {file}")
    start, header = safetensors_header(file)
    out = {}
    for name, meta in header.items():
        if meta["dtype"] not in DTYPES:
            raise ValueError(f"{file}: tensor {name!r} has unsupported dtype {meta['dtype']}")
        a, b = meta["data_offsets"]
        out[name] = TensorInfo(file, DTYPES[meta["dtype"]], tuple(meta["shape"]), start + a, b - a)
    return out


def read_folder_header(folder: str | Path) -> dict[str, TensorInfo]:
    """``model.safetensors`` or the shards named by ``model.safetensors.index.json``."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(read_json(index)["weight_map"].values()))
    elif (folder / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"{folder}: missing model.safetensors (or model.safetensors.index.json)")
    out: dict[str, TensorInfo] = {}
    for name in files:
        out.update(read_header(folder / name))
    return out


def read_tensor(info: TensorInfo, dtype: torch.dtype | None = None, fd: int | None = None) -> torch.Tensor:
    """The tensor's bytes read straight into a fresh CPU tensor (then cast to ``dtype`` if given).
    ``fd``: the file already open (``open_weights``); positional reads, so threads can share it."""
    buf = torch.empty(info.nbytes, dtype=torch.uint8)
    view = memoryview(buf.numpy())
    if fd is None:
        with open(info.file, "rb") as f:
            f.seek(info.start)
            got = f.readinto(view)
    else:
        got = 0
        while got < info.nbytes:  # a pread may return less than asked
            n = os.preadv(fd, [view[got:]], info.start + got)
            if n == 0:
                break
            got += n
    if got != info.nbytes:
        raise ValueError(
            f"{info.file}: truncated file (wanted {info.nbytes} bytes at {info.start}, got {got})"
        )
    t = buf.view(info.dtype).reshape(info.shape)
    return t if dtype is None or dtype == t.dtype else t.to(dtype)


@contextlib.contextmanager
def open_weights(infos: Iterable[TensorInfo]) -> Iterator[dict[Path, int | None]]:
    """Each weights file of ``infos`` opened once for the whole read (file -> descriptor for
    ``read_tensor``); None where positional reads are not available (then one open per tensor)."""
    files = sorted({i.file for i in infos})
    fds: dict[Path, int | None] = {}
    try:
        for f in files:
            fds[f] = os.open(f, os.O_RDONLY) if hasattr(os, "preadv") else None
        yield fds
    finally:
        for fd in fds.values():
            if fd is not None:
                os.close(fd)
