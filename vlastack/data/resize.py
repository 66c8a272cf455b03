"""A copy of a LeRobot v3 dataset whose videos are resized (``vla data resize``).

    resize_dataset("data/mt10", "data/mt10_128", size=128)

Why: a policy that cannot resize its own input (LeRobot's ACT has no resize field, and
lerobot-train decodes every frame at the stored size) trains at the size the dataset stores.
Meta-World's 480 px frames make ACT's ResNet18 cost ~8 CPU-s a step on 2 cores; a 128 px copy
lets it see what vlastack's policy sees, and at a fraction of the cost. The frames are resized
with ``fit_image`` (bilinear, antialiased), the same function vlastack's policy applies to every
frame at training and inference, so both policies see the same pixels. Served with
``scripts/lerobot_policy_server.py --resize 128``, the evaluator's 480 px frames go through the
same function before LeRobot's preprocessor.

``lossless=True`` (default) writes yuv444p H.264 at crf 0: a decoded frame is the resized frame up
to the RGB->YUV rounding (max error 1), so the copy adds no compression loss of its own.

Everything but the videos is copied unchanged: frame timestamps (each re-encoded frame keeps its
time), episodes, tasks, stats. The image statistics in ``meta/stats.json`` stay the full-size
frames' (per-channel means and stds; LeRobot's policies use ImageNet statistics by default and
vlastack's model does not normalise images with them). ``dst`` must not exist; a failed copy
removes its half-made folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import av
import numpy as np
import torch

from vlastack.data import format as fmt
from vlastack.data.edit import write_new_dataset
from vlastack.data.transforms import fit_image
from vlastack.data.video import VideoEncoder


def resize_video(src: Path, dst: Path, size: int, fps: int, lossless: bool = True, batch: int = 64) -> int:
    """Decode ``src`` in order, resize every frame to ``size`` x ``size`` and write ``dst`` at
    ``fps`` -> the number of frames. Frame i must sit at time i / fps (how our writer and LeRobot's
    lay episodes into one file); a frame elsewhere is a ValueError, since re-encoding would move it."""
    pix_fmt, crf = ("yuv444p", 0) if lossless else ("yuv420p", None)
    enc = VideoEncoder(dst, fps, size, size, pix_fmt=pix_fmt, crf=crf)
    n = 0
    buf: list[np.ndarray] = []
    try:
        with av.open(str(src)) as c:
            for f in c.decode(video=0):
                if f.time is None or abs(f.time * fps - n) > 1e-3:
                    raise ValueError(
                        f"{src}: frame {n} is at t={f.time}, not {n}/{fps} s: cannot re-encode it"
                    )
                buf.append(f.to_ndarray(format="rgb24"))
                n += 1
                if len(buf) == batch:
                    enc.write(_fit(buf, size))
                    buf.clear()
        if buf:
            enc.write(_fit(buf, size))
    finally:
        enc.close()
    if n == 0:
        raise ValueError(f"{src}: no frames")
    return n


def _fit(frames: list[np.ndarray], size: int) -> np.ndarray:
    """uint8 [H, W, 3] frames -> uint8 [T, size, size, 3] through ``fit_image``."""
    x = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)  # [T, 3, H, W]
    return fit_image(x, size).permute(0, 2, 3, 1).contiguous().numpy()


def resize_dataset(src: str | Path, dst: str | Path, size: int, lossless: bool = True) -> dict:
    """Write ``dst``: the dataset at ``src`` with every video feature at ``size`` px (module
    docstring) -> {video key: frames written}."""
    src, dst = Path(src), Path(dst)
    if not isinstance(size, int) or not 8 <= size <= 4096:
        raise ValueError(f"size must be an int in [8, 4096], got {size!r}")
    info = fmt.load_info(src)
    videos = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    if not videos:
        raise ValueError(f"{src}: has no video features to resize (features {sorted(info['features'])})")
    return write_new_dataset(dst, lambda tmp: _fill(src, tmp, info, videos, size, lossless), "resize_dataset")


def _fill(src: Path, tmp: Path, info: dict, videos: list[str], size: int, lossless: bool) -> dict:
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("videos"))
    frames: dict[str, int] = {}
    for key in videos:
        files = sorted((src / "videos" / key).glob("chunk-*/file-*.mp4"))
        if not files:
            raise ValueError(f"{src}: no video files for {key!r} under videos/{key}")
        for f in files:
            out = tmp / f.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            frames[key] = frames.get(key, 0) + resize_video(f, out, size, int(info["fps"]), lossless)
        ft = info["features"][key]
        names = ft.get("names") or ["height", "width", "channels"]
        ft["shape"] = [
            size if n in ("height", "width") else d for n, d in zip(names, ft["shape"], strict=True)
        ]
        vi = ft.setdefault("info", {})
        vi.update({"video.height": size, "video.width": size, "video.codec": "h264",
                   "video.pix_fmt": "yuv444p" if lossless else "yuv420p"})  # fmt: skip
    if sum(frames.values()) != len(videos) * int(info["total_frames"]):
        raise ValueError(
            f"{src}: the videos hold {frames} frames, info.json says {info['total_frames']} each"
        )
    fmt.write_json_atomic(tmp / fmt.INFO_PATH, info)
    return frames
