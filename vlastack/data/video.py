"""MP4 encode/decode with PyAV, built for random access by timestamp.

``VideoEncoder`` appends frames (of many episodes) to one mp4 with a short GOP, so any frame is at
most ``gop - 1`` decodes away from a keyframe. ``VideoReader`` keeps the container open, indexes
packet timestamps once (demux only, no decode), and serves ``frames_at(times)`` by seeking to the
keyframe before the first requested frame and decoding forward; if the decoder is already
positioned before the target inside the same stretch it just keeps decoding, so sorted requests
(see ``LeRobotDataset.__getitems__``) rarely seek. Frames come out uint8 [H, W, 3], optionally
resized by swscale in the same pass as the YUV->RGB conversion.
"""

from __future__ import annotations

from collections import OrderedDict
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from av.video.reformatter import VideoReformatter


def pick_codec(preferred: str | None = None) -> str:
    """H.264 (fast to decode, plays everywhere) unless ``preferred`` names another available one."""
    avail = av.codecs_available
    for c in ([preferred] if preferred else []) + ["libx264", "libsvtav1", "libopenh264", "mpeg4"]:
        if c in avail:
            return c
    raise RuntimeError("PyAV has no usable video encoder (tried libx264, libsvtav1, libopenh264, mpeg4)")


PIX_FMTS = ("yuv420p", "yuv444p")


class VideoEncoder:
    """Write uint8 [H, W, 3] frames at ``fps`` into ``path``; frame i gets pts i (time i / fps).

    ``pix_fmt="yuv420p"`` (the LeRobot default) stores color at half resolution: at 64 px a 5 cm
    block is ~8 px wide and its edges change color by up to ~190/255 after decoding, a shift
    between training frames and the raw frames a simulator policy sees. ``"yuv444p"`` keeps full
    color resolution; with ``crf=0`` H.264 is lossless (``max |error| <= 1`` from the RGB->YUV
    rounding) for ~1.8x the bytes (the demo's 64 px data: 68 vs 37 MB).
    """

    def __init__(
        self,
        path: str | Path,
        fps: int,
        height: int,
        width: int,
        codec: str | None = None,
        gop: int = 2,
        pix_fmt: str = "yuv420p",
        crf: int | None = None,
    ) -> None:
        if pix_fmt not in PIX_FMTS:
            raise ValueError(f"pix_fmt must be one of {PIX_FMTS}, got {pix_fmt!r}")
        if crf is not None and not 0 <= crf <= 63:
            raise ValueError(f"crf must be in [0, 63] (0 = lossless for H.264), got {crf}")
        self.path = Path(path)
        self.codec = pick_codec(codec)
        supported = av.codec.Codec(self.codec, "w").video_formats or ()
        if supported and pix_fmt not in {f.name for f in supported}:
            raise ValueError(f"video codec {self.codec} cannot encode pix_fmt {pix_fmt!r}")
        self.pix_fmt = pix_fmt
        self.container = av.open(str(self.path), mode="w")
        self.stream = self.container.add_stream(self.codec, rate=Fraction(fps).limit_denominator(1001))
        self.stream.width, self.stream.height = width, height
        self.stream.pix_fmt = pix_fmt
        self.stream.codec_context.time_base = Fraction(1, fps)
        opts = {"g": str(gop), "bf": "0"}
        if self.codec == "libx264":
            # No scene-cut keyframes: GOPs stay exactly `gop` long. fastdecode (no CABAC/deblock)
            # decodes ~40% faster for ~40% more bytes: training reads each frame many times.
            opts.update(crf=str(23 if crf is None else crf), preset="veryfast", tune="fastdecode")
            opts["x264-params"] = "scenecut=0"
        elif self.codec == "libsvtav1":
            opts.update(crf=str(30 if crf is None else crf), preset="12")
        self.stream.options = opts
        self.height, self.width = height, width
        self.num_frames = 0
        self.num_bytes = 0  # muxed so far (the file on disk lags behind by the IO buffer)

    def write(self, frames: np.ndarray) -> None:
        """frames: uint8 [T, H, W, 3]."""
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != (self.height, self.width, 3):
            raise ValueError(
                f"{self.path}: frames must be uint8 [T, {self.height}, {self.width}, 3], "
                f"got {frames.dtype} {tuple(frames.shape)}"
            )
        for img in frames:
            f = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            f.pts = self.num_frames
            f.time_base = self.stream.codec_context.time_base
            for pkt in self.stream.encode(f):
                self.num_bytes += pkt.size
                self.container.mux(pkt)
            self.num_frames += 1

    def close(self) -> None:
        for pkt in self.stream.encode(None):
            self.container.mux(pkt)
        self.container.close()


class VideoReader:
    """Random access to the frames of one video file by timestamp (seconds).

    Decoded frames of the recent past are kept in a small LRU cache keyed by pts, so the frames
    of one action chunk / sorted batch are decoded once.
    """

    def __init__(self, path: str | Path, threads: int = 1, cache_frames: int = 16) -> None:
        self.path = Path(path)
        try:
            self.container = av.open(str(self.path))
            self.stream = self.container.streams.video[0]
        except (av.error.FFmpegError, IndexError) as e:
            raise ValueError(f"{self.path}: cannot open video ({e})") from None
        self.stream.thread_count = max(1, threads)
        self.stream.thread_type = "SLICE" if threads > 1 else "NONE"
        self.time_base = float(self.stream.time_base)
        pts, key = [], []
        try:
            for pkt in self.container.demux(self.stream):
                if pkt.pts is not None:
                    pts.append(pkt.pts)
                    key.append(pkt.is_keyframe)
        except av.error.FFmpegError as e:
            raise ValueError(f"{self.path}: corrupt or truncated video ({e})") from None
        if not pts:
            raise ValueError(f"{self.path}: video has no frames (truncated or empty file)")
        order = np.argsort(pts, kind="stable")
        self.pts = np.asarray(pts, dtype=np.int64)[order]
        self.key = np.asarray(key, dtype=bool)[order]
        self.key[0] = True  # decoding always starts cleanly at the first packet
        self.times = self.pts * self.time_base
        self._it = None  # live frame iterator after a seek
        self._last_pts = None  # pts of the last frame the iterator produced
        self._cache: OrderedDict[int, av.VideoFrame] = OrderedDict()
        self._cache_size = cache_frames
        self._reformatter = VideoReformatter()

    def __len__(self) -> int:
        return len(self.pts)

    def nearest(self, t: float, tolerance_s: float) -> int:
        """Index of the frame nearest to ``t``; ``ValueError`` if none is within ``tolerance_s``."""
        i = int(np.searchsorted(self.times, t))
        cands = [j for j in (i - 1, i) if 0 <= j < len(self.times)]
        j = min(cands, key=lambda j: abs(self.times[j] - t))
        if abs(self.times[j] - t) > tolerance_s:
            raise ValueError(
                f"{self.path}: no frame within {tolerance_s}s of t={t:.6f}s (nearest {self.times[j]:.6f}s; "
                f"video has {len(self.times)} frames spanning {self.times[0]:.3f}..{self.times[-1]:.3f}s)"
            )
        return j

    def _decode_to(self, j: int) -> av.VideoFrame:
        target = int(self.pts[j])
        k = j
        while not self.key[k]:
            k -= 1
        # Keep decoding forward if the decoder sits between the target's keyframe and the target.
        if self._it is None or self._last_pts is None or not (int(self.pts[k]) <= self._last_pts < target):
            self.container.seek(int(self.pts[k]), stream=self.stream, backward=True, any_frame=False)
            self._it = self.container.decode(self.stream)
            self._last_pts = None
        try:
            for frame in self._it:
                if frame.pts is None:
                    continue
                self._last_pts = frame.pts
                # Frames stay in YUV until asked for: RGB conversion costs as much as decoding.
                self._put(int(frame.pts), frame)
                if frame.pts >= target:
                    if frame.pts == target:
                        return frame
                    break
        except av.error.FFmpegError as e:
            self._it = None
            raise ValueError(f"{self.path}: decode error near t={self.times[j]:.3f}s ({e})") from None
        self._it = None
        raise ValueError(f"{self.path}: frame at t={self.times[j]:.6f}s could not be decoded (truncated?)")

    def _put(self, key: int, frame: av.VideoFrame) -> None:
        self._cache[key] = frame
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def frame_at(
        self, t: float, tolerance_s: float = 1e-4, size: tuple[int, int] | None = None
    ) -> np.ndarray:
        """uint8 [H, W, 3] (or [size[0], size[1], 3]) of the frame at time ``t``."""
        j = self.nearest(t, tolerance_s)
        frame = self._cache.get(int(self.pts[j]))
        if frame is None:
            frame = self._decode_to(j)
        h, w = size if size is not None else (None, None)
        # One reformatter (= one cached SwsContext) per reader: a fresh one per frame costs ~1 ms.
        rgb = self._reformatter.reformat(frame, width=w, height=h, format="rgb24", interpolation="BILINEAR")
        return rgb.to_ndarray()

    def close(self) -> None:
        self._it = None
        self.container.close()


def read_all_frames(path: str | Path) -> np.ndarray:
    """Every frame of a file, uint8 [T, H, W, 3] (for tools and tests, not the training path)."""
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
