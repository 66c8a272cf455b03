"""``vla data check``: find what would spoil training, by key and episode, before training.

Checks a LeRobot v3 dataset for

- shape mismatches: a row whose value count differs from ``meta/info.json`` (the reader refuses
  these and names the file, episode and frame), statistics whose length differs from the feature;
- non-finite values (NaN/inf) in every low-dimensional float feature (state, action, ...), reported
  per key with the episodes and first frame affected;
- out-of-range statistics in ``meta/stats.json``: NaN/inf entries, negative std, min > max,
  q01 > q99, a mean outside [min, max]; and (a warning) data outside the recorded [min, max],
  i.e. stats that were computed for other data.

Cost: the reader already holds every low-dimensional column in memory, so the scan is one
vectorised pass over them (0.01 s for the test datasets; 0.5-0.6 s for two 32-float features over a
million frames, measured on a shared 2-core CPU); images and video frames are uint8 and are not decoded. ``vla train`` therefore runs the
full check once at start (``check_training_data``) and refuses to train on errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

STAT_ARRAYS = ("mean", "std", "min", "max", "q01", "q99")


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    key: str
    message: str
    episodes: tuple[int, ...] = ()

    def __str__(self) -> str:
        eps = ""
        if self.episodes:
            shown = ", ".join(map(str, self.episodes[:10]))
            eps = f" (episodes {shown}{', ...' if len(self.episodes) > 10 else ''})"
        return f"{self.level}: {self.key}: {self.message}{eps}"


def _check_stats(ds) -> list[Finding]:
    out: list[Finding] = []
    for key, st in ds.stats.items():
        ft = ds.features.get(key)
        if ft is None:
            out.append(Finding("warning", key, "meta/stats.json has stats for a feature info.json lacks"))
            continue
        for name, v in st.items():
            v = np.asarray(v, dtype=np.float64)
            if not np.isfinite(v).all():
                out.append(
                    Finding("error", key, f"meta/stats.json '{name}' has non-finite values {v.tolist()}")
                )
        if ft["dtype"] in ("video", "image", "string"):
            continue  # per-channel image stats have their own shape
        n = int(np.prod([int(s) for s in ft["shape"]]))
        for name in STAT_ARRAYS:
            if name in st and np.asarray(st[name]).size != n:
                out.append(
                    Finding(
                        "error",
                        key,
                        f"meta/stats.json '{name}' has {np.asarray(st[name]).size} values, "
                        f"the feature has shape {list(ft['shape'])}",
                    )
                )
        g = {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in st.items() if k in STAT_ARRAYS}
        g = {k: v for k, v in g.items() if v.size == n}  # wrong lengths are reported above
        with np.errstate(invalid="ignore"):
            if "std" in g and (g["std"] < 0).any():
                out.append(Finding("error", key, f"meta/stats.json std is negative: {g['std'].tolist()}"))
            if "min" in g and "max" in g and (g["min"] > g["max"]).any():
                out.append(Finding("error", key, "meta/stats.json min > max"))
            if "q01" in g and "q99" in g and (g["q01"] > g["q99"]).any():
                out.append(Finding("error", key, "meta/stats.json q01 > q99"))
            if {"mean", "min", "max"} <= set(g):
                span = 1e-6 + 1e-6 * np.abs(g["max"] - g["min"])
                if ((g["mean"] < g["min"] - span) | (g["mean"] > g["max"] + span)).any():
                    out.append(Finding("error", key, "meta/stats.json mean lies outside [min, max]"))
    return out


def _check_columns(ds) -> list[Finding]:
    out: list[Finding] = []
    ep_index = np.array([int(e["episode_index"]) for e in ds.episodes])
    for key, col in ds.columns.items():
        if col.dtype.kind != "f" or key == "timestamp":
            continue
        flat = col.reshape(len(col), -1)
        finite = np.isfinite(flat)
        bad_rows = ~finite.all(1)
        if bad_rows.any():
            eps = np.unique(ds.ep_of[bad_rows])
            first = int(np.nonzero(bad_rows)[0][0])
            k = int(ds.ep_of[first])
            frame = first - int(ds.ep_start[k])
            dims = sorted({int(d) for d in np.nonzero(~finite[first])[0]})
            out.append(
                Finding(
                    "error",
                    key,
                    f"{int((~finite).sum())} non-finite values (NaN/inf) in {int(bad_rows.sum())} frames; "
                    f"first at episode {ep_index[k]} frame {frame}, dims {dims[:8]}",
                    tuple(int(e) for e in ep_index[eps]),
                )
            )
        st = ds.stats.get(key, {})
        if "min" in st and "max" in st and finite.any():
            lo = np.asarray(st["min"], dtype=np.float64).reshape(-1)
            hi = np.asarray(st["max"], dtype=np.float64).reshape(-1)
            if lo.size != flat.shape[1] or hi.size != flat.shape[1]:
                continue  # reported by _check_stats
            x = flat if not bad_rows.any() else np.where(finite, flat, np.nan)
            tol = 1e-4 * (np.abs(hi - lo) + 1.0)
            dmin, dmax = np.nanmin(x, 0).astype(np.float64), np.nanmax(x, 0).astype(np.float64)
            if (dmin < lo - tol).any() or (dmax > hi + tol).any():  # only then find the frames
                with np.errstate(invalid="ignore"):
                    rows = ((x < lo - tol) | (x > hi + tol)).any(1)
                eps = np.unique(ds.ep_of[rows])
                out.append(
                    Finding(
                        "warning",
                        key,
                        f"{int(rows.sum())} frames lie outside meta/stats.json [min, max] "
                        f"(data {dmin.min():.4g}..{dmax.max():.4g}): the stats were computed on other "
                        "data; recompute them",
                        tuple(int(e) for e in ep_index[eps]),
                    )
                )
    return out


def check_lerobot(ds) -> list[Finding]:
    """All findings for an opened ``LeRobotDataset`` (errors first)."""
    found = _check_stats(ds) + _check_columns(ds)
    return sorted(found, key=lambda f: f.level != "error")


def check_dataset(root: str | Path) -> list[Finding]:
    """Open and check the dataset at ``root``; a dataset the reader refuses is one error finding."""
    from vlastack.data.reader import LeRobotDataset

    try:
        ds = LeRobotDataset(root)
    except ValueError as e:  # shape mismatches, missing columns, bad metadata: the reader names them
        return [Finding("error", "dataset", str(e))]
    return check_lerobot(ds)


def check_training_data(dataset) -> list[str]:
    """Run the check on the LeRobot dataset behind a training dataset; ``ValueError`` listing the
    errors, else the warnings as strings. Datasets not backed by LeRobot files are not checked."""
    ds = getattr(dataset, "ds", None) or getattr(getattr(dataset, "base", None), "ds", None)
    if ds is None or not hasattr(ds, "columns"):
        return []
    found = check_lerobot(ds)
    errors = [str(f) for f in found if f.level == "error"]
    if errors:
        raise ValueError(
            f"{ds.root}: the dataset check failed, refusing to train:\n  "
            + "\n  ".join(errors[:10])
            + f"\n(`vla data check {ds.root}` prints the full report)"
        )
    return [f"data check: {f}" for f in found]
