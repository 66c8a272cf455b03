"""Resumable evaluation: every finished episode is appended to ``<out>/eval.partial.jsonl``.

A Meta-World MT50 evaluation (500 episodes of up to 500 steps, each rendering a 480 px frame per
step) takes hours on a 2-core CPU; a machine taken back, a SIGTERM or a Ctrl-C used to lose all of
it. ``vla eval --out DIR`` now writes each episode's record as it finishes (one JSON line, flushed)
under a header holding a fingerprint of what decides the results: the policy (its folder's files:
name, size, mtime; a served policy's host and server metadata, not its port), the environment and
execution settings and the exact episode list (task, seed, recorded or not). ``vla eval ...
--resume`` with the same settings runs only the episodes the journal lacks, and the eval.json it
writes is the one an uninterrupted run writes (the same episodes, seeds and records;
``resumed_episodes`` says how many came from the journal). Another policy or setting is refused,
not mixed in. Without ``--resume`` a journal left behind is replaced (the message says how many
episodes ``--resume`` would have kept).

Videos: an episode recorded for a video has its mp4 encoded as soon as it finishes (into
``videos/.candidates/``; the frames are then dropped), so episodes from an earlier segment keep
their videos; ``write_videos`` then picks among the candidates as it picks among frames.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from vlastack.folderlock import FolderLock

JOURNAL = "eval.partial.jsonl"
CANDIDATES = ".candidates"


def video_name(r: dict) -> str:
    """``ep0003_push_success.mp4``: the file name of episode ``r``'s video."""
    tag = "success" if r["success"] else "failure"
    return f"ep{r['episode']:04d}_{r['task'].replace('/', '_')}_{tag}.mp4"


def encode_video(frames: np.ndarray, path: Path, fps: int) -> None:
    """uint8 [T, H, W, 3] frames -> an H.264 mp4 at ``path`` (tiny frames upscaled to ~256 px)."""
    from vlastack.data.video import VideoEncoder

    scale = max(1, 256 // frames.shape[1])  # upscale tiny frames so the video is watchable
    f = np.ascontiguousarray(frames.repeat(scale, 1).repeat(scale, 2))
    enc = VideoEncoder(path, fps=min(30, fps), height=f.shape[1] // 2 * 2, width=f.shape[2] // 2 * 2, gop=10)
    enc.write(f[:, : enc.height, : enc.width])
    enc.close()


def _plain(o: Any) -> Any:
    """numpy scalars (a task's extras) as Python numbers; anything else by its str."""
    return o.item() if isinstance(o, np.generic) else str(o)


def fingerprint(settings: dict[str, Any]) -> str:
    """A stable hash of the JSON form of ``settings`` (tuples as lists, other objects by str)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:32]


class EvalJournal:
    """The episodes of one evaluation into ``out``, one JSON line each, resumable.

    ``done``: episode index -> record, read back on ``resume``; ``add(record)`` appends one (thread
    safe: worker results arrive on the pool's thread); ``finish()`` removes the journal once
    eval.json is written."""

    def __init__(self, out: Path, settings: dict[str, Any], resume: bool, fps: int) -> None:
        self.out, self.fps = Path(out), fps
        self.path = self.out / JOURNAL
        self.candidates = self.out / "videos" / CANDIDATES
        self.done: dict[int, dict] = {}
        self.prior_s = 0.0  # evaluation time of the earlier segments (to their last finished episode)
        self._lock = threading.Lock()
        # One evaluation per folder: a second into the same --out would interleave its journal
        # lines with this one's and overwrite its eval.json; it is refused with this one's pid.
        self._owner = FolderLock(self.out / ".lock", "vla eval", f"evaluation folder {self.out}",
                                 "wait for that evaluation to finish, stop it, or pass another --out")  # fmt: skip
        self._owner.acquire()
        try:
            self._open(settings, resume)
        except BaseException:
            self._owner.release()
            raise

    def _open(self, settings: dict[str, Any], resume: bool) -> None:
        """Read back a journal to resume (or replace it), then open it for appending."""
        key = fingerprint(settings)
        lines = self._read() if self.path.is_file() else []
        if lines and resume:
            if lines[0].get("fingerprint") != key:
                raise ValueError(
                    f"{self.path} holds a partial evaluation of another policy or with other settings "
                    f"({len(lines) - 1} episodes); run without --resume to start over, or pass the "
                    "same policy and settings"
                )
            for line in lines[1:]:
                r = line["result"]
                if "video" in r and not Path(r["video"]).is_file():
                    r.pop("video")  # a candidate lost with its folder: no video for that episode
                self.done[int(r["episode"])] = r
                self.prior_s = max(self.prior_s, float(line.get("elapsed_s", 0.0)))
        elif lines:
            print(f"note: {self.path} held {len(lines) - 1} episodes of an unfinished evaluation; starting "
                  "over (`--resume` continues one)", file=sys.stderr)  # fmt: skip
        if not self.done:
            shutil.rmtree(self.candidates, ignore_errors=True)
        self.out.mkdir(parents=True, exist_ok=True)
        # Rewrite what was read (a line cut by a kill is dropped), then append.
        keep = [{"fingerprint": key, "version": 1}] + (lines[1:] if self.done else [])
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(x) + "\n" for x in keep))
        tmp.replace(self.path)
        self._f = self.path.open("a")
        self._t0 = time.perf_counter()

    def _read(self) -> list[dict]:
        out = []
        for raw in self.path.read_text().splitlines():
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError:
                break  # the last line of a killed run, half written
        return out

    def add(self, r: dict) -> dict:
        """Journal episode record ``r`` (its frames, if any, become a candidate video); returns it."""
        if "frames" in r:
            path = self.candidates / video_name(r)
            try:
                self.candidates.mkdir(parents=True, exist_ok=True)
                encode_video(r["frames"], path, self.fps)
            except Exception as e:  # e.g. a full disk: the frames stay, for a video at the end
                warnings.warn(f"could not write {path} ({e}); its episode keeps its frames in memory",
                              stacklevel=2)  # fmt: skip
            else:
                del r["frames"]
                r["video"] = str(path)
        line = {"elapsed_s": round(self.prior_s + time.perf_counter() - self._t0, 3),
                "result": {k: v for k, v in r.items() if k != "frames"}}  # fmt: skip
        with self._lock:
            self._f.write(json.dumps(line, default=_plain) + "\n")
            self._f.flush()
        return r

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
        self._owner.release()

    def finish(self) -> None:
        """The evaluation is written: drop the journal and the unpicked candidate videos."""
        self.close()
        self.path.unlink(missing_ok=True)
        shutil.rmtree(self.candidates, ignore_errors=True)
