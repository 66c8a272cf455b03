"""Shared helpers of the fault-injection suite: corrupting files, tiny datasets, CLI subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def vla(*args: str, env: dict | None = None, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m vlastack.cli ARGS`` in a subprocess (text output captured)."""
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    e.pop("VLA_DEBUG", None)
    return subprocess.run(
        [PY, "-m", "vlastack.cli", *args], env=e, capture_output=True, text=True, timeout=timeout, **kw
    )


def truncate(path: Path, frac: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: max(1, int(len(data) * frac))])


def garbage(path: Path, n: int = 4096, seed: int = 0) -> None:
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes())


def write_small_dataset(root: Path, lengths=(12, 20, 9)) -> Path:
    """A 3-episode LeRobot v3 dataset (video + image cameras, 5-d state, 3-d action)."""
    from tests.data.conftest import write_dataset

    write_dataset(root, lengths=lengths)
    return root


def set_value(root: Path, key: str, episode: int, frame: int, dim: int, value: float) -> None:
    """Overwrite one low-dim value in the data parquet (the writer refuses NaN, external data may not)."""
    path = next((root / "data").glob("*/*.parquet"))
    table = pq.read_table(path)
    eps = table["episode_index"].to_numpy()
    row = int(np.nonzero(eps == episode)[0][frame])
    col = np.stack(table[key].to_numpy(zero_copy_only=False)).astype(np.float32)
    col[row, dim] = value
    arr = pa.array(list(col), type=table.schema.field(key).type)
    table = table.set_column(table.column_names.index(key), key, arr)
    pq.write_table(table, path)


def edit_stats(root: Path, key: str, name: str, value: list[float]) -> None:
    p = root / "meta" / "stats.json"
    st = json.loads(p.read_text())
    st[key][name] = value
    p.write_text(json.dumps(st))
