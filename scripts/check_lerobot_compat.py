"""Cross-check vlastack's LeRobot v3.0 files against the real `lerobot` package.

lerobot pins its own torch/torchvision, so it never goes into the project's ``.venv``. Make a
throwaway venv OUTSIDE the repo (tested: Python 3.11, lerobot 0.4.4, torch 2.13.0 CPU, Debian 12):

    python3.11 -m venv /tmp/lrvenv
    /tmp/lrvenv/bin/pip install torch==2.13.0
    /tmp/lrvenv/bin/pip install --no-deps lerobot==0.4.4 torchvision==0.28.0 torchcodec==0.13.0 \\
        "accelerate>=1.10,<2"
    /tmp/lrvenv/bin/pip install numpy pandas pyarrow pillow psutil pyyaml safetensors einops \\
        "datasets>=4,<5" "huggingface-hub>=0.34.2,<0.36" "av>=15,<16" jsonlines "packaging<26" \\
        "deepdiff<9" termcolor draccus==0.10.0
    apt-get install libavdevice59 libavfilter8    # FFmpeg shared libraries that torchcodec loads

The PyPI torchvision wheel is CUDA-linked, so its ``_C`` ops do not load against the CPU torch and
``import torchvision`` dies at ``register_fake("torchvision::nms")``. lerobot's dataset code only
uses torchvision's transforms, so in that throwaway venv guard the two ``register_fake`` decorators
of ``torchvision/_meta_registrations.py`` with ``torchvision.extension._has_ops()``. (lerobot's
"pyav" video backend needs ``torchvision.io.VideoReader``, gone from torchvision 0.28: decoding goes
through torchcodec, lerobot's default backend.)

Then, from the repo root (never with network access to the Hub):

    HF_HUB_OFFLINE=1 /tmp/lrvenv/bin/python scripts/check_lerobot_compat.py check
    HF_HUB_OFFLINE=1 /tmp/lrvenv/bin/python scripts/check_lerobot_compat.py make-fixture \\
        tests/data/fixtures/lerobot_written_v3

``check`` (direction A): writes datasets with our ``LeRobotWriter`` (two mp4 cameras; then inline
PNG images) and loads them with lerobot's ``LeRobotDataset``: frames, actions, timestamps, episode
boundaries, tasks, action chunks with ``action_is_pad``, episode subsets, stats and decoded video;
then appends an episode with lerobot's own writer to our dataset and reads the result back.
``make-fixture`` (direction B): writes a tiny dataset with lerobot's writer plus ``expected.json``
(values as lerobot reads them), which ``tests/data/test_lerobot_compat.py`` checks our reader
against. Exit code 0 = every check passed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FPS = 10
CHUNK = 8  # action chunk length for the delta_timestamps checks
CAMS = ("observation.images.top", "observation.images.wrist")
TASKS = ("pick up the red block", "open the drawer")
FAILURES: list[str] = []


def check(cond: bool, what: str) -> None:
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILURES.append(what)


def frames(ep: int, t: int, h: int, w: int) -> np.ndarray:
    """Smooth ramps that move with the frame index (kind to lossy codecs), uint8 [t, h, w, 3]."""
    f = np.arange(t)[:, None, None, None]
    y = np.arange(h)[None, :, None, None]
    x = np.arange(w)[None, None, :, None]
    c = np.arange(3)[None, None, None, :]
    return np.minimum(20 + (x + y) // 2 + 3 * f + 20 * ep + 15 * c, 255).astype(np.uint8)


def episode(ep: int, t: int, size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    top = frames(ep, t, size, size)
    return {
        CAMS[0]: top,
        CAMS[1]: np.ascontiguousarray(255 - top[:, ::-1]),
        "observation.state": rng.normal(size=(t, 5)).astype(np.float32),
        "action": (np.arange(t)[:, None] + 100 * ep + 0.25 * np.arange(4)[None]).astype(np.float32),
    }


def features(cam_dtypes: tuple[str, str], size: int) -> dict[str, dict]:
    cams = {
        k: {"dtype": d, "shape": (size, size, 3), "names": ["height", "width", "channels"]}
        for k, d in zip(CAMS, cam_dtypes)
    }
    return {
        **cams,
        "observation.state": {"dtype": "float32", "shape": (5,), "names": None},
        "action": {"dtype": "float32", "shape": (4,), "names": None},
    }


def to_hwc_uint8(img) -> np.ndarray:
    """lerobot's float [3, H, W] in [0, 1] -> uint8 [H, W, 3]."""
    return (img.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


# ---------------------------------------------------------------------- direction A
def check_ours_in_lerobot(root: Path, cam_dtypes: tuple[str, str], lengths=(15, 22, 9), **writer_kw) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset as LRDataset

    from vlastack.data.format import STATS_KEYS
    from vlastack.data.lerobot import LeRobotDataset, LeRobotWriter

    tag = f"[ours->lerobot {'/'.join(cam_dtypes)}{' multi-file' if writer_kw else ''}]"
    rng = np.random.default_rng(0)
    w = LeRobotWriter(
        root, fps=FPS, features=features(cam_dtypes, 64), robot_type="vlastack_check", **writer_kw
    )
    data = []
    for ep, t in enumerate(lengths):
        data.append(episode(ep, t, 64, rng))
        w.add_episode(data[-1], task=TASKS[ep % 2])
    w.finalize()
    if writer_kw:
        print(
            "   files:",
            sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in (".mp4", ".parquet")),
        )

    ds = LRDataset("local/vlastack_check", root=root,
                   delta_timestamps={"action": [k / FPS for k in range(CHUNK)]})  # fmt: skip
    ours = LeRobotDataset(root)
    n = sum(lengths)
    check(len(ds) == n and ds.num_episodes == len(lengths), f"{tag} {n} frames, {len(lengths)} episodes")
    check(list(ds.meta.tasks.index) == list(TASKS), f"{tag} tasks {list(ds.meta.tasks.index)}")
    want = [k for k, d in zip(CAMS, cam_dtypes) if d == "video"]
    check(ds.meta.video_keys == want, f"{tag} video keys {ds.meta.video_keys}")
    eps = ds.meta.episodes
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    check(list(eps["dataset_from_index"]) == list(starts), f"{tag} dataset_from_index")
    check(list(eps["length"]) == list(lengths), f"{tag} episode lengths")

    bad, img_err, vs_ours = [], 0.0, 0.0
    for i in range(n):
        ep = int(np.searchsorted(starts, i, side="right") - 1)
        f, t, d = i - int(starts[ep]), lengths[ep], data[ep]
        it = ds[i]
        idx = np.arange(f, f + CHUNK)
        ok = (
            int(it["episode_index"]) == ep
            and int(it["frame_index"]) == f
            and int(it["index"]) == i
            and abs(float(it["timestamp"]) - f / FPS) < 1e-6
            and it["task"] == TASKS[ep % 2]
            and np.array_equal(it["observation.state"].numpy(), d["observation.state"][f])
            and np.array_equal(it["action"].numpy(), d["action"][np.minimum(idx, t - 1)])
            and np.array_equal(it["action_is_pad"].numpy(), idx >= t)
        )
        if not ok:
            bad.append(i)
        for k in CAMS:
            got = to_hwc_uint8(it[k]).astype(np.int16)
            img_err = max(img_err, float(np.abs(got - d[k][f]).mean()))
            vs_ours = max(vs_ours, float(np.abs(got - ours.image(k, i)).mean()))
    check(not bad, f"{tag} per-frame indices/timestamps/tasks/state/action chunks/is_pad (bad: {bad[:5]})")
    lossless = all(d == "image" for d in cam_dtypes)
    check(
        img_err == 0 if lossless else img_err < 3,
        f"{tag} decoded images vs written: mean |err| {img_err:.2f}",
    )
    check(vs_ours <= 1.0, f"{tag} lerobot's decode vs ours: mean |diff| {vs_ours:.2f}")

    sub = LRDataset("local/vlastack_check", root=root, episodes=[1])
    check(len(sub) == lengths[1] and int(sub[0]["episode_index"]) == 1 and int(sub[0]["index"]) == starts[1],
          f"{tag} episode subset [1]")  # fmt: skip

    st = ds.meta.stats
    all_actions = np.concatenate([d["action"] for d in data])
    check(set(st) == set(ds.meta.features), f"{tag} stats cover every feature")
    check(all(set(STATS_KEYS) <= set(v) for v in st.values()), f"{tag} stats have {STATS_KEYS}")
    check(np.allclose(st["action"]["mean"], all_actions.mean(0)) and st["action"]["count"][0] == n,
          f"{tag} action mean/count")  # fmt: skip
    check(all(st[k]["mean"].shape == (3, 1, 1) for k in CAMS), f"{tag} image stats shaped (3, 1, 1)")


def check_lerobot_appends_to_ours(root: Path) -> None:
    """lerobot resumes recording into our dataset; both readers then see all episodes."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset as LRDataset

    from vlastack.data.lerobot import LeRobotDataset

    tag = "[lerobot appends to ours]"
    before = LeRobotDataset(root)
    n0, e0 = len(before), before.num_episodes
    ds = LRDataset("local/vlastack_check", root=root)
    d = episode(7, 6, 64, np.random.default_rng(1))
    for f in range(6):
        ds.add_frame({**{k: v[f] for k, v in d.items()}, "task": "a new task"})
    ds.save_episode()
    ds.finalize()
    lr = LRDataset("local/vlastack_check", root=root)
    ours = LeRobotDataset(root)
    check(len(lr) == n0 + 6 and lr.num_episodes == e0 + 1, f"{tag} lerobot sees {len(lr)} frames")
    check(len(ours) == n0 + 6 and ours.num_episodes == e0 + 1, f"{tag} ours sees {len(ours)} frames")
    last, lr_last = ours[len(ours) - 1], lr[len(lr) - 1]
    check(
        last["task"] == "a new task" and np.array_equal(last["action"], d["action"][5]), f"{tag} last frame"
    )
    for k in CAMS:
        err = np.abs(last[k].astype(np.int16) - d[k][5]).mean()
        diff = np.abs(to_hwc_uint8(lr_last[k]).astype(np.int16) - last[k]).mean()
        check(
            err < 3 and diff <= 1,
            f"{tag} {k} of the appended episode: |err| {err:.2f}, vs lerobot {diff:.2f}",
        )
    print("   video files:", sorted(str(p.relative_to(root)) for p in root.glob("videos/*/*/*.mp4")))


# ---------------------------------------------------------------------- direction B
def check_lerobot_in_ours(root: Path, lengths=(6, 9, 5, 7)) -> None:
    """lerobot writes many small files (2 per chunk dir); our reader must match lerobot's reader."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset as LRDataset

    from vlastack.data.lerobot import LeRobotDataset

    tag = "[lerobot->ours multi-file]"
    ds = LRDataset.create("local/lr_check", fps=FPS, features=features(("video", "image"), 48), root=root)
    ds.meta.update_chunk_settings(chunks_size=2, data_files_size_in_mb=0.001, video_files_size_in_mb=0.001)
    rng = np.random.default_rng(2)
    for ep, t in enumerate(lengths):
        d = episode(ep, t, 48, rng)
        for f in range(t):
            ds.add_frame({**{k: v[f] for k, v in d.items()}, "task": TASKS[ep % 2]})
        ds.save_episode()
    ds.finalize()
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in (".mp4", ".parquet"))
    print("   files:", files)
    lr = LRDataset("local/lr_check", root=root, delta_timestamps={"action": [k / FPS for k in range(CHUNK)]})
    ours = LeRobotDataset(root, delta_indices={"action": list(range(CHUNK))})
    check(len(ours) == len(lr) == sum(lengths), f"{tag} {len(ours)} frames")
    bad, diff = [], 0.0
    for i in range(len(lr)):
        a, b = lr[i], ours[i]
        if not (
            a["task"] == b["task"]
            and int(a["episode_index"]) == int(b["episode_index"])
            and np.array_equal(a["action"].numpy(), b["action"])
            and np.array_equal(a["action_is_pad"].numpy(), b["action_is_pad"])
            and np.array_equal(a["observation.state"].numpy(), b["observation.state"])
        ):
            bad.append(i)
        for k in CAMS:
            diff = max(diff, float(np.abs(to_hwc_uint8(a[k]).astype(np.int16) - b[k]).mean()))
    check(not bad, f"{tag} tasks/actions/chunks/is_pad/state equal (bad: {bad[:5]})")
    check(diff <= 1.0, f"{tag} images vs lerobot's decode: mean |diff| {diff:.2f}")
    sub = LeRobotDataset(root, episodes=[3, 1])
    check([int(e["episode_index"]) for e in sub.episodes] == [3, 1] and len(sub) == lengths[3] + lengths[1],
          f"{tag} episode subset [3, 1]")  # fmt: skip


# ---------------------------------------------------------------------- direction B fixture
def make_fixture(out: Path) -> None:
    """Tiny lerobot-written dataset (mp4 + inline-image camera) and what lerobot reads from it."""
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset as LRDataset

    lengths, size, chunk = (10, 8), 32, 5
    tmp = Path(tempfile.mkdtemp()) / "ds"
    ds = LRDataset.create("local/lerobot_written_v3", fps=FPS, features=features(("video", "image"), size),
                          root=tmp, robot_type="lerobot_fixture", use_videos=True)  # fmt: skip
    rng = np.random.default_rng(0)
    for ep, t in enumerate(lengths):
        d = episode(ep, t, size, rng)
        for f in range(t):
            ds.add_frame({**{k: v[f] for k, v in d.items()}, "task": TASKS[ep]})
        ds.save_episode()
    ds.finalize()

    lr = LRDataset(
        "local/lerobot_written_v3", root=tmp, delta_timestamps={"action": [k / FPS for k in range(chunk)]}
    )
    items = [lr[i] for i in range(len(lr))]
    probe = lengths[0] - 2  # an action chunk that runs past the end of episode 0
    expected = {
        "lerobot_version": lerobot.__version__,
        "fps": FPS,
        "lengths": [int(x) for x in lr.meta.episodes["length"]],
        "dataset_from_index": [int(x) for x in lr.meta.episodes["dataset_from_index"]],
        "tasks": list(lr.meta.tasks.index),
        "video_keys": lr.meta.video_keys,
        "image_keys": lr.meta.image_keys,
        "frame_task": [it["task"] for it in items],
        "timestamp": [float(it["timestamp"]) for it in items],
        "frame_index": [int(it["frame_index"]) for it in items],
        "action": [lr.hf_dataset[i]["action"].tolist() for i in range(len(lr))],
        "state": [it["observation.state"].tolist() for it in items],
        "frame_mean": {k: [float(to_hwc_uint8(it[k]).mean()) for it in items] for k in CAMS},
        "chunk": {
            "index": probe,
            "action": items[probe]["action"].tolist(),
            "action_is_pad": items[probe]["action_is_pad"].tolist(),
        },
        "stats": {
            k: {s: np.asarray(v).tolist() for s, v in lr.meta.stats[k].items()}
            for k in ("action", "observation.state")
        },
    }
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(tmp, out)
    for p in out.rglob("*"):
        if p.is_file():
            p.chmod(0o644)  # lerobot leaves its mp4s 0600
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({total / 1024:.1f} KiB) with lerobot {lerobot.__version__}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="direction A: write with vlastack, read with lerobot")
    mk = sub.add_parser("make-fixture", help="direction B: write the lerobot-made test fixture")
    mk.add_argument("out", type=Path)
    args = ap.parse_args()
    try:
        import lerobot
    except ImportError:
        print("lerobot is not importable here: see this script's docstring for the throwaway venv")
        return 2
    if args.cmd == "make-fixture":
        make_fixture(args.out)
        return 0
    print(f"lerobot {lerobot.__version__}")
    with tempfile.TemporaryDirectory() as d:
        check_ours_in_lerobot(Path(d) / "video", ("video", "video"))
        check_ours_in_lerobot(Path(d) / "image", ("image", "image"))
        check_ours_in_lerobot(Path(d) / "mixed", ("video", "image"), lengths=(5, 7))
        small = {"chunks_size": 2, "data_files_size_in_mb": 0.001, "video_files_size_in_mb": 0.001}
        check_ours_in_lerobot(Path(d) / "multi", ("video", "image"), lengths=(6, 9, 5, 7), **small)
        check_lerobot_appends_to_ours(Path(d) / "video")
        check_lerobot_in_ours(Path(d) / "lerobot")
    print(f"{len(FAILURES)} failed" if FAILURES else "all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
