"""Read LeRobot v3.0 datasets (ours or ones written by the `lerobot` package).

    ds = LeRobotDataset(root, episodes=[0, 3], delta_indices={"action": list(range(50))})
    item = ds[i]   # {"observation.state": f32 [S], "action": f32 [50, A], "action_is_pad": bool [50],
                   #  "observation.images.scene": uint8 [H, W, 3], "task": str, "episode_index": ...}

Low-dim columns of the selected episodes are loaded into numpy once (they are small); images are
read on demand: mp4 frames by timestamp (``from_timestamp`` of the episode + the frame's
``timestamp``, error if no frame lies within ``tolerance_s``), inline images from PNG bytes.
Unlike `lerobot`, images stay uint8 HWC (the model-side transforms convert them).
Video decoders are opened lazily per process, so DataLoader workers each get their own.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from vlastack.data import format as fmt
from vlastack.data.stats import stats_from_json
from vlastack.data.video import VideoReader
from vlastack.fileio import read_json


def decode_image_bytes(data: bytes, size: tuple[int, int] | None = None) -> np.ndarray:
    """PNG/JPEG bytes -> uint8 [H, W, 3] (resized bilinearly to ``size`` = (H, W) if given)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB")
        if size is not None and im.size != (size[1], size[0]):
            im = im.resize((size[1], size[0]), Image.BILINEAR)
        return np.array(im)  # writable: torch.from_numpy needs it


_FORK_ORPHANS: list[Any] = []


class LeRobotDataset:
    """Map-style access to the frames of a LeRobot v3 dataset (numpy out, see module doc)."""

    def __init__(
        self,
        root: str | Path,
        episodes: list[int] | tuple[int, ...] | None = None,
        delta_indices: dict[str, list[int]] | None = None,
        tolerance_s: float = 1e-4,
        image_size: tuple[int, int] | None = None,
        video_threads: int = 1,
    ) -> None:
        self.root = Path(root)
        self.info = fmt.load_info(self.root)
        self.fps = float(self.info["fps"])
        self.features: dict[str, dict[str, Any]] = self.info["features"]
        self.video_keys = [k for k, f in self.features.items() if f["dtype"] == "video"]
        self.image_keys = [k for k, f in self.features.items() if f["dtype"] == "image"]
        self.camera_keys = self.video_keys + self.image_keys
        self.tolerance_s, self.image_size, self.video_threads = tolerance_s, image_size, video_threads
        self.delta_indices = {k: [int(d) for d in v] for k, v in (delta_indices or {}).items()}
        for k in self.delta_indices:
            if k not in self.features or self.features[k]["dtype"] in ("video", "image"):
                raise ValueError(f"delta_indices key {k!r} is not a low-dim feature of {self.root}")
        self.tasks = fmt.load_tasks(self.root)
        sp = self.root / fmt.STATS_PATH
        self.stats = stats_from_json(read_json(sp)) if sp.is_file() else {}
        self.all_episodes = self._load_episodes()
        if episodes is None:
            episodes = [int(e["episode_index"]) for e in self.all_episodes]
        by_index = {int(e["episode_index"]): e for e in self.all_episodes}
        unknown = [e for e in episodes if e not in by_index]
        if unknown:
            raise ValueError(f"{self.root}: episodes {unknown} do not exist (dataset has {len(by_index)})")
        self.episodes = [by_index[int(e)] for e in episodes]
        self._load_data()
        self._readers: dict[str, VideoReader] = {}
        self._pid = os.getpid()

    # ------------------------------------------------------------------ loading
    def _load_episodes(self) -> list[dict[str, Any]]:
        files = sorted((self.root / "meta" / "episodes").glob("*/*.parquet"))
        if not files:
            raise ValueError(f"{self.root}: no meta/episodes/*/*.parquet files")
        rows = []
        for f in files:
            t = fmt.read_parquet(f)
            keep = [c for c in t.column_names if not c.startswith("stats/")]
            rows += t.select(keep).to_pylist()
        need = ["episode_index", "length", "dataset_from_index", "dataset_to_index", "data/chunk_index",
                "data/file_index"]  # fmt: skip
        need += [
            f"videos/{k}/{c}"
            for k in self.video_keys
            for c in ("chunk_index", "file_index", "from_timestamp")
        ]
        for r in rows:
            missing = [c for c in need if c not in r or r[c] is None]
            if missing:
                raise ValueError(
                    f"{self.root}/meta/episodes: episode {r.get('episode_index')} lacks {missing}"
                )
        return sorted(rows, key=lambda r: r["episode_index"])

    def _load_data(self) -> None:
        lowdim = [k for k, f in self.features.items() if f["dtype"] not in ("video", "image", "string")]
        by_file: dict[tuple[int, int], list[dict]] = {}
        for e in self.episodes:
            by_file.setdefault((int(e["data/chunk_index"]), int(e["data/file_index"])), []).append(e)
        cols: dict[str, list[np.ndarray]] = {k: [] for k in lowdim}
        imgs: dict[str, list[pa.Array]] = {k: [] for k in self.image_keys}
        for (c, f), eps in by_file.items():
            path = self.root / self.info["data_path"].format(chunk_index=c, file_index=f)
            table = fmt.read_parquet(path)
            missing = [k for k in lowdim + self.image_keys if k not in table.column_names]
            if missing:
                raise ValueError(f"{path}: missing columns {missing}")
            # One pass per file, not per episode: a take per episode over a file of many episodes
            # is quadratic (2,000 demo episodes in one file: 59 s on a 2-core EPYC, now <1 s).
            ep_col = table["episode_index"].to_numpy()
            order = np.argsort(ep_col, kind="stable")  # rows grouped by episode, in file order
            sorted_eps = ep_col[order]
            fi_all = table["frame_index"].to_numpy()
            ts_all = table["timestamp"].to_numpy().astype(np.float64)
            rows_of = []
            for e in eps:
                ei = int(e["episode_index"])
                lo, hi = np.searchsorted(sorted_eps, [ei, ei + 1])
                rows = order[lo:hi]
                self._check_episode(path, e, fi_all[rows], ts_all[rows])
                rows_of.append(rows)
            sub = table.take(pa.array(np.concatenate(rows_of)))
            file_eps = np.repeat([int(e["episode_index"]) for e in eps], [len(r) for r in rows_of])
            for k in lowdim:
                cols[k].append(self._column(path, file_eps, sub, k))
            for k in self.image_keys:
                imgs[k].append(pa.concat_arrays([ch.field("bytes") for ch in sub[k].chunks]))
        self.columns = {k: np.concatenate(v) for k, v in cols.items()}
        self.image_bytes = {k: pa.concat_arrays(v) for k, v in imgs.items()}
        lengths = np.array([int(e["length"]) for e in self.episodes], dtype=np.int64)
        self.ep_start = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.ep_of = np.repeat(np.arange(len(self.episodes)), lengths)
        self.num_frames = int(lengths.sum())

    def _column(self, path: Path, file_eps: np.ndarray, table: pa.Table, key: str) -> np.ndarray:
        """``key`` of every row of ``table`` (the file's selected episodes, ``file_eps`` giving
        each row's episode) as one array; errors name the episode and frame."""
        ft = self.features[key]
        col = table[key].combine_chunks()
        shape = [int(s) for s in ft["shape"]]

        def where(row: int) -> tuple[str, int]:
            ep = int(file_eps[row])
            return f"episode {ep}: {key} has", int(row - np.argmax(file_eps == ep))  # its first row

        if (
            pa.types.is_list(col.type)
            or pa.types.is_fixed_size_list(col.type)
            or pa.types.is_large_list(col.type)
        ):
            lens = col.value_lengths().to_numpy(zero_copy_only=False)
            if len(lens) and (lens != int(np.prod(shape))).any():
                bad = int(np.nonzero(lens != int(np.prod(shape)))[0][0])
                what, frame = where(bad)
                raise ValueError(f"{path}: {what} {lens[bad]} values at frame {frame}, features say {shape}")
            x = col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), *shape)
        else:
            x = col.to_numpy(zero_copy_only=False)
        if col.null_count:
            first = int(np.nonzero(col.is_null().to_numpy(zero_copy_only=False))[0][0])
            ep = int(file_eps[first])
            nulls = int(col.filter(pa.array(file_eps == ep)).null_count)
            raise ValueError(f"{path}: episode {ep}: {key} has {nulls} null values")
        return x.astype(np.float32) if x.dtype == np.float64 else x

    def _check_episode(self, path: Path, e: dict, fi: np.ndarray, ts: np.ndarray) -> None:
        """``fi``, ``ts``: the episode's frame_index and timestamp values, in file order."""
        ei, length = int(e["episode_index"]), int(e["length"])
        if len(fi) != length:
            raise ValueError(f"{path}: episode {ei} has {len(fi)} rows, meta/episodes says {length}")
        if not np.array_equal(fi, np.arange(length)):
            raise ValueError(f"{path}: episode {ei}: frame_index is not 0..{length - 1} in order")
        err = np.abs(ts - fi / self.fps)
        if (err > self.tolerance_s).any():
            bad = int(np.argmax(err))
            raise ValueError(
                f"{path}: episode {ei}: timestamp {ts[bad]:.6f}s of frame {bad} is {err[bad]:.2e}s off "
                f"frame_index/fps (tolerance {self.tolerance_s}s)"
            )

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return self.num_frames

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    def episode_range(self, k: int) -> tuple[int, int]:
        """Sample positions [start, end) of the k-th selected episode."""
        s = int(self.ep_start[k])
        return s, s + int(self.episodes[k]["length"])

    def _reader(self, key: str, e: dict) -> VideoReader:
        if self._pid != os.getpid():
            # Forked into a worker: never share decoder state, and never close the parent's
            # decoders here (tearing down libav state inherited over fork can deadlock).
            _FORK_ORPHANS.append(self._readers)
            self._readers, self._pid = {}, os.getpid()
        c, f = int(e[f"videos/{key}/chunk_index"]), int(e[f"videos/{key}/file_index"])
        path = self.root / self.info["video_path"].format(video_key=key, chunk_index=c, file_index=f)
        r = self._readers.get(str(path))
        if r is None:
            if not path.is_file():
                raise ValueError(f"{path}: video file is missing (episode {e['episode_index']}, {key})")
            r = self._readers[str(path)] = VideoReader(path, threads=self.video_threads)
        return r

    def image(self, key: str, i: int, size: tuple[int, int] | None = None) -> np.ndarray:
        """uint8 [H, W, 3] of camera ``key`` at sample position ``i``."""
        size = size or self.image_size
        e = self.episodes[int(self.ep_of[i])]
        if key in self.image_bytes:
            data = self.image_bytes[key][i].as_py()
            if data is None:
                raise ValueError(f"{self.root}: episode {e['episode_index']}: {key} frame has no image bytes")
            return decode_image_bytes(data, size)
        t = float(e[f"videos/{key}/from_timestamp"]) + float(self.columns["timestamp"][i])
        try:
            return self._reader(key, e).frame_at(t, self.tolerance_s, size)
        except ValueError as err:
            raise ValueError(f"episode {e['episode_index']}, {key}: {err}") from None

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = int(i)
        if not 0 <= i < self.num_frames:
            raise IndexError(f"index {i} out of range for {self.num_frames} frames")
        k = int(self.ep_of[i])
        start, end = self.episode_range(k)
        item: dict[str, Any] = {key: col[i] for key, col in self.columns.items()}
        for key, deltas in self.delta_indices.items():
            idx = i + np.asarray(deltas)
            item[f"{key}_is_pad"] = (idx < start) | (idx >= end)
            item[key] = self.columns[key][np.clip(idx, start, end - 1)]
        for key in self.camera_keys:
            item[key] = self.image(key, i)
        item["task"] = self.tasks[int(self.columns["task_index"][i])]
        return item

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        """Batched fetch in (episode, time) order, so mp4 decoding moves forward, not back and forth."""
        order = sorted(range(len(indices)), key=lambda j: int(indices[j]))
        out: list[Any] = [None] * len(indices)
        for j in order:
            out[j] = self[indices[j]]
        return out

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_readers"] = {}  # decoders hold native handles; each process opens its own
        return state
