"""Reading the files a user hands us, with errors that name the file.

A truncated ``model.safetensors`` or a hand-edited ``config.json`` raises, from the libraries,
``SafetensorError: HeaderTooLarge`` or ``Expecting ',' delimiter: line 3 column 5 (char 41)``: true,
but the user cannot tell which of a dozen files is broken. These helpers raise ``BadFileError``
(a ``ValueError``, so ``vla`` prints it as one line) whose message starts with the path. A missing
file stays ``FileNotFoundError`` (which names the path already).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any


class BadFileError(ValueError):
    """A file exists but cannot be parsed: truncated, corrupt, or not the format its name says."""

    def __init__(self, path: str | Path, what: str, detail: str) -> None:
        self.path, self.what, self.detail = Path(path), what, detail
        super().__init__(f"{path}: {what} ({detail})"[:600])

    def __reduce__(self) -> tuple:  # picklable: evaluation workers send their errors back
        return (type(self), (str(self.path), self.what, self.detail))


def read_json(path: str | Path) -> Any:
    """``json.loads`` of a UTF-8 file; ``BadFileError`` naming the file if it does not parse."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise BadFileError(path, "is not valid JSON (not UTF-8 text)", str(e)[:120]) from None
    except json.JSONDecodeError as e:
        raise BadFileError(path, f"is not valid JSON at line {e.lineno} column {e.colno}", e.msg) from None


def read_yaml(path: str | Path) -> Any:
    """``yaml.safe_load`` of a file; ``BadFileError`` naming the file and line if it does not parse."""
    import yaml

    path = Path(path)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise BadFileError(path, "is not valid YAML (not UTF-8 text)", str(e)[:120]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise BadFileError(path, f"is not valid YAML{where}", str(problem)) from None


def _safetensors_error(path: Path, e: Exception) -> BadFileError:
    return BadFileError(
        path, "is not a valid safetensors file (truncated or corrupt?)", f"{type(e).__name__}: {e}"[:200]
    )


# safetensors dtype -> bytes per element (the format's own list).
ITEM_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
             "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}  # fmt: skip
MAX_HEADER = 100 * 2**20


def safetensors_header(path: str | Path) -> tuple[int, dict[str, dict]]:
    """Read and check a ``.safetensors`` header before anything is allocated for its tensors:
    -> (data start offset, {name: {"dtype", "shape", "data_offsets"}}) without ``__metadata__``.

    A hostile or corrupt header must not make a reader allocate what it claims: every entry needs
    a known dtype, a shape of non-negative integers, offsets inside the file, a byte length equal
    to the shape's element count times the item size, and no overlap with another entry.
    ``BadFileError`` names the file and the tensor."""
    import struct

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise BadFileError(path, "is not a safetensors file", "shorter than 8 bytes")
        (n,) = struct.unpack("<Q", raw)
        if n > min(MAX_HEADER, size - 8):
            raise BadFileError(path, "is not a valid safetensors file (truncated or corrupt?)",
                               f"header of {n} bytes in a file of {size}")  # fmt: skip
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadFileError(
                path, "is not a valid safetensors file (corrupt header)", str(e)[:200]
            ) from None
    if not isinstance(header, dict):
        raise BadFileError(path, "is not a valid safetensors file", "its header is not a JSON object")
    data_len = size - 8 - n
    entries, spans = {}, []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        bad = _header_entry_problem(meta, data_len)
        if bad:
            raise BadFileError(path, f"has a corrupt entry for tensor {name!r}", bad)
        entries[name] = meta
        spans.append((*meta["data_offsets"], name))
    spans.sort()
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise BadFileError(path, f"has overlapping tensors {a!r} and {b!r}", f"bytes {start}..{end}")
    return 8 + n, entries


def _header_entry_problem(meta: object, data_len: int) -> str:
    if not isinstance(meta, dict) or not {"dtype", "shape", "data_offsets"} <= set(meta):
        return "an entry needs dtype, shape and data_offsets"
    dtype, shape, offs = meta["dtype"], meta["shape"], meta["data_offsets"]
    if dtype not in ITEM_SIZE:
        return f"unknown dtype {dtype!r}"
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return f"bad shape {shape!r}"
    if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
        return f"bad data_offsets {offs!r}"
    a, b = offs
    if not 0 <= a <= b <= data_len:
        return f"data_offsets [{a}, {b}] outside the file's {data_len} data bytes"
    count = 1
    for d in shape:
        count *= d
    if count * ITEM_SIZE[dtype] != b - a:
        return (
            f"shape {shape} x {dtype} is {count * ITEM_SIZE[dtype]} bytes but its data_offsets span {b - a}"
        )
    return ""


def load_safetensors(path: str | Path, device: str = "cpu") -> dict:
    """``safetensors.torch.load_file`` with a ``BadFileError`` naming a truncated or garbage file
    (the header is checked first: ``safetensors_header``)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    safetensors_header(path)
    try:
        return load_file(str(path), device=device)
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:  # torch raises on bad offsets
        raise _safetensors_error(path, e) from None


def open_safetensors(path: str | Path) -> Any:
    """``safetensors.safe_open(path, framework="pt")``, failing with a ``BadFileError`` naming the file.

    Only the header is read here; a file cut short past its header fails on ``get_tensor`` (wrap
    those reads with ``safetensors_read_error``)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    safetensors_header(path)
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise _safetensors_error(path, e) from None


def safetensors_read_error(path: str | Path, e: Exception) -> BadFileError:
    """The ``BadFileError`` for a tensor read that failed in ``path`` (``raise ... from None``)."""
    return _safetensors_error(Path(path), e)
