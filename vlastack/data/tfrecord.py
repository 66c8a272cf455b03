"""TFRecord files and tf.train.Example protobufs without TensorFlow.

TFRecord framing, per record::

    uint64 length (little endian) | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

with ``masked(c) = ((c >> 15) | (c << 17)) + 0xA282EAD8 (mod 2**32)``. Every CRC is checked; a
mismatch or a truncated record is a ValueError naming the file and record number.

``tf.train.Example`` is parsed straight from the protobuf wire format::

    Example{1: Features}   Features{1: map<string, Feature>} (entries {1: key, 2: Feature})
    Feature{1: BytesList | 2: FloatList | 3: Int64List}   each list {1: repeated value}
    SequenceExample{1: Features context, 2: FeatureLists{1: map<string, FeatureList{1: Feature}>}}

Float and int64 lists are accepted packed or unpacked. Values come back as ``list[bytes]``,
float32 arrays or int64 arrays.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

try:  # C implementation (SSE4.2 when available); the pure-Python table below is the fallback
    from crc32c import crc32c as _crc32c_c
except ImportError:  # pragma: no cover - exercised by test_crc32c_fallback
    _crc32c_c = None

_POLY = 0x82F63B78  # Castagnoli, reflected
_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c_py(data: bytes) -> int:
    crc = 0xFFFFFFFF
    t = _TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc32c(data: bytes) -> int:
    return _crc32c_c(data) if _crc32c_c is not None else crc32c_py(data)


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ----------------------------------------------------------------------------- framing


def write_tfrecord(path: str | Path, records: list[bytes]) -> None:
    """Write records atomically (temp file, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        for data in records:
            n = struct.pack("<Q", len(data))
            f.write(n + struct.pack("<I", masked_crc(n)) + data + struct.pack("<I", masked_crc(data)))
    tmp.replace(path)


def read_tfrecord(path: str | Path, verify: bool = True) -> Iterator[bytes]:
    """Yield the records of one TFRecord file (uncompressed)."""
    path = Path(path)
    with open(path, "rb") as f:
        i = 0
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                raise ValueError(f"{path}: record {i}: truncated header ({len(head)} of 12 bytes)")
            (n,) = struct.unpack("<Q", head[:8])
            if verify and struct.unpack("<I", head[8:])[0] != masked_crc(head[:8]):
                raise ValueError(f"{path}: record {i}: length CRC mismatch (corrupt file or not a TFRecord)")
            data = f.read(n)
            foot = f.read(4)
            if len(data) < n or len(foot) < 4:
                raise ValueError(f"{path}: record {i}: truncated (expected {n} data bytes)")
            if verify and struct.unpack("<I", foot)[0] != masked_crc(data):
                raise ValueError(f"{path}: record {i}: data CRC mismatch (corrupt record)")
            yield data
            i += 1


# ----------------------------------------------------------------------------- protobuf wire format


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("protobuf: truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("protobuf: varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of a message; value is int (varint/fixed) or bytes (len)."""
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = _varint(buf, pos)
        elif wt == 1:
            v, pos = buf[pos : pos + 8], pos + 8
        elif wt == 2:
            ln, pos = _varint(buf, pos)
            if pos + ln > n:
                raise ValueError("protobuf: length-delimited field runs past the end")
            v, pos = buf[pos : pos + ln], pos + ln
        elif wt == 5:
            v, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"protobuf: unsupported wire type {wt}")
        yield num, wt, v


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def parse_feature(buf: bytes) -> list[bytes] | np.ndarray:
    for num, _, lst in _fields(buf):
        if num == 1:
            return [bytes(v) for n2, _, v in _fields(lst) if n2 == 1]
        if num == 2:
            parts = []
            for n2, _wt, v in _fields(lst):
                if n2 == 1:
                    parts.append(np.frombuffer(v, dtype="<f4"))  # packed (wt 2) or one fixed32 (wt 5)
            return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
        if num == 3:
            vals: list[int] = []
            for n2, wt, v in _fields(lst):
                if n2 != 1:
                    continue
                if wt == 0:
                    vals.append(_signed64(v))
                else:
                    p = 0
                    while p < len(v):
                        x, p = _varint(v, p)
                        vals.append(_signed64(x))
            return np.asarray(vals, dtype=np.int64)
    return []  # a Feature with no kind set


def _parse_features(buf: bytes) -> dict[str, list[bytes] | np.ndarray]:
    out = {}
    for num, _, entry in _fields(buf):
        if num != 1:
            continue
        key, val = None, b""
        for n2, _, v in _fields(entry):
            if n2 == 1:
                key = bytes(v).decode("utf-8")
            elif n2 == 2:
                val = v
        if key is not None:
            out[key] = parse_feature(val)
    return out


def parse_example(buf: bytes) -> dict[str, list[bytes] | np.ndarray]:
    """tf.train.Example bytes -> {name: list[bytes] | float32 array | int64 array}."""
    for num, _, v in _fields(buf):
        if num == 1:
            return _parse_features(v)
    return {}


def parse_sequence_example(buf: bytes) -> tuple[dict, dict[str, list]]:
    """tf.train.SequenceExample bytes -> (context features, {name: [per-step feature values]})."""
    context, lists = {}, {}
    for num, _, v in _fields(buf):
        if num == 1:
            context = _parse_features(v)
        elif num == 2:
            for n2, _, entry in _fields(v):
                if n2 != 1:
                    continue
                key, steps = None, []
                for n3, _, x in _fields(entry):
                    if n3 == 1:
                        key = bytes(x).decode("utf-8")
                    elif n3 == 2:
                        steps = [parse_feature(f) for n4, _, f in _fields(x) if n4 == 1]
                if key is not None:
                    lists[key] = steps
    return context, lists


def _enc_varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(num: int, payload: bytes) -> bytes:
    return _enc_varint((num << 3) | 2) + _enc_varint(len(payload)) + payload


def encode_feature(value: list[bytes] | list[str] | np.ndarray) -> bytes:
    """bytes/str list -> BytesList; float array -> FloatList; int/bool array -> Int64List (packed)."""
    if isinstance(value, list | tuple) and (not value or isinstance(value[0], bytes | str)):
        items = [v.encode() if isinstance(v, str) else v for v in value]
        return _ld(1, b"".join(_ld(1, v) for v in items))
    arr = np.asarray(value)
    if arr.dtype.kind == "f":
        return _ld(2, _ld(1, arr.astype("<f4").tobytes()))
    if arr.dtype.kind in "iub":
        return _ld(3, _ld(1, b"".join(_enc_varint(int(x)) for x in arr.reshape(-1))))
    raise TypeError(f"cannot encode feature of dtype {arr.dtype}")


def encode_example(features: dict[str, list | np.ndarray]) -> bytes:
    entries = b"".join(_ld(1, _ld(1, k.encode()) + _ld(2, encode_feature(v))) for k, v in features.items())
    return _ld(1, entries)
