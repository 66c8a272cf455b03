"""LeRobot v3.0 on-disk layout: paths, default features, parquet schemas (shared by writer/reader).

meta/info.json, meta/stats.json, meta/tasks.parquet
meta/episodes/chunk-XXX/file-YYY.parquet   one row per episode
data/chunk-XXX/file-YYY.parquet            frames of many episodes
videos/<key>/chunk-XXX/file-YYY.mp4        episodes concatenated
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from vlastack.fileio import read_json

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_FILE_SIZE_MB = 100
VIDEO_FILE_SIZE_MB = 200  # lerobot 0.4 default
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
EPISODES_PATH = "meta/episodes/" + CHUNK_FILE + ".parquet"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"

DEFAULT_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
NUMERIC = ("float32", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
INTEGER = ("int64", "int32", "int16", "int8", "uint8")
# Order of the per-feature statistics, as lerobot writes them (stats.json, meta/episodes columns).
STATS_KEYS = ("min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99")


def next_chunk_file(chunk: int, file: int, chunks_size: int = CHUNKS_SIZE) -> tuple[int, int]:
    return (chunk + 1, 0) if file == chunks_size - 1 else (chunk, file + 1)


def arrow_type(ft: dict[str, Any]) -> pa.DataType:
    """Arrow type of one data-parquet column, matching what HF `datasets` writes for lerobot."""
    dt = ft["dtype"]
    if dt == "image":
        return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    if dt == "string":
        return pa.string()
    if dt not in NUMERIC:
        raise ValueError(f"unsupported feature dtype {dt!r}")
    base = pa.from_numpy_dtype(dt) if dt != "bool" else pa.bool_()
    shape = list(ft["shape"])
    if shape == [1]:
        return base
    if len(shape) != 1:
        raise ValueError(f"only 1-D numeric features are supported in parquet, got shape {shape}")
    return pa.list_(base, shape[0])


def hf_feature(ft: dict[str, Any]) -> dict[str, Any]:
    """The `datasets` feature spec stored in parquet metadata, so `datasets` restores the types.

    Fixed-length vectors are ``List`` with a ``length`` (datasets >= 4, which lerobot v3 requires).
    """
    dt = ft["dtype"]
    if dt == "image":
        return {"_type": "Image"}
    value = {"dtype": dt, "_type": "Value"}
    if list(ft["shape"]) == [1]:
        return value
    return {"feature": value, "length": int(ft["shape"][0]), "_type": "List"}


def data_schema(features: dict[str, dict[str, Any]]) -> pa.Schema:
    cols = {k: ft for k, ft in features.items() if ft["dtype"] != "video"}
    meta = {"huggingface": json.dumps({"info": {"features": {k: hf_feature(f) for k, f in cols.items()}}})}
    return pa.schema([(k, arrow_type(f)) for k, f in cols.items()], metadata=meta)


def tasks_table(tasks: list[str]) -> pa.Table:
    """tasks.parquet as pandas writes lerobot's DataFrame indexed by task (an unnamed index).

    lerobot reads the task text from the DataFrame index, stored as ``__index_level_0__``.
    """
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
             "metadata": {"encoding": "UTF-8"}}
        ],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
             "numpy_type": "int64", "metadata": None},
            {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode",
             "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }  # fmt: skip
    schema = pa.schema(
        [("task_index", pa.int64()), ("__index_level_0__", pa.string())], {"pandas": json.dumps(pandas_meta)}
    )
    return pa.table({"task_index": list(range(len(tasks))), "__index_level_0__": tasks}, schema=schema)


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """Read a parquet file; a missing/truncated/corrupt file is a ValueError naming it."""
    if not path.is_file():
        raise ValueError(f"{path}: file is missing")
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: corrupt or truncated parquet ({e})") from None


def load_info(root: Path) -> dict[str, Any]:
    p = root / INFO_PATH
    if not p.is_file():
        raise ValueError(f"{root}: not a LeRobot dataset ({INFO_PATH} is missing)")
    info = read_json(p)  # a BadFileError (ValueError) naming the file
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3"):
        raise ValueError(f"{p}: codebase_version {version!r} is not supported (need v3.x)")
    for k in ("fps", "features", "data_path"):
        if k not in info:
            raise ValueError(f"{p}: missing key {k!r}")
    return info


def load_tasks(root: Path) -> list[str]:
    """``meta/tasks.parquet`` -> the task texts, in task_index order."""
    path = Path(root) / TASKS_PATH
    table = read_parquet(path)
    # lerobot stores the text as the pandas index: `__index_level_0__` when unnamed (what
    # lerobot writes), or a named index column (e.g. `task`) in older or converted datasets.
    cols = table.column_names
    pandas_meta = json.loads((table.schema.metadata or {}).get(b"pandas", b"{}"))
    index_cols = [c for c in pandas_meta.get("index_columns", []) if isinstance(c, str)]
    cands = ["task", *index_cols, "__index_level_0__"]
    text = next((c for c in cands if c in cols and c != "task_index"), None)
    if text is None or "task_index" not in cols:
        raise ValueError(f"{path}: needs columns 'task' and 'task_index', has {cols}")
    out: dict[int, str] = dict(zip(table["task_index"].to_pylist(), table[text].to_pylist()))
    if sorted(out) != list(range(len(out))):
        raise ValueError(f"{path}: task_index must be 0..{len(out) - 1}, got {sorted(out)}")
    return [out[i] for i in range(len(out))]


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=4, ensure_ascii=False))
    tmp.replace(path)


TRAIN_SEEDS = "train_seeds.json"  # in a checkpoint folder: the simulator seeds behind its data


def train_seeds(data_path: str | Path) -> dict | None:
    """{"dataset", "suite", "episodes": [[task, seed], ...]} from a generated dataset's
    ``meta/vlastack_sim.json`` (None for other data). ``vla eval`` refuses to score a policy on
    these layouts."""
    meta = Path(data_path) / "meta" / "vlastack_sim.json" if data_path else None
    if meta is None or not meta.is_file():
        return None
    info = json.loads(meta.read_text())
    pairs = [[e["task"], int(e["seed"])] for e in info.get("episode_info", [])]
    return {"dataset": str(Path(data_path).resolve()), "suite": info.get("suite"), "episodes": pairs}


def action_representation(data_path: str | Path | None) -> str | None:
    """What a generated dataset's actions mean (``delta`` / ``absolute``) from its
    ``meta/vlastack_sim.json`` (``delta`` for one written before the record existed); None for other
    data, which does not say."""
    meta = Path(data_path) / "meta" / "vlastack_sim.json" if data_path else None
    if meta is None or not meta.is_file():
        return None
    return json.loads(meta.read_text()).get("action_representation", "delta")
