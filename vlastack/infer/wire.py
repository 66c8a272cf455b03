"""Wire formats: openpi's msgpack-numpy encoding, and JSON arrays, with a strict decoder.

openpi-client (``openpi_client.msgpack_numpy``) packs an ``np.ndarray`` as a msgpack map with
binary keys ``{b"__ndarray__": True, b"data": <raw bytes>, b"dtype": "<f4", b"shape": [..]}``
and a numpy scalar as ``{b"__npgeneric__": True, b"data": <python value>, b"dtype": ".."}``;
strings are msgpack str, bytes are bin. We write the same maps, and decode them with our own code:
no pickle, a dtype whitelist, and shapes checked against the byte count and a size limit before
any array is built. Anything else that is not a plain msgpack value is rejected.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import msgpack
import numpy as np

# Little-endian or byte-order-free numeric dtypes only: no object, void, complex or strings.
DTYPES = frozenset(["|u1", "|i1", "|b1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"])
MAX_ELEMENTS = 64 * 1024 * 1024
MAX_NDIM = 8
MAX_DEPTH = 8  # nesting of maps/lists in a decoded message


class WireError(ValueError):
    """A message that cannot be decoded or breaks a limit."""


def _dtype(value: object) -> np.dtype:
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    if not isinstance(value, str) or value not in DTYPES:
        raise WireError(f"array dtype {value!r:.40} is not allowed; allowed: {sorted(DTYPES)}")
    return np.dtype(value)


def _shape(value: object) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or len(value) > MAX_NDIM:
        raise WireError(f"array shape must be a list of at most {MAX_NDIM} ints, got {value!r:.80}")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_ELEMENTS for d in value):
        raise WireError(f"array shape must hold ints in [0, {MAX_ELEMENTS}], got {value!r:.80}")
    if math.prod(value) > MAX_ELEMENTS:
        raise WireError(f"array of shape {list(value)} exceeds {MAX_ELEMENTS} elements")
    return tuple(value)


_ND_KEYS = {b"__ndarray__", b"data", b"dtype", b"shape"}
_NG_KEYS = {b"__npgeneric__", b"data", b"dtype"}


def _object_hook(obj: dict) -> Any:
    """Called by msgpack for every map (innermost first): turn array maps into numpy arrays."""
    if b"__ndarray__" in obj:
        if set(obj) != _ND_KEYS:
            raise WireError(f"ndarray map must have exactly keys {sorted(k.decode() for k in _ND_KEYS)}")
        dtype, shape, data = _dtype(obj[b"dtype"]), _shape(obj[b"shape"]), obj[b"data"]
        if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
            n = len(data) if isinstance(data, bytes) else type(data).__name__
            raise WireError(
                f"ndarray data has {n} bytes; shape {list(shape)} of {dtype} needs "
                f"{math.prod(shape) * dtype.itemsize}"
            )
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if b"__npgeneric__" in obj:
        if set(obj) != _NG_KEYS:
            raise WireError("npgeneric map must have exactly keys __npgeneric__, data, dtype")
        value = obj[b"data"]
        if not isinstance(value, int | float | bool) or (isinstance(value, int) and abs(value) >= 2**63):
            raise WireError(f"npgeneric data must be a number, got {type(value).__name__}")
        return np.array(value, dtype=_dtype(obj[b"dtype"]))[()]
    return obj


def _ext_hook(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack extension type {code} is not allowed")


def _check_tree(x: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise WireError(f"message nests deeper than {MAX_DEPTH} levels")
    if isinstance(x, dict):
        for k, v in x.items():
            if not isinstance(k, str):
                raise WireError(f"map keys must be strings, got {k!r:.40}")
            _check_tree(v, depth + 1)
    elif isinstance(x, list):
        for v in x:
            _check_tree(v, depth + 1)
    elif not isinstance(x, str | int | float | bool | bytes | np.ndarray | np.generic | type(None)):
        raise WireError(f"unsupported value of type {type(x).__name__}")


def unpackb(data: bytes, max_bytes: int) -> Any:
    """Decode one openpi msgpack-numpy message; raises ``WireError`` with the reason."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError("expected a binary message")
    if len(data) > max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        out = msgpack.unpackb(
            data,
            object_hook=_object_hook,
            ext_hook=_ext_hook,
            raw=False,
            strict_map_key=False,
            timestamp=0,
        )
    except WireError:
        raise
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as e:
        raise WireError(f"invalid msgpack: {type(e).__name__}: {e}"[:300]) from None
    _check_tree(out)
    return out


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.str not in DTYPES:
            obj = obj.astype(obj.dtype.newbyteorder("<")) if obj.dtype.kind in "uifb" else obj
            if obj.dtype.str not in DTYPES:
                raise TypeError(f"cannot send arrays of dtype {obj.dtype}")
        return {
            b"__ndarray__": True,
            b"data": np.ascontiguousarray(obj).tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": list(obj.shape),
        }
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot pack {type(obj).__name__}")


def packb(obj: Any) -> bytes:
    """Encode like ``openpi_client.msgpack_numpy.packb``."""
    return msgpack.packb(obj, default=_pack_default, use_bin_type=True)


# ----------------------------------------------------------------------------- JSON (HTTP)


def _json_array(x: dict) -> np.ndarray:
    """``{"b64": "...", "dtype": "uint8", "shape": [..]}`` -> array (checked like msgpack arrays)."""
    if set(x) - {"b64", "dtype", "shape"}:
        raise WireError(f"base64 array must have keys b64, dtype, shape; got {sorted(x)}")
    try:
        dtype = np.dtype(str(x.get("dtype", "")))
    except TypeError:
        raise WireError(f"unknown dtype {x.get('dtype')!r:.40}") from None
    dtype = _dtype(dtype.newbyteorder("<").str if dtype.byteorder != "|" else dtype.str)
    shape = _shape(x.get("shape"))
    b64 = x["b64"]
    if not isinstance(b64, str) or len(b64) > 4 * (math.prod(shape) * dtype.itemsize + 2) // 3 + 4:
        raise WireError("b64 must be a base64 string matching shape and dtype")
    try:
        raw = base64.b64decode(b64, validate=True)
    except ValueError:
        raise WireError("b64 is not valid base64") from None
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise WireError(f"b64 data has {len(raw)} bytes; shape {list(shape)} of {dtype} needs more/less")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _list_array(x: list, dtype: np.dtype | None) -> np.ndarray:
    """A nested JSON list -> array of ``dtype``, or (``None``, images) of the numbers' own kind:
    integers 0..255 become uint8 and floats stay floats, so the image check sees what was sent
    (``np.asarray(x, uint8)`` would wrap 300 to 44 and truncate 0.5 to 0)."""
    try:
        arr = np.asarray(x, dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        raise WireError(f"array must be a rectangular list of numbers of {dtype or 'one kind'}") from None
    if arr.size > MAX_ELEMENTS or arr.ndim > MAX_NDIM:
        raise WireError("array too large")
    if dtype is None:
        if arr.dtype.kind in "iu":
            if arr.size and (arr.min() < 0 or arr.max() > 255):
                raise WireError(
                    f"image values must be 0..255 (uint8) or floats in [0, 1], got [{arr.min()}, {arr.max()}]"
                )
            arr = arr.astype(np.uint8)
        elif arr.dtype.kind != "f":
            raise WireError(f"an image must be a list of numbers, got {arr.dtype}")
    return arr


def obs_from_json(text: bytes, max_bytes: int) -> dict:
    """HTTP body -> observation dict. Images and state are nested lists or base64 dicts."""
    if len(text) > max_bytes:
        raise WireError(f"body of {len(text)} bytes exceeds the limit of {max_bytes}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise WireError(f"invalid JSON: {e}"[:200]) from None
    _check_tree(data)
    if not isinstance(data, dict):
        raise WireError("body must be a JSON object (the observation)")
    obs = data.get("obs", data) if set(data) == {"obs"} else data
    if not isinstance(obs, dict):
        raise WireError("'obs' must be an object")

    def conv(v: Any, dtype: np.dtype) -> Any:
        if isinstance(v, dict) and "b64" in v:
            return _json_array(v)
        if isinstance(v, list):
            return _list_array(v, dtype)
        return v

    out: dict[str, Any] = {}
    for k, v in obs.items():
        if k == "images" and isinstance(v, dict):
            out[k] = {c: conv(img, None) for c, img in v.items()}
        elif k in ("state", "observation/state"):
            out[k] = conv(v, np.dtype(np.float64))  # float64: an overflow is then caught, not made inf
        elif k.startswith("observation/"):
            out[k] = conv(v, None)
        else:
            out[k] = v
    return out
