"""Add a feature computed from a LeRobot v3 dataset's own columns, in place, as LeRobot lays it out.

    add_feature("data/mt10", "observation.environment_uv.image", ["observation.environment_state"],
                lambda cols: points_uv(cols["observation.environment_state"]))

The new column joins every data parquet file (with the `datasets` schema metadata LeRobot reads),
``meta/info.json`` its feature, ``meta/stats.json`` and the per-episode ``stats/<key>/*`` columns
its statistics. Videos are untouched. ``vla data add-uv`` uses it to give a Meta-World dataset
recorded without them (e.g. LeRobot's ``lerobot/metaworld_mt50``) the grounding points' image
positions that ``model.grounding.attend_weight`` needs.

Every file is written to a temporary name and renamed over the old one, data files first and
``info.json`` last: an interrupted run leaves files that still read as the old dataset or the new
one, and running it again finishes the job.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlastack.data import format as fmt
from vlastack.data.stats import exact_stats, stats_from_json, stats_to_json
from vlastack.fileio import read_json

T = TypeVar("T")


def write_new_dataset(dst: str | Path, fill: Callable[[Path], T], what: str = "this") -> T:
    """Make the dataset folder ``dst``, which must not exist, by ``fill(tmp)`` into ``dst.tmp`` and
    one rename: a failed or interrupted ``fill`` never leaves a half-made dataset at ``dst`` (the
    copies ``vla data hindsight`` and ``vla data resize`` write) -> what ``fill`` returns."""
    dst = Path(dst)
    if dst.exists():
        raise ValueError(f"{dst} exists: {what} writes a new dataset")
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        out = fill(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tmp.rename(dst)
    return out


def _write_table(table: pa.Table, path: Path) -> None:
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def add_feature(
    root: str | Path,
    key: str,
    inputs: list[str],
    fn: Callable[[dict[str, np.ndarray]], np.ndarray],
    overwrite: bool = False,
    names: list[str] | None = None,
) -> dict:
    """Add float32 feature ``key`` = ``fn({input: float array [N, ...]})`` -> [N, D] to the dataset
    at ``root``; ``fn`` sees one data file's rows at a time and must be a per-frame function.
    ``names``: the feature's per-dimension names in ``info.json``. Returns the feature's info
    entry. A feature already there is a ValueError unless ``overwrite``."""
    root = Path(root)
    info = fmt.load_info(root)
    features = info["features"]
    if key in features and not overwrite:
        raise ValueError(
            f"{root}: already has feature {key!r} (pass overwrite=True / --overwrite to recompute)"
        )
    missing = [k for k in inputs if k not in features]
    if missing:
        raise ValueError(f"{root}: needs feature(s) {missing}; it has {sorted(features)}")
    data_files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    if not data_files:
        raise ValueError(f"{root}: no data files under data/")
    values: list[np.ndarray] = []
    index: list[np.ndarray] = []
    new_ft: dict | None = None
    for path in data_files:
        table = fmt.read_parquet(path)
        cols = {k: np.asarray(table.column(k).to_pylist(), np.float64) for k in inputs}
        out = np.asarray(fn(cols), np.float32)
        if out.ndim != 2 or out.shape[0] != table.num_rows:
            raise ValueError(f"{key}: expected [{table.num_rows}, D] from the function, got {out.shape}")
        ft = {"dtype": "float32", "shape": [int(out.shape[1])], "names": names}
        if new_ft is not None and ft != new_ft:
            raise ValueError(f"{key}: the function returned different widths across files")
        new_ft = ft
        if key in table.column_names:
            table = table.drop_columns([key])
        typ = fmt.arrow_type(ft)
        col = pa.FixedSizeListArray.from_arrays(pa.array(out.reshape(-1)), typ.list_size)
        table = table.append_column(pa.field(key, typ), col)
        feats = {k: f for k, f in features.items() if k != key} | {key: ft}
        schema = fmt.data_schema({k: feats[k] for k in table.column_names if k in feats})
        table = table.select(schema.names).cast(schema)
        _write_table(table, path)
        values.append(out)
        index.append(np.asarray(table.column("index").to_pylist(), np.int64))
    assert new_ft is not None
    allv, alli = np.concatenate(values), np.concatenate(index)
    order = np.argsort(alli)
    allv, alli = allv[order], alli[order]

    # Per-episode statistics, in the meta/episodes files, as the writer computes them.
    for path in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
        eps = fmt.read_parquet(path)
        rows = eps.to_pylist()
        for row in rows:
            lo, hi = np.searchsorted(alli, [row["dataset_from_index"], row["dataset_to_index"]])
            st = exact_stats(allv[lo:hi].astype(np.float64))
            for s in fmt.STATS_KEYS:
                row[f"stats/{key}/{s}"] = np.asarray(st[s]).tolist()
        names = [c for c in eps.column_names if not c.startswith(f"stats/{key}/")]
        at = names.index("meta/episodes/chunk_index") if "meta/episodes/chunk_index" in names else len(names)
        order_cols = names[:at] + [f"stats/{key}/{s}" for s in fmt.STATS_KEYS] + names[at:]
        _write_table(pa.Table.from_pylist([{c: r[c] for c in order_cols} for r in rows]), path)

    stats_path = root / fmt.STATS_PATH
    stats = stats_from_json(read_json(stats_path)) if stats_path.is_file() else {}
    stats[key] = exact_stats(allv.astype(np.float64))
    fmt.write_json_atomic(stats_path, stats_to_json(stats))
    info["features"] = {k: f for k, f in features.items() if k != key} | {key: new_ft}
    fmt.write_json_atomic(root / fmt.INFO_PATH, info)
    return new_ft
