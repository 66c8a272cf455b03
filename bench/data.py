"""Data-loading throughput: samples/s for 0/1/2 workers, mp4 vs inline PNG, time split.

    .venv/bin/python bench/data.py [--episodes 40 --length 100 --batches 30]

Synthetic dataset: 2 cameras at 224x224 (moving shapes over gradients, like rendered scenes),
8-d state, 7-d action; samples for the `small` preset (2 cameras, 224 px, 50-step action chunk).
Writes bench/results/data.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import default_collate

from vlastack.config import load_config
from vlastack.data.lerobot import LeRobotWriter
from vlastack.data.loader import build_dataloader
from vlastack.data.samples import VLADataset

CAMS = ("base_0_rgb", "left_wrist_0_rgb")


def frames(t: int, ep: int, cam: int, size: int = 224) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size]
    out = np.empty((t, size, size, 3), np.uint8)
    for s in range(t):
        img = out[s]
        img[..., 0] = (xx + 3 * s + 40 * ep) % 256
        img[..., 1] = (yy * 2 + 17 * cam) % 256
        img[..., 2] = 96
        cx, cy = int(112 + 80 * np.sin(s / 10 + ep)), int(112 + 80 * np.cos(s / 7 + cam))
        img[max(0, cy - 18) : cy + 18, max(0, cx - 18) : cx + 18] = (230, 40, 40)
    return out


def make(root: Path, dtype: str, episodes: int, length: int) -> float:
    feats = {f"observation.images.{c}": {"dtype": dtype, "shape": [224, 224, 3], "names": None} for c in CAMS}
    feats["observation.state"] = {"dtype": "float32", "shape": [8], "names": None}
    feats["action"] = {"dtype": "float32", "shape": [7], "names": None}
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    w = LeRobotWriter(root, fps=10, features=feats, overwrite=True)
    for e in range(episodes):
        d = {f"observation.images.{c}": frames(length, e, i) for i, c in enumerate(CAMS)}
        d["observation.state"] = rng.normal(size=(length, 8)).astype(np.float32)
        d["action"] = rng.normal(size=(length, 7)).astype(np.float32)
        w.add_episode(d, task=f"task {e % 5}")
    w.finalize()
    return time.perf_counter() - t0


def throughput(ds: VLADataset, cfg, workers: int, batches: int, bs: int) -> float:
    dl = build_dataloader(ds, cfg, batch_size=bs, num_workers=workers, seed=0)
    batches = min(batches, len(dl) - 2)
    it = iter(dl)
    for _ in range(2 if workers else 1):  # warm-up: worker start, decoder open + packet index
        next(it)
    t0 = time.perf_counter()
    n = 0
    for _ in range(batches):
        n += next(it)["images"].shape[0]
    dt = time.perf_counter() - t0
    del it, dl
    return n / dt


def split(ds: VLADataset, batches: int, bs: int) -> dict[str, float]:
    """Per-sample milliseconds of decode (LeRobotDataset), transform (sample build), collate."""
    rng = np.random.default_rng(1)
    ds.ds.__getitems__(list(rng.integers(0, len(ds), bs)))  # warm-up
    td = tt = tc = 0.0
    for _ in range(batches):
        idx = rng.integers(0, len(ds), bs).tolist()
        t0 = time.perf_counter()
        items = ds.ds.__getitems__(idx)
        t1 = time.perf_counter()
        samples = [ds._sample(it, i) for it, i in zip(items, idx)]
        t2 = time.perf_counter()
        default_collate(samples)
        t3 = time.perf_counter()
        td, tt, tc = td + t1 - t0, tt + t2 - t1, tc + t3 - t2
    n = batches * bs
    return {"decode_ms": 1e3 * td / n, "transform_ms": 1e3 * tt / n, "collate_ms": 1e3 * tc / n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--length", type=int, default=100)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--out", default="bench/results/data.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(
        "small", overrides=[f"model.camera_names=[{','.join(CAMS)}]", "data.persistent_workers=false"]
    )
    tmp = Path(tempfile.mkdtemp(prefix="vla_bench_data_"))
    results: dict = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    results["config"] = {"cameras": 2, "image_size": 224, "action_horizon": cfg.model.action_horizon,
                         "batch_size": args.batch_size, "episodes": args.episodes, "length": args.length}  # fmt: skip
    rows = []
    try:
        for dtype in ("video", "image"):
            eps = args.episodes if dtype == "video" else max(4, args.episodes // 4)
            root = tmp / dtype
            write_s = make(root, dtype, eps, args.length)
            ds = VLADataset(cfg, root)
            sp = split(ds, max(3, args.batches // 5), args.batch_size)
            r = {
                "storage": "mp4" if dtype == "video" else "inline_png",
                "frames": len(ds),
                "write_s": write_s,
            }
            for w in (0, 1, 2):
                r[f"samples_per_s_{w}w"] = throughput(ds, cfg, w, args.batches, args.batch_size)
            r.update(sp)
            rows.append(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["rows"] = rows
    results["load_average_1min"] = os.getloadavg()[0]  # the machine is shared: context for the numbers
    hdr = f"{'storage':<11} {'0 workers':>10} {'1 worker':>10} {'2 workers':>10} {'decode':>8} {'transf':>8} {'collate':>8}"
    print(hdr + "   (samples/s; ms/sample)")
    for r in rows:
        print(
            f"{r['storage']:<11} {r['samples_per_s_0w']:>10.0f} {r['samples_per_s_1w']:>10.0f} "
            f"{r['samples_per_s_2w']:>10.0f} {r['decode_ms']:>8.2f} {r['transform_ms']:>8.2f} {r['collate_ms']:>8.2f}"
        )
    target = rows[0]["samples_per_s_2w"]
    results["target_400_samples_per_s_2_workers_mp4"] = bool(target >= 400)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"mp4, 2 workers: {target:.0f} samples/s (target 400) -> {args.out}")


if __name__ == "__main__":
    main()
