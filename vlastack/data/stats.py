"""Feature statistics in one streaming pass, and the ``Normalizer`` built from them.

``RunningStats`` merges batches exactly for count/mean/std/min/max (Chan et al.'s parallel
update) and keeps a per-dimension histogram for quantiles. The histogram has ``bins`` equal bins
whose range grows by doubling, so old bins merge pairwise without re-binning error. A quantile
is read by linear interpolation inside its bin, so its error is at most one bin width, i.e.
``<= 2 * (max - min) / bins`` (about 0.05% of the range at the default 4096 bins), and it is
clamped to [min, max]; a constant dimension gets its exact value.

``Normalizer`` modes per key: ``mean_std`` ((x - mean) / (std + eps)), ``min_max`` and
``quantiles`` (min/max or q01/q99 mapped to [-1, 1]; ``quantiles`` clips to [-1, 1]),
``identity``. ``unnormalize`` is the exact inverse of ``normalize`` inside the clip range.
Works on numpy arrays and torch tensors (any device), trailing dim = feature dim.

``ExactNormalizer`` is LeRobot's or openpi's normalization (their formulas and eps, no clipping), for
imported checkpoints and for fine-tuning that keeps a checkpoint's statistics. ``load_normalizer``
reads either kind from ``norm_stats.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlastack.fileio import read_json

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
MODES = ("mean_std", "min_max", "quantiles", "identity")
EXACT_MODES = ("mean_std", "quantiles", "identity")
NORM_STATS = "norm_stats.json"  # the file beside a policy's weights
EPS = 1e-8


class RunningStats:
    """Streaming stats of samples of shape ``shape`` (update with arrays [N, *shape])."""

    def __init__(self, shape: tuple[int, ...] | list[int], bins: int = 4096) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dim = int(np.prod(self.shape)) if self.shape else 1
        self.bins = bins
        self.count = 0
        self.mean = np.zeros(self.dim)
        self.m2 = np.zeros(self.dim)
        self.min = np.full(self.dim, np.inf)
        self.max = np.full(self.dim, -np.inf)
        self.lo = np.zeros(self.dim)
        self.width = np.zeros(self.dim)  # 0 = histogram not started
        self.hist = np.zeros((self.dim, bins), dtype=np.int64)

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64).reshape(-1, self.dim)
        if x.shape[0] == 0:
            return
        if not np.isfinite(x).all():
            raise ValueError("statistics input contains NaN or inf")
        n, bmean = x.shape[0], x.mean(0)
        bm2 = ((x - bmean) ** 2).sum(0)
        delta, tot = bmean - self.mean, self.count + n
        self.mean = self.mean + delta * n / tot
        self.m2 = self.m2 + bm2 + delta**2 * self.count * n / tot
        self.count = tot
        self.min, self.max = np.minimum(self.min, x.min(0)), np.maximum(self.max, x.max(0))
        self._histogram(x)

    def _histogram(self, x: np.ndarray) -> None:
        new = self.width == 0
        if new.any():
            lo, hi = self.min[new], self.max[new]
            span = np.maximum(hi - lo, np.maximum(np.abs(lo), 1.0) * 1e-6)
            self.lo[new], self.width[new] = lo, span * (1 + 1e-9) / self.bins
        for d in np.nonzero((self.min < self.lo) | (self.max >= self.lo + self.width * self.bins))[0]:
            self._grow(d)
        idx = np.clip(((x - self.lo) / self.width).astype(np.int64), 0, self.bins - 1)
        flat = idx + np.arange(self.dim) * self.bins
        self.hist += np.bincount(flat.ravel(), minlength=self.dim * self.bins).reshape(self.dim, self.bins)

    def _grow(self, d: int) -> None:
        """Double dimension d's range (merging bin pairs exactly) until it covers [min, max]."""
        b = self.bins
        while self.min[d] < self.lo[d] or self.max[d] >= self.lo[d] + self.width[d] * b:
            merged = self.hist[d].reshape(b // 2, 2).sum(1)
            h = np.zeros(b, dtype=np.int64)
            if self.min[d] < self.lo[d]:  # extend to the left: old range becomes the right half
                h[b // 2 :] = merged
                self.lo[d] -= self.width[d] * b
            else:
                h[: b // 2] = merged
            self.hist[d], self.width[d] = h, self.width[d] * 2

    def quantile(self, q: float) -> np.ndarray:
        cdf = np.cumsum(self.hist, axis=1)
        target = q * self.count
        out = np.empty(self.dim)
        for d in range(self.dim):
            i = int(np.searchsorted(cdf[d], target, side="left"))
            i = min(i, self.bins - 1)
            before = cdf[d, i - 1] if i > 0 else 0
            frac = (target - before) / max(self.hist[d, i], 1)
            out[d] = self.lo[d] + (i + min(max(frac, 0.0), 1.0)) * self.width[d]
        return np.clip(out, self.min, self.max)

    def result(self) -> dict[str, np.ndarray]:
        """{mean, std, min, max, count, q01..q99}, each shaped like the sample (count: [1])."""
        if self.count == 0:
            raise ValueError("no samples were added")
        std = np.sqrt(np.maximum(self.m2 / self.count, 0.0))
        out = {"mean": self.mean, "std": std, "min": self.min, "max": self.max}
        out.update({k: self.quantile(q) for k, q in QUANTILES.items()})
        out = {k: v.reshape(self.shape) for k, v in out.items()}
        out["count"] = np.array([self.count], dtype=np.int64)
        return out


def exact_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """Exact stats of x [N, *shape] (used per episode, where the data fits in memory)."""
    x = np.asarray(x, dtype=np.float64)
    out = {"mean": x.mean(0), "std": x.std(0), "min": x.min(0), "max": x.max(0)}
    qs = np.quantile(x, list(QUANTILES.values()), axis=0)
    out.update({k: qs[i] for i, k in enumerate(QUANTILES)})
    out["count"] = np.array([x.shape[0]], dtype=np.int64)
    return out


def stats_to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    return {k: {s: np.asarray(v).tolist() for s, v in d.items()} for k, d in stats.items()}


def stats_from_json(data: dict) -> dict[str, dict[str, np.ndarray]]:
    return {k: {s: np.asarray(v, dtype=np.float64) for s, v in d.items()} for k, d in data.items()}


class Normalizer:
    """Per-key normalization. ``modes``: key -> mode; ``stats``: key -> stats dict (numpy)."""

    def __init__(self, stats: dict[str, dict[str, Any]], modes: dict[str, str]) -> None:
        self.modes = dict(modes)
        self.stats = {k: {s: np.asarray(v, dtype=np.float64) for s, v in d.items()} for k, d in stats.items()}
        self._params: dict[str, tuple[np.ndarray, np.ndarray, bool]] = {}
        for key, mode in self.modes.items():
            if mode not in MODES:
                raise ValueError(f"normalization mode for {key!r} must be one of {MODES}, got {mode!r}")
            if mode == "identity":
                continue
            if key not in self.stats:
                raise ValueError(f"no statistics for {key!r} (have: {sorted(self.stats)}); cannot use {mode}")
            st = self.stats[key]
            names = {"mean_std": ("mean", "std"), "min_max": ("min", "max"), "quantiles": ("q01", "q99")}[
                mode
            ]
            missing = [n for n in names if n not in st]
            if missing:
                raise ValueError(f"statistics for {key!r} lack {missing}, needed by mode {mode!r}")
            a, b = (st[n].reshape(-1) for n in names)
            if mode == "mean_std":  # y = (x - mean) / (std + eps)
                shift, scale = a, b + EPS
            else:  # y = 2 (x - lo) / (hi - lo + eps) - 1  ==  (x - center) / half_range
                shift, scale = (a + b) / 2, (b - a + EPS) / 2
            self._params[key] = (shift, scale, mode == "quantiles")

    def _get(self, key: str, x: Any) -> tuple[Any, Any, bool] | None:
        if key not in self._params:
            if self.modes.get(key, "identity") == "identity":
                return None
            raise KeyError(key)
        shift, scale, clip = self._params[key]
        d = x.shape[-1]
        if d != shift.shape[0]:
            raise ValueError(f"{key}: last dim {d} does not match its statistics ({shift.shape[0]} dims)")
        if isinstance(x, torch.Tensor):
            return (
                torch.as_tensor(shift, dtype=x.dtype, device=x.device),
                torch.as_tensor(scale, dtype=x.dtype, device=x.device),
                clip,
            )
        return shift.astype(x.dtype, copy=False), scale.astype(x.dtype, copy=False), clip

    def normalize(self, key: str, x: Any) -> Any:
        """x [..., D] (numpy or torch) -> normalized, same type/dtype/device."""
        p = self._get(key, x)
        if p is None:
            return x
        shift, scale, clip = p
        y = (x - shift) / scale
        if clip:
            y = y.clamp(-1, 1) if isinstance(y, torch.Tensor) else np.clip(y, -1, 1)
        return y

    def unnormalize(self, key: str, y: Any) -> Any:
        p = self._get(key, y)
        if p is None:
            return y
        shift, scale, _ = p
        return y * scale + shift

    def to_dict(self) -> dict[str, Any]:
        keys = [k for k, m in self.modes.items() if m != "identity"]
        return {"modes": self.modes, "stats": stats_to_json({k: self.stats[k] for k in keys})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Normalizer:
        if not isinstance(data, dict) or "modes" not in data or "stats" not in data:
            raise ValueError("normalizer dict must have 'modes' and 'stats'")
        return cls(stats_from_json(data["stats"]), data["modes"])

    def save(self, path: str | Path) -> None:
        """Write ``norm_stats.json`` (atomic: temp file then rename)."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> Normalizer:
        return cls.from_dict(read_json(path))


@dataclass
class ExactNormalizer:
    """LeRobot's (``style="lerobot"``) or openpi's (``style="openpi"``) state/action normalization,
    in float32 torch with the same operation order. Same interface as ``data.stats.Normalizer``
    for what ``Policy`` uses (``modes``, ``stats``, ``normalize``, ``unnormalize``)."""

    modes: dict[str, str]
    stats: dict[str, dict[str, np.ndarray]]
    style: str = "lerobot"
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.style not in ("lerobot", "openpi"):
            raise ValueError(f"normalizer style must be 'lerobot' or 'openpi', got {self.style!r}")
        need = {"mean_std": ("mean", "std"), "quantiles": ("q01", "q99"), "identity": ()}
        for key, mode in self.modes.items():
            if mode not in EXACT_MODES:
                raise ValueError(f"{key}: normalization mode {mode!r} is not supported ({EXACT_MODES})")
            lacking = [n for n in need[mode] if n not in self.stats.get(key, {})]
            if lacking:
                raise ValueError(f"{key}: mode {mode} needs statistics {lacking}")
        self.stats = {
            k: {s: np.asarray(v, dtype=np.float32) for s, v in d.items()} for k, d in self.stats.items()
        }

    def _t(self, key: str, name: str, x: torch.Tensor) -> torch.Tensor:
        v = torch.from_numpy(self.stats[key][name])
        if v.shape[-1] != x.shape[-1]:
            raise ValueError(f"{key}: last dim {x.shape[-1]} does not match its statistics ({v.shape[-1]})")
        return v.to(x.device)

    def _apply(self, key: str, x, inverse: bool):
        mode = self.modes.get(key, "identity")
        if mode == "identity":
            return x
        is_np = isinstance(x, np.ndarray)
        t = torch.from_numpy(np.asarray(x, dtype=np.float32)) if is_np else x.float()
        if mode == "mean_std":
            mean, std = self._t(key, "mean", t), self._t(key, "std", t)
            if self.style == "openpi":
                y = t * (std + 1e-6) + mean if inverse else (t - mean) / (std + 1e-6)
            else:
                y = t * std + mean if inverse else (t - mean) / (std + self.eps)
        else:
            q01, q99 = self._t(key, "q01", t), self._t(key, "q99", t)
            if self.style == "openpi":
                d = q99 - q01 + 1e-6
                y = (t + 1.0) / 2.0 * d + q01 if inverse else (t - q01) / d * 2.0 - 1.0
            else:
                d = q99 - q01
                d = torch.where(d == 0, torch.tensor(self.eps, dtype=d.dtype), d)
                y = (t + 1.0) * d / 2.0 + q01 if inverse else 2.0 * (t - q01) / d - 1.0
        return y.numpy() if is_np else y

    def normalize(self, key: str, x):
        return self._apply(key, x, inverse=False)

    def unnormalize(self, key: str, y):
        return self._apply(key, y, inverse=True)

    def to_dict(self) -> dict:
        return {
            "style": self.style,
            "eps": self.eps,
            "modes": self.modes,
            "stats": {k: {s: v.tolist() for s, v in d.items()} for k, d in self.stats.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> ExactNormalizer:
        return cls(d["modes"], d["stats"], d.get("style", "lerobot"), d.get("eps", 1e-8))

    def save(self, path: str | Path) -> None:
        """Write ``norm_stats.json`` (atomic); ``load_normalizer`` reads it back as this class."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2))
        tmp.replace(path)


def stat_dim(normalizer: Normalizer | ExactNormalizer, key: str) -> int | None:
    """The feature dim of ``key``: the length of its statistics, or None (identity, no statistics)."""
    stats = normalizer.stats.get(key) if normalizer.modes.get(key, "identity") != "identity" else None
    if not stats:
        return None
    return int(np.asarray(next(iter(stats.values()))).reshape(-1).shape[0])


def load_normalizer(path: str | Path) -> Normalizer | ExactNormalizer:
    """``norm_stats.json`` -> the normalizer that wrote it (an ``ExactNormalizer`` names its style)."""
    data = read_json(path)
    if isinstance(data, dict) and "style" in data:
        try:
            return ExactNormalizer.from_dict(data)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a valid normalizer file ({e})") from e
    try:
        return Normalizer.from_dict(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
