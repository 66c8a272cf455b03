"""NaN and bad statistics in a dataset are found before training, by key and episode."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.faults.cli_trials import CLI_TRAIN
from tests.faults.helpers import edit_stats, set_value, write_small_dataset
from tests.faults.trials import cli, copy_tree
from vlastack.data.check import check_dataset


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return write_small_dataset(tmp_path_factory.mktemp("clean") / "ds")


def test_clean_dataset_passes(clean, capsys):
    assert check_dataset(clean) == []
    rc, err = cli(["data", "check", str(clean)])
    assert rc == 0, err


def test_nan_and_inf_are_reported_by_key_and_episode(clean, tmp_path):
    ds = copy_tree(clean, tmp_path / "ds")
    set_value(ds, "action", episode=1, frame=5, dim=2, value=np.nan)
    set_value(ds, "action", episode=2, frame=3, dim=0, value=np.nan)
    set_value(ds, "observation.state", episode=0, frame=0, dim=4, value=np.inf)
    found = {f.key: f for f in check_dataset(ds) if f.level == "error"}
    assert found["action"].episodes == (1, 2) and "first at episode 1 frame 5, dims [2]" in str(
        found["action"]
    )
    assert found["observation.state"].episodes == (0,) and "dims [4]" in found["observation.state"].message


def test_bad_stats_are_reported(clean, tmp_path):
    ds = copy_tree(clean, tmp_path / "ds")
    edit_stats(ds, "action", "std", [1.0, -1.0, 1.0])
    edit_stats(ds, "observation.state", "mean", [0.0, 0.0, float("nan"), 0.0, 0.0])
    edit_stats(ds, "action", "q01", [0.0, 0.0])  # wrong length
    msgs = [str(f) for f in check_dataset(ds)]
    assert any("action: meta/stats.json std is negative" in m for m in msgs), msgs
    assert any("observation.state: meta/stats.json 'mean' has non-finite" in m for m in msgs), msgs
    assert any("'q01' has 2 values, the feature has shape [3]" in m for m in msgs), msgs


def test_stale_stats_are_a_warning(clean, tmp_path):
    ds = copy_tree(clean, tmp_path / "ds")
    st = json.loads((ds / "meta" / "stats.json").read_text())
    edit_stats(ds, "action", "max", [v - 5 for v in st["action"]["max"]])
    warn = [f for f in check_dataset(ds) if f.level == "warning"]
    assert warn and warn[0].key == "action" and "outside meta/stats.json [min, max]" in warn[0].message


def test_shape_mismatch_is_reported(clean, tmp_path):
    ds = copy_tree(clean, tmp_path / "ds")
    info = json.loads((ds / "meta" / "info.json").read_text())
    info["features"]["action"]["shape"] = [4]
    (ds / "meta" / "info.json").write_text(json.dumps(info))
    found = check_dataset(ds)
    assert len(found) == 1 and "action has 3 values at frame 0, features say [4]" in str(found[0])
    assert cli(["data", "check", str(ds)])[0] == 1


def test_train_refuses_nan_data_naming_key_and_episode(clean, tmp_path):
    ds = copy_tree(clean, tmp_path / "ds")
    set_value(ds, "action", episode=2, frame=1, dim=1, value=np.nan)
    rc, err = cli(["train", "--data", str(ds), "--out", str(tmp_path / "run"), *CLI_TRAIN])
    assert rc == 2 and "Traceback" not in err, err
    assert "dataset check failed" in err and "action" in err and "episode 2 frame 1" in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before any step
