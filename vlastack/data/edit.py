"""Edit a LeRobot v3 dataset's columns, in place, as LeRobot lays it out; write edited copies.

    add_feature("data/mt10", "observation.environment_uv.image", ["observation.environment_state"],
                lambda cols: points_uv(cols["observation.environment_state"]))

The new column joins every data parquet file (with the `datasets` schema metadata LeRobot reads),
``meta/info.json`` its feature, ``meta/stats.json`` and the per-episode ``stats/<key>/*`` columns
its statistics. Videos are untouched. ``vla data add-uv`` uses it to give a Meta-World dataset
recorded without them (e.g. LeRobot's ``lerobot/metaworld_mt50``) the grounding points' image
positions that ``model.grounding.attend_weight`` needs.

``drop_features`` removes columns the same way; ``task_onehot_dataset`` writes a copy whose
``observation.environment_state`` is the task as a one-hot (``vla data task-onehot``): how a policy
without a language input (LeRobot's ACT, Diffusion Policy) gets the task identity a VLA reads from
its prompt, through the environment-state input both already have (issue #64).

Every file is written to a temporary name and renamed over the old one, data files first and
``info.json`` last: an interrupted run leaves files that still read as the old dataset or the new
one, and running it again finishes the job.
"""

from __future__ import annotations

import os
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
TASK_PREFIX = "task="  # the per-dimension names of a task one-hot: "task=<the task's text>"


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


def _link(s: str, d: str) -> None:
    """Hard-link a file that is not changed (a video); copy where the file system refuses."""
    try:
        os.link(s, d)
    except OSError:
        shutil.copy2(s, d)


def copy_dataset_files(src: str | Path, dst: str | Path) -> None:
    """Copy the dataset folder ``src`` into ``dst`` to be edited there; videos are hard links."""
    src, dst = Path(src), Path(dst)
    for sub in sorted(src.iterdir()):
        target = dst / sub.name
        if sub.name == "videos":
            shutil.copytree(sub, target, copy_function=_link)
        elif sub.is_dir():
            shutil.copytree(sub, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(sub, target)


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


def drop_features(root: str | Path, keys: list[str]) -> list[str]:
    """Remove the features ``keys`` (those present) from the dataset at ``root``: data columns,
    ``info.json``, ``stats.json`` and the per-episode statistics -> the keys removed. A video or a
    LeRobot default feature (index, timestamp, ...) is a ValueError."""
    root = Path(root)
    info = fmt.load_info(root)
    features = info["features"]
    keys = [k for k in keys if k in features]
    bad = [k for k in keys if k in fmt.DEFAULT_FEATURES or features[k]["dtype"] in ("video", "image")]
    if bad:
        raise ValueError(f"{root}: cannot drop {bad} (LeRobot's default columns or images)")
    if not keys:
        return []
    keep = {k: f for k, f in features.items() if k not in keys}
    for path in sorted((root / "data").glob("chunk-*/file-*.parquet")):
        table = fmt.read_parquet(path)
        table = table.drop_columns([k for k in keys if k in table.column_names])
        schema = fmt.data_schema({k: keep[k] for k in table.column_names if k in keep})
        _write_table(table.select(schema.names).cast(schema), path)
    for path in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
        eps = fmt.read_parquet(path)
        gone = [c for c in eps.column_names if any(c.startswith(f"stats/{k}/") for k in keys)]
        _write_table(eps.drop_columns(gone), path)
    stats_path = root / fmt.STATS_PATH
    if stats_path.is_file():
        stats = read_json(stats_path)
        fmt.write_json_atomic(stats_path, {k: v for k, v in stats.items() if k not in keys})
    info["features"] = keep
    fmt.write_json_atomic(root / fmt.INFO_PATH, info)
    return keys


def task_onehot_dataset(src: str | Path, dst: str | Path) -> dict:
    """Copy the dataset at ``src`` to ``dst`` (which must not exist; videos hard-linked) with
    ``observation.environment_state`` = the frame's task as a one-hot over ``meta/tasks.parquet``
    (float32 [T], dimension i named ``task=<task i's text>``), and every other environment column
    (a simulator's state, its image positions) removed -> the new feature's info entry.

    A policy trained on the copy reads the task where LeRobot's ACT and Diffusion Policy read an
    environment state; at evaluation ``scripts/lerobot_policy_server.py --task-onehot DATASET``
    builds the same vector from the prompt, by these names."""
    from vlastack.data.samples import ENV_KEY, ENV_UV_KEY

    src = Path(src)
    info = fmt.load_info(src)
    if "task_index" not in info["features"]:
        raise ValueError(f"{src}: no task_index column")
    tasks = fmt.load_tasks(src)
    n = len(tasks)

    def onehot(cols: dict[str, np.ndarray]) -> np.ndarray:
        idx = cols["task_index"].reshape(-1).astype(np.int64)
        if idx.min() < 0 or idx.max() >= n:
            raise ValueError(f"{src}: task_index outside the {n} tasks of {fmt.TASKS_PATH}")
        return np.eye(n, dtype=np.float32)[idx]

    def fill(tmp: Path) -> dict:
        copy_dataset_files(src, tmp)
        drop_features(tmp, [k for k in info["features"] if k == ENV_KEY or k.startswith(ENV_UV_KEY + ".")])
        return add_feature(tmp, ENV_KEY, ["task_index"], onehot, names=[TASK_PREFIX + t for t in tasks])

    return write_new_dataset(dst, fill, "task_onehot_dataset")
