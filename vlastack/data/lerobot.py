"""LeRobot v3.0 dataset writer (the reader is ``vlastack.data.reader.LeRobotDataset``, re-exported here).

    w = LeRobotWriter(root, fps=10, features={...}, robot_type="vlastack_sim")
    w.add_episode({"observation.images.scene": uint8 [T,H,W,3], "observation.state": f32 [T,S],
                   "action": f32 [T,A]}, task="pick up the red block")
    w.finalize()

Everything is written into ``<root>.partial`` and renamed to ``root`` by ``finalize``, so a crash
never leaves a half-written dataset at ``root``. Episodes stream to disk as they come: a data
parquet row group and a few seconds of mp4 per episode; only per-episode metadata stays in memory.
``dtype: "video"`` features become mp4 (H.264, GOP 2 by default), ``dtype: "image"`` features are
PNG bytes inline in the data parquet (``{"bytes", "path"}`` structs, as `datasets` writes them).
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlastack.data import format as fmt
from vlastack.data.reader import LeRobotDataset
from vlastack.data.stats import RunningStats, exact_stats, stats_to_json
from vlastack.data.video import PIX_FMTS, VideoEncoder

__all__ = ["LeRobotDataset", "LeRobotWriter", "encode_png"]

# Image statistics use a subsample: enough frames and pixels for stable per-channel numbers.
_IMG_STAT_FRAMES = 16
_IMG_STAT_STRIDE = 4


def encode_png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _image_sample(frames: np.ndarray) -> np.ndarray:
    """uint8 [T,H,W,3] -> float [N, 3] pixels in [0, 1] from a few frames."""
    idx = np.linspace(0, len(frames) - 1, min(len(frames), _IMG_STAT_FRAMES)).round().astype(int)
    sub = frames[idx, ::_IMG_STAT_STRIDE, ::_IMG_STAT_STRIDE, :]
    return sub.reshape(-1, 3).astype(np.float64) / 255.0


def _lerobot_stats(st: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """Stats in lerobot's key order; integer features keep integer min/max, as lerobot writes them."""
    out = {s: np.asarray(st[s]) for s in fmt.STATS_KEYS}
    if dtype in fmt.INTEGER:
        out["min"], out["max"] = out["min"].round().astype(np.int64), out["max"].round().astype(np.int64)
    return out


class LeRobotWriter:
    """Append episodes to a new LeRobot v3.0 dataset at ``root``; ``finalize()`` publishes it."""

    def __init__(
        self,
        root: str | Path,
        fps: int,
        features: dict[str, dict[str, Any]],
        robot_type: str | None = None,
        video_codec: str | None = None,
        gop: int = 2,
        video_pix_fmt: str = "yuv420p",
        video_crf: int | None = None,
        data_files_size_in_mb: float = fmt.DATA_FILE_SIZE_MB,
        video_files_size_in_mb: float = fmt.VIDEO_FILE_SIZE_MB,
        chunks_size: int = fmt.CHUNKS_SIZE,
        overwrite: bool = False,
    ) -> None:
        self.root = Path(root)
        if self.root.exists() and not overwrite:
            raise ValueError(f"{self.root}: already exists (pass overwrite=True to replace it)")
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.fps, self.robot_type, self.gop, self.codec = int(fps), robot_type, gop, video_codec
        if video_pix_fmt not in PIX_FMTS:
            raise ValueError(f"video_pix_fmt must be one of {PIX_FMTS}, got {video_pix_fmt!r}")
        self.pix_fmt, self.crf = video_pix_fmt, video_crf
        self.features = {k: dict(v) for k, v in features.items() if k not in fmt.DEFAULT_FEATURES}
        for k, ft in self.features.items():
            if "/" in k:
                raise ValueError(f"feature name {k!r} must not contain '/'")
            if "dtype" not in ft or "shape" not in ft:
                raise ValueError(f"feature {k!r} needs 'dtype' and 'shape', got {ft}")
            ft["shape"] = [int(s) for s in ft["shape"]]
            ft.setdefault("names", None)
            if ft["dtype"] in ("video", "image") and (len(ft["shape"]) != 3 or ft["shape"][2] != 3):
                raise ValueError(f"feature {k!r}: images must have shape [H, W, 3], got {ft['shape']}")
            if ft["dtype"] not in ("video", "image"):
                fmt.arrow_type(ft)  # raises on unsupported dtypes/shapes
        self.video_keys = [k for k, f in self.features.items() if f["dtype"] == "video"]
        self.all_features = {**self.features, **fmt.DEFAULT_FEATURES}
        self.schema = fmt.data_schema(self.all_features)
        self.data_mb, self.video_mb, self.chunks_size = (
            data_files_size_in_mb,
            video_files_size_in_mb,
            chunks_size,
        )
        self.stage = self.root.with_name(self.root.name + ".partial")
        if self.stage.exists():
            shutil.rmtree(self.stage)
        self.stage.mkdir(parents=True)
        self.tasks: dict[str, int] = {}
        self.episodes: list[dict[str, Any]] = []
        self.total_frames = 0
        self.stats = {k: RunningStats([3] if f["dtype"] in ("video", "image") else f["shape"])
                      for k, f in self.all_features.items()}  # fmt: skip
        self._data_writer: pq.ParquetWriter | None = None
        self._data_pos, self._data_bytes = (0, 0), 0.0
        self._videos: dict[str, VideoEncoder] = {}
        self._video_pos = {k: (0, 0) for k in self.video_keys}
        self._frame_buffer: list[dict[str, Any]] = []
        self._closed = False

    # ------------------------------------------------------------------ LeRobot-style frame API
    def add_frame(self, frame: dict[str, Any], task: str | None = None) -> None:
        """Buffer one frame ({key: array}); ``task`` may also be given as ``frame["task"]``."""
        frame = dict(frame)
        t = frame.pop("task", task)
        if t is None:
            raise ValueError("add_frame needs a task (argument or frame['task'])")
        self._frame_buffer.append({"task": t, **frame})

    def save_episode(self) -> None:
        """Write the frames buffered by ``add_frame`` as one episode."""
        if not self._frame_buffer:
            raise ValueError("save_episode: no frames were added with add_frame")
        buf, self._frame_buffer = self._frame_buffer, []
        tasks = {f["task"] for f in buf}
        if len(tasks) != 1:
            raise ValueError(f"save_episode: an episode has one task, got {sorted(tasks)}")
        keys = [k for k in buf[0] if k != "task"]
        self.add_episode({k: np.stack([np.asarray(f[k]) for f in buf]) for k in keys}, task=buf[0]["task"])

    # ------------------------------------------------------------------ episodes
    def _validate(self, data: dict[str, Any], ep: int) -> tuple[dict[str, np.ndarray], int]:
        missing = sorted(set(self.features) - set(data))
        extra = sorted(set(data) - set(self.features))
        if missing or extra:
            raise ValueError(f"episode {ep}: missing keys {missing}, unexpected keys {extra}")
        out, length = {}, None
        for k, ft in self.features.items():
            x = np.asarray(data[k])
            if ft["dtype"] in ("video", "image"):
                if x.dtype != np.uint8:
                    raise ValueError(f"episode {ep}: {k} must be uint8 [T,H,W,3], got {x.dtype}")
                want = tuple(ft["shape"])
            else:
                if not np.issubdtype(x.dtype, np.number) and x.dtype != np.bool_:
                    raise ValueError(f"episode {ep}: {k} must be numeric, got {x.dtype}")
                x = x.astype(ft["dtype"], copy=False)
                want = tuple(ft["shape"]) if ft["shape"] != [1] else ()
                if x.ndim == 2 and ft["shape"] == [1] and x.shape[1] == 1:
                    x = x[:, 0]
            if x.shape[1:] != want:
                raise ValueError(f"episode {ep}: {k} has per-frame shape {x.shape[1:]}, expected {want}")
            if not np.issubdtype(x.dtype, np.integer) and x.dtype != np.bool_ and not np.isfinite(x).all():
                raise ValueError(f"episode {ep}: {k} contains NaN or inf")
            if length is not None and x.shape[0] != length:
                raise ValueError(f"episode {ep}: {k} has {x.shape[0]} frames, other keys have {length}")
            length = x.shape[0]
            out[k] = x
        if not length:
            raise ValueError(f"episode {ep}: has no frames")
        return out, length

    def add_episode(self, data: dict[str, Any], task: str) -> int:
        """Append one episode ({key: [T, ...]}) with its instruction; returns its episode index."""
        if self._closed:
            raise ValueError("writer is finalized")
        if not isinstance(task, str) or not task:
            raise ValueError("task must be a non-empty string")
        ep = len(self.episodes)
        arrays, length = self._validate(data, ep)
        task_index = self.tasks.setdefault(task, len(self.tasks))
        start = self.total_frames
        frame_index = np.arange(length, dtype=np.int64)
        arrays["timestamp"] = (frame_index / self.fps).astype(np.float32)
        arrays["frame_index"] = frame_index
        arrays["episode_index"] = np.full(length, ep, dtype=np.int64)
        arrays["index"] = np.arange(start, start + length, dtype=np.int64)
        arrays["task_index"] = np.full(length, task_index, dtype=np.int64)
        # Column order follows lerobot's meta/episodes files (checked against lerobot 0.4.4).
        row: dict[str, Any] = {"episode_index": ep, "tasks": [task], "length": length}
        row.update(self._write_data(arrays, length))
        row["dataset_from_index"], row["dataset_to_index"] = start, start + length
        for k in self.video_keys:
            row.update(self._write_video(k, arrays[k]))
        for k, ft in self.all_features.items():
            if ft["dtype"] in ("video", "image"):
                px = _image_sample(arrays[k])
                st = {s: v.reshape(3, 1, 1) if s != "count" else v for s, v in exact_stats(px).items()}
                st["count"] = np.array([length], dtype=np.int64)  # lerobot counts frames, not pixels
                self.stats[k].update(px)
            else:
                st = exact_stats(arrays[k].reshape(length, -1))
                self.stats[k].update(arrays[k].reshape(length, -1))
            for s, v in _lerobot_stats(st, ft["dtype"]).items():
                row[f"stats/{k}/{s}"] = v.tolist()
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = 0, 0
        self.episodes.append(row)
        self.total_frames += length
        return ep

    def _write_data(self, arrays: dict[str, np.ndarray], length: int) -> dict[str, int]:
        cols = []
        for name in self.schema.names:
            ft, x = self.all_features[name], arrays[name]
            typ = self.schema.field(name).type
            if ft["dtype"] == "image":
                cols.append(pa.array([{"bytes": encode_png(im), "path": None} for im in x], type=typ))
            elif pa.types.is_fixed_size_list(typ):
                cols.append(pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), typ.list_size))
            else:
                cols.append(pa.array(x, type=typ))
        table = pa.Table.from_arrays(cols, schema=self.schema)
        if self._data_writer is not None and self._data_bytes + table.nbytes > self.data_mb * 2**20:
            self._data_writer.close()
            self._data_writer, self._data_bytes = None, 0.0
            self._data_pos = fmt.next_chunk_file(*self._data_pos, self.chunks_size)
        if self._data_writer is None:
            path = self.stage / fmt.DATA_PATH.format(
                chunk_index=self._data_pos[0], file_index=self._data_pos[1]
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            self._data_writer = pq.ParquetWriter(path, self.schema, compression="snappy")
        self._data_writer.write_table(table)
        self._data_bytes += table.nbytes
        return {"data/chunk_index": self._data_pos[0], "data/file_index": self._data_pos[1]}

    def _write_video(self, key: str, frames: np.ndarray) -> dict[str, Any]:
        enc = self._videos.get(key)
        if enc is not None and enc.num_bytes > self.video_mb * 2**20:
            enc.close()
            enc = None
            self._video_pos[key] = fmt.next_chunk_file(*self._video_pos[key], self.chunks_size)
        if enc is None:
            c, f = self._video_pos[key]
            path = self.stage / fmt.VIDEO_PATH.format(video_key=key, chunk_index=c, file_index=f)
            path.parent.mkdir(parents=True, exist_ok=True)
            h, w, _ = self.features[key]["shape"]
            enc = self._videos[key] = VideoEncoder(
                path, self.fps, h, w, codec=self.codec, gop=self.gop, pix_fmt=self.pix_fmt, crf=self.crf
            )
        start = enc.num_frames
        enc.write(frames)
        c, f = self._video_pos[key]
        return {
            f"videos/{key}/chunk_index": c,
            f"videos/{key}/file_index": f,
            f"videos/{key}/from_timestamp": start / self.fps,
            f"videos/{key}/to_timestamp": (start + len(frames)) / self.fps,
        }

    # ------------------------------------------------------------------ finalize
    def _info(self) -> dict[str, Any]:
        feats = {}
        for k, ft in self.all_features.items():
            ft = dict(ft)
            if ft["dtype"] == "video":
                enc = self._videos[k]
                ft["info"] = {
                    "video.height": ft["shape"][0],
                    "video.width": ft["shape"][1],
                    "video.codec": {"libx264": "h264", "libsvtav1": "av1", "libopenh264": "h264"}.get(
                        enc.codec, enc.codec
                    ),
                    "video.pix_fmt": enc.pix_fmt,
                    "video.is_depth_map": False,
                    "video.fps": self.fps,
                    "video.channels": 3,
                    "has_audio": False,
                }
            feats[k] = ft
        return {
            "codebase_version": fmt.CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": len(self.episodes),
            "total_frames": self.total_frames,
            "total_tasks": len(self.tasks),
            "chunks_size": self.chunks_size,
            "data_files_size_in_mb": self.data_mb,
            "video_files_size_in_mb": self.video_mb,
            "fps": self.fps,
            "splits": {"train": f"0:{len(self.episodes)}"},
            "data_path": fmt.DATA_PATH,
            "video_path": fmt.VIDEO_PATH if self.video_keys else None,
            "features": feats,
        }

    def finalize(self) -> Path:
        """Close files, write meta/ (info, stats, tasks, episodes) and move the dataset into place."""
        if self._closed:
            raise ValueError("writer is already finalized")
        if self._frame_buffer:
            raise ValueError(f"{len(self._frame_buffer)} frames were added but save_episode() was not called")
        if not self.episodes:
            self.abort()
            raise ValueError(f"{self.root}: no episodes were added; nothing written")
        if self._data_writer is not None:
            self._data_writer.close()
        for enc in self._videos.values():
            enc.close()
        meta = self.stage / "meta"
        meta.mkdir(exist_ok=True)
        pq.write_table(fmt.tasks_table(list(self.tasks)), meta / "tasks.parquet")
        ep_path = self.stage / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0)
        ep_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(self.episodes), ep_path)
        stats = {k: s.result() for k, s in self.stats.items()}
        for k, ft in self.all_features.items():
            if ft["dtype"] in ("video", "image"):
                stats[k] = {s: v.reshape(3, 1, 1) if s != "count" else v for s, v in stats[k].items()}
                stats[k]["count"] = np.array([self.total_frames], dtype=np.int64)
            stats[k] = _lerobot_stats(stats[k], ft["dtype"])
        fmt.write_json_atomic(self.stage / fmt.STATS_PATH, stats_to_json(stats))
        fmt.write_json_atomic(self.stage / fmt.INFO_PATH, self._info())
        if self.root.exists():  # overwrite=True
            shutil.rmtree(self.root)
        self.stage.rename(self.root)
        self._closed = True
        return self.root

    def abort(self) -> None:
        """Drop everything written so far."""
        if self._data_writer is not None:
            self._data_writer.close()
        for enc in self._videos.values():
            with contextlib.suppress(Exception):  # the files are deleted anyway
                enc.close()
        shutil.rmtree(self.stage, ignore_errors=True)
        self._closed = True

    def __enter__(self) -> LeRobotWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not self._closed:
            self.abort()
        elif not self._closed:
            self.finalize()
