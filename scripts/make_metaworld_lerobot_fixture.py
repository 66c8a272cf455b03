"""Freeze what the real ``lerobot`` reads from a Meta-World dataset that vlastack wrote.

Run in the LeRobot venv (``scripts/make_lerobot_fixtures.py`` builds it; this also needs lerobot's
dataset stack: ``datasets pyarrow pandas av jsonlines``; without a working torchcodec the pyav video
backend is used). From the repo root, with no Hub access:

    .venv/bin/vla data generate --suite metaworld --tasks reach-v3,push-v3 --episodes-per-task 1 \\
        --image-size 64 --out /tmp/lr_fixture_ds --overwrite
    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 /work/lrvenv/bin/python scripts/make_metaworld_lerobot_fixture.py \\
        --dataset /tmp/lr_fixture_ds --vlastack-python .venv/bin/python

(``--generate`` runs that ``vla data generate`` first with ``--vlastack-python``, then ``vla data add-uv
--overwrite``, which rewrites the data and episode files in place with the same values: LeRobot then
reads files written by both of vlastack's writers.) It opens the dataset
with ``lerobot.datasets.lerobot_dataset.LeRobotDataset`` and writes
``tests/fixtures/metaworld_lerobot/lerobot_view.json``: the versions on both sides, the metadata LeRobot
reads, each episode's tasks and boundaries, and the first and last frame of every episode as LeRobot
returns them (image: float CHW in [0, 1], kept as shape, dtype and means).
``tests/sim/test_metaworld_lerobot_fixture.py`` regenerates the dataset with vlastack's ``generate()``
(``generate_args`` below) and checks that vlastack's own reader sees the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests/fixtures/metaworld_lerobot/lerobot_view.json"
# vlastack.sim.generate.generate(out, **GENERATE_ARGS) == the `vla data generate` line above
GENERATE_ARGS = {
    "suite": "metaworld",
    "tasks": ["reach-v3", "push-v3"],
    "episodes_per_task": 1,
    "image_size": 64,
}
FRAME_KEYS = ("index", "frame_index", "episode_index", "timestamp", "task_index", "task_id")
VECTOR_KEYS = (
    "observation.state",
    "action",
    "observation.environment_state",
    "observation.environment_uv.image",
)
VERSIONS = "import json, sys; from importlib import metadata as m; print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"


def versions(python: str, packages: tuple[str, ...]) -> dict:
    out = subprocess.run([python, "-c", VERSIONS, *packages], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def video_backend() -> str:
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401  (fails if its FFmpeg libs don't load)

        return "torchcodec"
    except Exception:
        return "pyav"


def generate(python: str, dataset: Path) -> None:
    a = GENERATE_ARGS
    cmd = [
        python,
        "-m",
        "vlastack.cli",
        "data",
        "generate",
        "--suite",
        a["suite"],
        "--tasks",
        ",".join(a["tasks"]),
    ]
    cmd += ["--episodes-per-task", str(a["episodes_per_task"]), "--image-size", str(a["image_size"])]
    subprocess.run([*cmd, "--out", str(dataset), "--overwrite", "--workers", "0"], cwd=ROOT, check=True)
    add_uv = [python, "-m", "vlastack.cli", "data", "add-uv", str(dataset), "--overwrite"]
    subprocess.run(add_uv, cwd=ROOT, check=True)


def frame_view(item: dict, camera_keys: list[str]) -> dict:
    row = {k: item[k].item() for k in FRAME_KEYS}
    row.update({k: item[k].tolist() for k in VECTOR_KEYS})
    row["task"] = item["task"]
    for k in camera_keys:
        img = item[k]
        row[k] = {
            "shape": list(img.shape),
            "dtype": str(img.dtype).replace("torch.", ""),
            "mean": round(float(img.float().mean()), 4),
            "channel_means": [round(float(c), 4) for c in img.float().mean(dim=(1, 2))],
        }
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", type=Path, default=Path("/tmp/lr_fixture_ds"))
    p.add_argument("--vlastack-python", default=str(ROOT / ".venv/bin/python"))
    p.add_argument("--generate", action="store_true", help="(re)generate --dataset with vlastack first")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if args.generate:
        generate(args.vlastack_python, args.dataset)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    backend = video_backend()
    ds = LeRobotDataset(repo_id="local/mw", root=args.dataset, video_backend=backend)
    meta = ds.meta
    info_json = json.loads((args.dataset / "meta/info.json").read_text())
    sim = json.loads((args.dataset / "meta/vlastack_sim.json").read_text())
    cams = list(meta.camera_keys)
    episodes = []
    for e in meta.episodes:
        lo, hi = int(e["dataset_from_index"]), int(e["dataset_to_index"])
        episodes.append(
            {
                "episode_index": int(e["episode_index"]),
                "tasks": list(e["tasks"]),
                "length": int(e["length"]),
                "dataset_from_index": lo,
                "dataset_to_index": hi,
                "frames": [frame_view(ds[i], cams) for i in (lo, hi - 1)],
            }
        )
    view = {
        "versions": {
            "lerobot_side": {"python": sys.version.split()[0]}
            | {k: metadata.version(k) for k in ("lerobot", "metaworld", "torch", "datasets", "av")},
            "generated_with": versions(args.vlastack_python, ("vlastack", "metaworld", "mujoco")),
        },
        "video_backend": backend,
        "generate_args": GENERATE_ARGS | {"seed": sim["seed"], "render_quality": sim["render_quality"]},
        "rewritten_by_add_uv": args.generate,
        "codebase_version": info_json["codebase_version"],
        "meta": {
            "fps": meta.fps,
            "robot_type": meta.robot_type,
            "total_episodes": meta.total_episodes,
            "total_frames": meta.total_frames,
            "total_tasks": meta.total_tasks,
            "camera_keys": cams,
            "features": {
                k: {"dtype": f["dtype"], "shape": list(f["shape"]), "names": f.get("names")}
                for k, f in meta.features.items()
            },
        },
        "num_frames": len(ds),
        "episodes": episodes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(view, indent=1) + "\n")
    print(
        f"wrote {args.out} ({len(episodes)} episodes, {len(ds)} frames, lerobot {view['versions']['lerobot_side']})"
    )


if __name__ == "__main__":
    main()
