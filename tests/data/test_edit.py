"""``add_feature``: a column computed from a dataset's own columns joins the data files, info.json,
stats.json and the per-episode stats exactly as the writer would have written it."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.data.conftest import FEATURES, write_dataset
from vlastack.data.check import check_dataset
from vlastack.data.edit import add_feature
from vlastack.data.reader import LeRobotDataset
from vlastack.data.stats import exact_stats


def _double(cols: dict[str, np.ndarray]) -> np.ndarray:
    return 2.0 * cols["observation.state"][:, :2]


def test_add_feature_matches_a_dataset_written_with_it(tmp_path):
    root = tmp_path / "ds"
    data = write_dataset(root)
    ft = add_feature(root, "observation.twice", ["observation.state"], _double, names=["a", "b"])
    assert ft == {"dtype": "float32", "shape": [2], "names": ["a", "b"]}
    ds = LeRobotDataset(root)
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    start = 0
    for ep, d in enumerate(data):
        lo, hi = ds.episode_range(ep)
        assert (lo, hi) == (start, start + len(d["action"]))
        got = np.stack([ds[i]["observation.twice"] for i in range(lo, hi)])
        np.testing.assert_array_equal(got, (2.0 * d["observation.state"][:, :2]).astype(np.float32))
        row = episodes[ep]
        st = exact_stats(got.astype(np.float64))
        np.testing.assert_allclose(row["stats/observation.twice/mean"], st["mean"], rtol=1e-6)
        assert list(row["stats/observation.twice/count"]) == [hi - lo]
        np.testing.assert_array_equal(ds[lo]["action"], d["action"][0])  # the other columns are untouched
        start = hi
    ds.close()
    info = json.loads((root / "meta/info.json").read_text())
    assert info["features"]["observation.twice"] == ft and set(FEATURES) < set(info["features"])
    stats = json.loads((root / "meta/stats.json").read_text())
    everything = np.concatenate([2.0 * d["observation.state"][:, :2] for d in data])
    np.testing.assert_allclose(stats["observation.twice"]["max"], everything.max(0), rtol=1e-6)
    assert [f for f in check_dataset(root) if f.level == "error"] == []

    with pytest.raises(ValueError, match="already has feature"):
        add_feature(root, "observation.twice", ["observation.state"], _double)
    add_feature(root, "observation.twice", ["observation.state"], lambda c: 3.0 * c["observation.state"][:, :2],
                overwrite=True)  # fmt: skip
    ds = LeRobotDataset(root)
    np.testing.assert_allclose(
        ds[0]["observation.twice"], 3.0 * data[0]["observation.state"][0, :2], rtol=1e-6
    )
    ds.close()


def test_add_feature_refuses_bad_input(tmp_path):
    root = tmp_path / "ds"
    write_dataset(root, lengths=(4,))
    with pytest.raises(ValueError, match="needs feature"):
        add_feature(root, "x", ["observation.nope"], _double)
    with pytest.raises(ValueError, match=r"expected \[4, D\]"):
        add_feature(root, "x", ["observation.state"], lambda c: np.zeros(3))
    with pytest.raises(ValueError, match="not a LeRobot dataset"):
        add_feature(tmp_path, "x", ["observation.state"], _double)


def test_task_onehot_copy_replaces_every_environment_column(tmp_path):
    """``vla data task-onehot``: environment_state becomes the task as a one-hot (named by the task
    texts, the names the LeRobot policy server maps prompts by); the simulator's state and its image
    positions are gone from the copy, every other column is unchanged and the source is untouched."""
    from tests.data.conftest import episode
    from vlastack.cli import main
    from vlastack.data.lerobot import LeRobotWriter

    env = {"dtype": "float32", "shape": [6], "names": None}
    uv = {"dtype": "float32", "shape": [4], "names": None}
    feats = FEATURES | {"observation.environment_state": env, "observation.environment_uv.scene": uv}
    src, dst = tmp_path / "ds", tmp_path / "onehot"
    rng = np.random.default_rng(0)
    w = LeRobotWriter(src, fps=10, features=feats, robot_type="test")
    tasks = ["open the door", "close the door", "open the door"]
    for ep, (t, task) in enumerate(zip((7, 9, 5), tasks, strict=True)):
        d = episode(t, ep, rng) | {
            "observation.environment_state": rng.normal(size=(t, 6)).astype(np.float32),
            "observation.environment_uv.scene": rng.normal(size=(t, 4)).astype(np.float32),
        }
        w.add_episode(d, task=task)
    w.finalize()
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}

    assert main(["data", "task-onehot", str(src), "--out", str(dst)]) == 0
    info = json.loads((dst / "meta/info.json").read_text())
    ft = info["features"]["observation.environment_state"]
    assert ft["shape"] == [2] and ft["names"] == ["task=open the door", "task=close the door"]
    assert "observation.environment_uv.scene" not in info["features"]
    stats = json.loads((dst / "meta/stats.json").read_text())
    assert "observation.environment_uv.scene" not in stats
    np.testing.assert_allclose(stats["observation.environment_state"]["mean"], [12 / 21, 9 / 21], rtol=1e-6)
    eps = pq.read_table(dst / "meta/episodes/chunk-000/file-000.parquet").column_names
    assert not [c for c in eps if c.startswith("stats/observation.environment_uv")]
    a, b = LeRobotDataset(src), LeRobotDataset(dst)
    for i in range(len(a)):
        x, y = a[i], b[i]
        want = [1.0, 0.0] if x["task"] == "open the door" else [0.0, 1.0]
        np.testing.assert_array_equal(y["observation.environment_state"], want)
        assert "observation.environment_uv.scene" not in y
        for k in ("action", "observation.state", "observation.images.scene", "observation.images.wrist"):
            np.testing.assert_array_equal(np.asarray(x[k]), np.asarray(y[k]))
    a.close(), b.close()
    assert [f for f in check_dataset(dst) if f.level == "error"] == []
    assert before == {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    assert main(["data", "task-onehot", str(src), "--out", str(dst)]) != 0  # "exists": never overwritten


def test_drop_features_refuses_lerobot_columns_and_images(tmp_path):
    from vlastack.data.edit import drop_features

    root = tmp_path / "ds"
    write_dataset(root)
    for bad in ("index", "observation.images.scene"):
        with pytest.raises(ValueError, match="cannot drop"):
            drop_features(root, [bad])
    assert drop_features(root, ["no.such.key"]) == []
    assert drop_features(root, ["observation.state"]) == ["observation.state"]
    ds = LeRobotDataset(root)
    assert "observation.state" not in ds[0] and "observation.state" not in ds.stats
    ds.close()
