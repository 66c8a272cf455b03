"""Hindsight grounding labels (``vla data hindsight``): the object and goal points read off the
demonstrations' own state and action columns, so a grounded policy trains without simulator labels."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from vlastack.sim.hindsight import hindsight_points

needs_mw = pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="metaworld not installed")


def test_hindsight_points_follow_the_gripper():
    """Episode 7 closes its gripper at frame 2: the object is the hand there until then and the hand
    after (it carries the object); the goal is the last hand. Episode 3 never closes: both are the
    last hand."""
    hand = np.arange(8 * 3, dtype=np.float64).reshape(8, 3)
    state = np.concatenate([hand, np.zeros((8, 1))], 1)
    grip = np.array([-1, -1, 0.6, 0.6, 0.6, 0, 0, 0])
    action = np.zeros((8, 4))
    action[:, 3] = grip
    episode = np.array([7, 7, 7, 7, 7, 3, 3, 3])
    out = hindsight_points(state, action, episode[:, None])
    assert out.shape == (8, 6) and out.dtype == np.float32
    np.testing.assert_array_equal(out[:2, :3], hand[[2, 2]])
    np.testing.assert_array_equal(out[2:5, :3], hand[2:5])
    np.testing.assert_array_equal(out[:5, 3:], np.repeat(hand[4][None], 5, 0))
    np.testing.assert_array_equal(out[5:, :3], np.repeat(hand[7][None], 3, 0))
    np.testing.assert_array_equal(out[5:, 3:], np.repeat(hand[7][None], 3, 0))
    # A command that only wobbles (below CLOSE_MARGIN) is not a grasp.
    action[5:, 3] = [0.0, 0.05, 0.0]
    np.testing.assert_array_equal(hindsight_points(state, action, episode)[5:], out[5:])


def test_hindsight_points_refuse_bad_input():
    s, a = np.zeros((4, 4)), np.zeros((4, 4))
    with pytest.raises(ValueError, match="not contiguous"):
        hindsight_points(s, a, np.array([0, 1, 0, 1]))
    with pytest.raises(ValueError, match="state must be"):
        hindsight_points(np.zeros((4, 2)), a, np.zeros(4))
    with pytest.raises(ValueError, match="action must be"):
        hindsight_points(s, np.zeros((3, 4)), np.zeros(4))


@pytest.mark.integration
@needs_mw
def test_hindsight_dataset_replaces_the_simulator_labels(tmp_path, capsys):
    """A pick-place and a reach demonstration -> `vla data hindsight`: the copy holds the 6 hindsight
    numbers where the 39-d simulator state was, their projections as the attention targets, the
    same frames and videos; the grasp point sits on the simulator's object (the hand holds it from
    above); the bookkeeping calls the copy's labels not privileged; the MT10 recipe trains on it."""
    from vlastack.cli import main
    from vlastack.data.reader import LeRobotDataset
    from vlastack.sim.generate import generate
    from vlastack.sim.metaworld import project

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.metaworld_protocol import label_source, privileged

    src, dst = tmp_path / "mw", tmp_path / "mw_hs"
    generate(src, suite="metaworld", tasks=("pick-place-v3", "reach-v3"), episodes_per_task=1, workers=0,
             image_size=32, seed=1000, render_quality="fast", progress=False)  # fmt: skip
    assert main(["data", "hindsight", str(src), "--out", str(dst)]) == 0
    assert (
        main(["data", "hindsight", str(src), "--out", str(dst)]) != 0 and "exists" in capsys.readouterr().err
    )
    ft = json.loads((dst / "meta/info.json").read_text())["features"]
    assert ft["observation.environment_state"]["shape"] == [6]
    assert ft["observation.environment_state"]["names"][0] == "hindsight_object_x"
    assert (label_source(src), label_source(dst)) == ("simulator", "hindsight")

    a, b = LeRobotDataset(src), LeRobotDataset(dst)
    assert len(a) == len(b)
    sim, hs = a.columns["observation.environment_state"], b.columns["observation.environment_state"]
    uv = b.columns["observation.environment_uv.image"]
    np.testing.assert_allclose(uv, project(hs.reshape(-1, 2, 3), "image").reshape(-1, 4), atol=1e-6)
    np.testing.assert_array_equal(
        np.asarray(a[5]["observation.image"]), np.asarray(b[5]["observation.image"])
    )
    lo, hi = a.episode_range(0)  # pick-place: grasped at some frame t
    grip = a.columns["action"][lo:hi, 3]
    t = int(np.flatnonzero(grip > grip[0] + 0.1)[0])
    np.testing.assert_allclose(hs[lo, :3], a.columns["observation.state"][lo + t, :3])
    off = hs[lo, :3] - sim[lo, 4:7]  # measured on 50 MT10 layouts: (-0.5, -0.2, 6.7) cm, spread <= 0.2 cm
    assert np.abs(off[:2]).max() < 0.02 and 0.03 < off[2] < 0.10, off
    np.testing.assert_array_equal(
        hs[lo:hi, 3:], np.repeat(a.columns["observation.state"][hi - 1 : hi, :3], hi - lo, 0)
    )
    a.close()
    b.close()

    row = {"train_config": {"recipe": "metaworld_mt10", "model.grounding": {"points": 2},
                            "grounding_labels": label_source(dst)}}  # fmt: skip
    assert not privileged(row)
    row["train_config"]["grounding_labels"] = "simulator"
    assert privileged(row)

    run = tmp_path / "run"
    rc = main(["train", "--config", "metaworld_mt10", "--data", str(dst), "--out", str(run),
               "model.grounding.state_index=[]", "train.steps=2", "train.compile=false",
               "train.precision=fp32", "train.save_every=2", "data.num_workers=0", "train.warmup_steps=1",
               "model.vision.image_size=32", "model.vision.patch_size=8"])  # fmt: skip
    assert rc == 0 and (run / "final").is_dir()
