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
