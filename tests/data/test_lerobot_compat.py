"""Compatibility with the real `lerobot` package, checked without installing it.

``fixtures/lerobot_written_v3`` was written by lerobot's own ``LeRobotDataset.create/add_frame/
save_episode/finalize`` (an AV1 mp4 camera and an inline-PNG camera), and ``expected.json`` holds
what lerobot's reader returns for it. Both come from ``scripts/check_lerobot_compat.py
make-fixture``, whose docstring also says how to re-run the live cross-check in both directions.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from vlastack.batch import validate_batch
from vlastack.config import load_config
from vlastack.data.lerobot import LeRobotDataset, LeRobotWriter
from vlastack.data.loader import batch_to_device, build_dataloader
from vlastack.data.samples import make_dataset

FIXTURE = Path(__file__).parent / "fixtures" / "lerobot_written_v3"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
CAMS = ("observation.images.top", "observation.images.wrist")


@pytest.fixture(scope="module")
def ours_root(tmp_path_factory) -> Path:
    """The fixture's dataset re-written by our writer (same features, frames and tasks)."""
    ref = LeRobotDataset(FIXTURE)
    info = json.loads((FIXTURE / "meta/info.json").read_text())
    feats = {k: ft for k, ft in info["features"].items() if k in (*CAMS, "observation.state", "action")}
    root = tmp_path_factory.mktemp("compat") / "ours"
    w = LeRobotWriter(root, fps=info["fps"], features=feats, robot_type=info["robot_type"])
    for k in range(ref.num_episodes):
        s, e = ref.episode_range(k)
        items = [ref[i] for i in range(s, e)]
        w.add_episode({key: np.stack([it[key] for it in items]) for key in feats}, task=items[0]["task"])
    w.finalize()
    return root


def test_reader_matches_lerobot_on_lerobot_written_dataset():
    ds = LeRobotDataset(FIXTURE, delta_indices={"action": list(range(len(EXPECTED["chunk"]["action"])))})
    assert [int(e["length"]) for e in ds.episodes] == EXPECTED["lengths"]
    assert [int(e["dataset_from_index"]) for e in ds.episodes] == EXPECTED["dataset_from_index"]
    assert ds.tasks == EXPECTED["tasks"] and ds.fps == EXPECTED["fps"]
    assert ds.video_keys == EXPECTED["video_keys"] and ds.image_keys == EXPECTED["image_keys"]
    assert len(ds) == len(EXPECTED["action"])
    for i in range(len(ds)):
        it = ds[i]
        assert it["task"] == EXPECTED["frame_task"][i]
        assert int(it["frame_index"]) == EXPECTED["frame_index"][i]
        assert float(it["timestamp"]) == pytest.approx(EXPECTED["timestamp"][i], abs=1e-7)
        np.testing.assert_array_equal(it["action"][0], np.float32(EXPECTED["action"][i]))
        np.testing.assert_array_equal(it["observation.state"], np.float32(EXPECTED["state"][i]))
        for k in CAMS:  # same frame as lerobot decoded (AV1 mp4 / PNG), up to YUV->RGB rounding
            assert it[k].shape == (32, 32, 3) and it[k].dtype == np.uint8
            assert abs(float(it[k].mean()) - EXPECTED["frame_mean"][k][i]) < 0.5, (i, k)
    probe = ds[EXPECTED["chunk"]["index"]]
    np.testing.assert_array_equal(probe["action"], np.float32(EXPECTED["chunk"]["action"]))
    assert probe["action_is_pad"].tolist() == EXPECTED["chunk"]["action_is_pad"]
    for key, st in EXPECTED["stats"].items():
        for s, v in st.items():
            np.testing.assert_allclose(ds.stats[key][s], v, rtol=1e-6, err_msg=f"{key}/{s}")


def test_episode_subset_of_lerobot_written_dataset():
    ds = LeRobotDataset(FIXTURE, episodes=[1])
    start = EXPECTED["dataset_from_index"][1]
    assert len(ds) == EXPECTED["lengths"][1] and int(ds[0]["index"]) == start
    np.testing.assert_array_equal(ds[0]["action"], np.float32(EXPECTED["action"][start]))
    assert abs(float(ds[0][CAMS[0]].mean()) - EXPECTED["frame_mean"][CAMS[0]][start]) < 0.5


def test_make_dataset_on_lerobot_written_dataset():
    cfg = load_config("tiny", overrides=["model.camera_names=[top,wrist,left]"])
    ds = make_dataset(cfg, FIXTURE)
    i = EXPECTED["chunk"]["index"]  # two real steps, then padding past the end of episode 0
    s = ds[i]
    assert s["image_mask"].tolist() == [True, True, False] and s["images"].dtype == torch.uint8
    assert s["action_is_pad"][:2].tolist() == [False, False] and s["action_is_pad"][2:].all()
    raw = ds.normalizer.unnormalize("action", s["actions"][:2, :4].numpy())
    np.testing.assert_allclose(raw, EXPECTED["chunk"]["action"][:2], rtol=1e-5, atol=1e-5)
    batch = next(iter(build_dataloader(ds, cfg, batch_size=4, num_workers=0)))
    assert validate_batch(batch_to_device(batch, "cpu"), cfg.model, train=True) == 4


def _schema(path: Path) -> list[tuple[str, str]]:
    # pandas 3 writes string columns as large_string; both read back as str everywhere.
    return [(f.name, str(f.type).replace("large_string", "string")) for f in pq.read_schema(path)]


def _hf_features(path: Path) -> dict:
    return json.loads(pq.read_schema(path).metadata[b"huggingface"])["info"]["features"]


def test_writer_info_matches_lerobot(ours_root):
    ref = json.loads((FIXTURE / "meta/info.json").read_text())
    ours = json.loads((ours_root / "meta/info.json").read_text())
    assert list(ours) == list(ref)
    for k in ref:
        if k != "features":
            assert ours[k] == ref[k], k
    assert list(ours["features"]) == list(ref["features"])
    for k, ft in ref["features"].items():
        got = ours["features"][k]
        assert list(got) == list(ft), k
        assert (got["dtype"], got["shape"], got["names"]) == (ft["dtype"], ft["shape"], ft["names"]), k
        if "info" in ft:
            assert list(got["info"]) == list(ft["info"]), k
            for field, v in ft["info"].items():
                if field != "video.codec":  # lerobot defaults to AV1, we to H.264; both decode
                    assert got["info"][field] == v, (k, field)


def test_writer_parquet_layout_matches_lerobot(ours_root):
    for rel in ("data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet"):
        assert _schema(ours_root / rel) == _schema(FIXTURE / rel), rel
    data = "data/chunk-000/file-000.parquet"
    assert _hf_features(ours_root / data) == _hf_features(FIXTURE / data)
    assert _schema(ours_root / "meta/tasks.parquet") == _schema(FIXTURE / "meta/tasks.parquet")
    pandas = [
        json.loads(pq.read_schema(r / "meta/tasks.parquet").metadata[b"pandas"]) for r in (ours_root, FIXTURE)
    ]
    assert pandas[0]["index_columns"] == pandas[1]["index_columns"]
    ep = "meta/episodes/chunk-000/file-000.parquet"
    cols = ["episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index"]
    cols += [c for c in pq.read_schema(FIXTURE / ep).names if c.startswith("videos/") and "index" in c]
    assert (
        pq.read_table(ours_root / ep, columns=cols).to_pylist()
        == pq.read_table(FIXTURE / ep, columns=cols).to_pylist()
    )


def test_writer_stats_layout_matches_lerobot(ours_root):
    ref = json.loads((FIXTURE / "meta/stats.json").read_text())
    ours = json.loads((ours_root / "meta/stats.json").read_text())
    assert set(ours) == set(ref)
    for k, st in ref.items():
        assert list(ours[k]) == list(st), k
        for s, v in st.items():
            a, b = np.asarray(ours[k][s]), np.asarray(v)
            assert a.shape == b.shape and a.dtype.kind == b.dtype.kind, (k, s, a, b)
    # Values agree where the definitions agree (exact moments over the same numbers).
    for k in ("action", "observation.state", "frame_index", "index"):
        for s in ("min", "max", "mean", "std", "count"):
            np.testing.assert_allclose(ours[k][s], ref[k][s], rtol=1e-5, err_msg=f"{k}/{s}")


def test_writer_rolls_over_files_like_lerobot(tmp_path):
    """Small file limits split data and video into chunk-XXX/file-YYY the way lerobot names them."""
    feats = {
        "observation.images.top": {"dtype": "video", "shape": [32, 32, 3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
    }
    w = LeRobotWriter(
        tmp_path / "ds", fps=10, features=feats, chunks_size=2,
        data_files_size_in_mb=0.0005, video_files_size_in_mb=0.0005,
    )  # fmt: skip
    lengths = (6, 9, 5, 7)
    frames = []
    for ep, t in enumerate(lengths):
        img = (
            np.zeros((t, 32, 32, 3), np.uint8)
            + (np.arange(t) * 8 + 60 * ep).astype(np.uint8)[:, None, None, None]
        )
        frames.append(img)
        act = np.stack([np.arange(t), np.full(t, ep)], 1).astype(np.float32)
        w.add_episode({"observation.images.top": img, "action": act}, task="t")
    root = w.finalize()
    data = sorted(str(p.relative_to(root)) for p in root.glob("data/*/*.parquet"))
    videos = sorted(str(p.relative_to(root)) for p in root.glob("videos/*/*/*.mp4"))
    assert data[:3] == [
        "data/chunk-000/file-000.parquet",
        "data/chunk-000/file-001.parquet",
        "data/chunk-001/file-000.parquet",
    ]
    assert len(videos) >= 2 and videos[1] == "videos/observation.images.top/chunk-000/file-001.mp4"
    ds = LeRobotDataset(root)
    for ep, img in enumerate(frames):
        s, _ = ds.episode_range(ep)
        for f in range(len(img)):
            it = ds[s + f]
            assert it["action"].tolist() == [f, ep]
            assert abs(float(it["observation.images.top"].mean()) - float(img[f].mean())) < 3
