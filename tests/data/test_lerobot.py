import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import FEATURES, episode, write_dataset

from vlastack.data.lerobot import LeRobotDataset, LeRobotWriter


def test_layout_and_metadata(dataset):
    root, _data = dataset
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["total_episodes"] == 3 and info["total_frames"] == 41 and info["total_tasks"] == 2
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    assert info["features"]["observation.images.scene"]["info"]["video.codec"] in ("h264", "av1")
    for k in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert k in info["features"]
    assert (root / "videos/observation.images.scene/chunk-000/file-000.mp4").is_file()
    stats = json.loads((root / "meta/stats.json").read_text())
    for s in ("mean", "std", "min", "max", "count", "q01", "q10", "q50", "q90", "q99"):
        assert s in stats["action"]
    assert np.allclose(stats["action"]["max"], 2008) and np.allclose(stats["action"]["min"], 0)
    assert np.array(stats["observation.images.scene"]["mean"]).shape == (3, 1, 1)
    ep = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["dataset_from_index"] for e in ep] == [0, 12, 32]
    assert ep[1]["videos/observation.images.scene/from_timestamp"] == pytest.approx(1.2)
    assert ep[1]["videos/observation.images.scene/to_timestamp"] == pytest.approx(3.2)
    assert ep[2]["tasks"] == ["task 0"] and "stats/action/mean" in ep[0]
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks["__index_level_0__"].to_pylist() == ["task 0", "task 1"]
    assert b"index_columns" in tasks.schema.metadata[b"pandas"]  # pandas restores the task text as the index
    rows = pq.read_table(root / "data/chunk-000/file-000.parquet")
    assert rows.num_rows == 41 and rows["index"].to_pylist() == list(range(41))
    assert str(rows.schema.field("observation.images.wrist").type) == "struct<bytes: binary, path: string>"


def test_reader_frames_and_chunks(dataset):
    root, data = dataset
    ds = LeRobotDataset(root, delta_indices={"action": list(range(5))})
    assert len(ds) == 41
    it = ds[12 + 18]  # episode 1, frame 18 of 20
    assert it["task"] == "task 1" and it["frame_index"] == 18
    assert np.array_equal(it["action_is_pad"], [False, False, True, True, True])
    assert np.allclose(it["action"][:, 0], [1018, 1019, 1019, 1019, 1019])
    assert abs(int(it["observation.images.scene"][2, 2, 0]) - (180 + 1)) <= 3  # lossy codec
    assert np.array_equal(it["observation.images.wrist"], data[1]["observation.images.wrist"][18])
    np.testing.assert_allclose(it["observation.state"], data[1]["observation.state"][18])
    # Random access in any order decodes the right frame.
    for i in [40, 0, 25, 13, 31, 5]:
        e = int(ds.columns["episode_index"][i])
        f = int(ds.columns["frame_index"][i])
        assert abs(int(ds[i]["observation.images.scene"][1, 1, 1]) - ((f * 10 + e) % 256)) <= 3


def test_episode_subset(dataset):
    root, _data = dataset
    ds = LeRobotDataset(root, episodes=[2, 0])
    assert len(ds) == 9 + 12 and ds.num_episodes == 2
    assert ds[0]["episode_index"] == 2 and ds[9]["episode_index"] == 0
    with pytest.raises(ValueError, match="do not exist"):
        LeRobotDataset(root, episodes=[7])


def test_add_frame_api_and_atomicity(tmp_path):
    feats = {k: v for k, v in FEATURES.items() if k != "observation.images.wrist"}
    w = LeRobotWriter(tmp_path / "a", fps=10, features=feats)
    ep = episode(4, 0, np.random.default_rng(0))
    for t in range(4):
        w.add_frame({k: ep[k][t] for k in feats}, task="stack")
    w.save_episode()
    assert not (tmp_path / "a").exists()  # nothing published before finalize
    w.finalize()
    assert len(LeRobotDataset(tmp_path / "a")) == 4
    with pytest.raises(ValueError, match="already exists"):
        LeRobotWriter(tmp_path / "a", fps=10, features=feats)


def test_writer_errors(tmp_path):
    w = LeRobotWriter(tmp_path / "b", fps=10, features=FEATURES)
    ep = episode(5, 0, np.random.default_rng(0))
    w.add_episode(ep, task="t")
    bad = dict(ep)
    del bad["action"]
    with pytest.raises(ValueError, match=r"episode 1: missing keys \['action'\]"):
        w.add_episode(bad, task="t")
    bad = dict(ep, action=np.zeros((5, 4), np.float32))
    with pytest.raises(ValueError, match=r"episode 1: action has per-frame shape \(4,\), expected \(3,\)"):
        w.add_episode(bad, task="t")
    bad = dict(ep, action=np.full((5, 3), np.nan, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        w.add_episode(bad, task="t")
    w.abort()
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


def test_corrupt_inputs_are_named(tmp_path):
    root = tmp_path / "c"
    write_dataset(root, lengths=(6, 7))
    data_file = root / "data/chunk-000/file-000.parquet"
    raw = data_file.read_bytes()
    data_file.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=r"file-000.parquet: corrupt or truncated parquet"):
        LeRobotDataset(root)
    data_file.write_bytes(raw)
    video = root / "videos/observation.images.scene/chunk-000/file-000.mp4"
    video.write_bytes(video.read_bytes()[:200])
    ds = LeRobotDataset(root)
    with pytest.raises(ValueError, match=r"episode \d, observation.images.scene: .*file-000.mp4"):
        ds[3]


def test_timestamp_tolerance(tmp_path):
    root = tmp_path / "d"
    write_dataset(root, lengths=(6,))
    ds = LeRobotDataset(root)
    reader = ds._reader("observation.images.scene", ds.episodes[0])
    with pytest.raises(ValueError, match="no frame within"):
        reader.frame_at(0.05, tolerance_s=1e-4)
    import pyarrow as pa

    f = root / "data/chunk-000/file-000.parquet"
    t = pq.read_table(f)
    ts = t["timestamp"].to_numpy().copy()
    ts[3] += 0.02
    t = t.set_column(t.schema.get_field_index("timestamp"), "timestamp", pa.array(ts, pa.float32()))
    pq.write_table(t, f)
    with pytest.raises(ValueError, match=r"episode 0: timestamp .* of frame 3"):
        LeRobotDataset(root)


def test_yuv444_lossless_video_keeps_small_colored_objects(tmp_path):
    """yuv420p halves color resolution: the edges of a 7-px colored square come back visibly wrong.
    yuv444p at crf 0 decodes to the written pixels up to the RGB->YUV rounding."""
    feats = {"observation.images.scene": FEATURES["observation.images.scene"], "action": FEATURES["action"]}
    rng = np.random.default_rng(0)
    frames = np.full((6, 32, 32, 3), 180, np.uint8)
    for f in frames:
        x, y = rng.integers(0, 24, 2)
        f[y : y + 7, x : x + 7] = (230, 25, 25)
    ep = {"observation.images.scene": frames, "action": np.zeros((6, 3), np.float32)}
    err = {}
    for pix, crf in (("yuv420p", None), ("yuv444p", 0)):
        w = LeRobotWriter(tmp_path / pix, fps=10, features=feats, video_pix_fmt=pix, video_crf=crf)
        w.add_episode(ep, task="t")
        w.finalize()
        info = json.loads((tmp_path / pix / "meta/info.json").read_text())
        assert info["features"]["observation.images.scene"]["info"]["video.pix_fmt"] == pix
        ds = LeRobotDataset(tmp_path / pix)
        got = np.stack([ds[i]["observation.images.scene"] for i in range(6)]).astype(int)
        err[pix] = np.abs(got - frames).max()
    assert err["yuv444p"] <= 1 < 60 < err["yuv420p"]
    with pytest.raises(ValueError, match="video_pix_fmt must be one of"):
        LeRobotWriter(tmp_path / "bad", fps=10, features=feats, video_pix_fmt="rgb24")
