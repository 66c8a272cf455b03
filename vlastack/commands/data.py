"""``vla data info | view | convert | check | resize | task-onehot`` (``vla data generate`` lives in vlastack/commands/sim.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def cmd_info(args: argparse.Namespace) -> int:
    from vlastack.data.reader import LeRobotDataset

    ds = LeRobotDataset(args.path)
    info = ds.info
    lengths = [int(e["length"]) for e in ds.episodes]
    print(f"{ds.root}  (LeRobot {info['codebase_version']}, robot_type={info.get('robot_type')})")
    print(f"  episodes {len(lengths)}  frames {sum(lengths)}  fps {info['fps']}  tasks {len(ds.tasks)}")
    print(f"  episode length min/mean/max {min(lengths)}/{np.mean(lengths):.1f}/{max(lengths)}")
    print("  features:")
    for k, ft in info["features"].items():
        extra = ""
        if ft["dtype"] == "video":
            extra = f"  codec={ft.get('info', {}).get('video.codec')}"
        print(f"    {k:<32} {ft['dtype']:<8} {list(ft['shape'])}{extra}")
    for k in ("observation.state", "action"):
        if k in ds.stats:
            st = ds.stats[k]
            print(f"  {k} mean {np.round(st['mean'], 3).tolist()}")
            print(f"  {k} std  {np.round(st['std'], 3).tolist()}")
    shown = ds.tasks[:5]
    print(f"  tasks: {shown}{' ...' if len(ds.tasks) > 5 else ''}")
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from PIL import Image

    from vlastack.data.reader import LeRobotDataset

    ds = LeRobotDataset(args.path, episodes=[args.episode])
    if not ds.camera_keys:
        raise ValueError(f"{args.path}: dataset has no camera features to view")
    out = Path(args.out)
    start, end = ds.episode_range(0)
    if out.suffix == ".mp4":
        from vlastack.data.video import VideoEncoder

        rows = [np.concatenate([ds.image(k, i, size=(128, 128)) for k in ds.camera_keys], axis=1)
                for i in range(start, end)]  # fmt: skip
        enc = VideoEncoder(out, int(ds.fps), rows[0].shape[0], rows[0].shape[1])
        enc.write(np.stack(rows))
        enc.close()
    else:
        cols = np.linspace(start, end - 1, min(args.frames, end - start)).round().astype(int)
        grid = np.concatenate(
            [
                np.concatenate([ds.image(k, int(i), size=(128, 128)) for i in cols], axis=1)
                for k in ds.camera_keys
            ],
            axis=0,
        )
        Image.fromarray(grid).save(out)
    print(f"wrote {out} (episode {args.episode}, {end - start} frames, cameras {ds.camera_keys})")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from vlastack.data.rlds import convert_rlds_to_lerobot

    if args.source_format != "rlds":
        raise ValueError(f"--from must be 'rlds', got {args.source_format!r}")
    n = convert_rlds_to_lerobot(
        args.src, args.out, fps=args.fps, images=args.images, state_key=args.state_key, split=args.split
    )
    print(f"converted {n} episodes -> {args.out}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import time

    from vlastack.data.check import check_dataset

    t0 = time.perf_counter()
    found = check_dataset(args.path)
    for f in found:
        print(f)
    n_err = sum(f.level == "error" for f in found)
    verdict = "FAILED" if n_err else "ok"
    print(
        f"{args.path}: {verdict}: {n_err} errors, {len(found) - n_err} warnings ({time.perf_counter() - t0:.1f}s)"
    )
    return 1 if n_err else 0


def cmd_resize(args: argparse.Namespace) -> int:
    import time

    from vlastack.data.resize import resize_dataset

    t0 = time.perf_counter()
    frames = resize_dataset(args.path, args.out, args.size, lossless=args.video_quality == "lossless")
    print(
        f"{args.out}: {args.path} with videos at {args.size} px ({args.video_quality}; "
        f"{', '.join(f'{k}: {n} frames' for k, n in frames.items())}) in {time.perf_counter() - t0:.0f}s"
    )
    return 0


def cmd_task_onehot(args: argparse.Namespace) -> int:
    from vlastack.data.edit import task_onehot_dataset

    ft = task_onehot_dataset(args.path, args.out)
    print(
        f"{args.out}: {args.path} with observation.environment_state = the task as a one-hot over {ft['shape'][0]} tasks"
    )
    return 0


def register(sub, groups) -> None:
    g = groups["data"]
    p = g.add_parser("check", help="find NaN/inf values, bad stats and shape mismatches (by key, episode)")
    p.add_argument("path")
    p.set_defaults(func=cmd_check)
    p = g.add_parser("info", help="summary of a LeRobot v3 dataset")
    p.add_argument("path")
    p.set_defaults(func=cmd_info)
    p = g.add_parser("view", help="contact sheet (.png) or video (.mp4) of one episode")
    p.add_argument("path")
    p.add_argument("--episode", type=int, default=0)
    p.add_argument("--out", required=True, help="output .png (contact sheet) or .mp4")
    p.add_argument("--frames", type=int, default=8, help="columns of the contact sheet")
    p.set_defaults(func=cmd_view)
    p = g.add_parser("convert", help="convert RLDS (TFDS TFRecords) to LeRobot v3")
    p.add_argument("--from", dest="source_format", default="rlds", help="source format (rlds)")
    p.add_argument("src")
    p.add_argument("--out", required=True)
    p.add_argument("--fps", type=int, default=10)
    p.add_argument("--images", default="video", choices=["video", "image"], help="mp4 or inline PNG")
    p.add_argument("--state-key", default="steps/observation/state")
    p.add_argument("--split", default="train")
    p.set_defaults(func=cmd_convert)
    p = g.add_parser(
        "resize",
        help="a copy whose videos are resized with the policy's own resize (for policies that cannot resize)",
    )
    p.add_argument("path", help="a LeRobot v3 dataset (read only)")
    p.add_argument("--size", type=int, required=True, help="side of the square frames, px")
    p.add_argument("--out", required=True, help="the new dataset folder (must not exist)")
    p.add_argument(
        "--video-quality", choices=["lossless", "standard"], default="lossless",
        help="lossless: yuv444p H.264 crf 0 (default); standard: yuv420p crf 23",
    )  # fmt: skip
    p.set_defaults(func=cmd_resize)
    p = g.add_parser(
        "task-onehot",
        help="a copy whose observation.environment_state is the task as a one-hot (for policies without language)",
    )
    p.add_argument("path", help="a LeRobot v3 dataset (read only)")
    p.add_argument("--out", required=True, help="the new dataset folder (must not exist)")
    p.set_defaults(func=cmd_task_onehot)
