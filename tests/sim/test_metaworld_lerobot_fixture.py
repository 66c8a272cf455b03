"""The real ``lerobot`` (0.6.1) reads our Meta-World data as vlastack's own reader does.

``fixtures/metaworld_lerobot/lerobot_view.json`` was frozen by ``scripts/make_metaworld_lerobot_fixture.py``:
LeRobot's ``LeRobotDataset`` opened a tiny dataset written by ``vla data generate --suite metaworld`` (reach-v3
and push-v3, one episode each, 64 px). Here the same dataset is regenerated with ``generate()`` and read with
``vlastack.data.reader.LeRobotDataset``, which must see what LeRobot saw: metadata, tasks, episode boundaries,
and the first and last frame of every episode (state, action, environment state, timestamps, indices exactly;
images by shape and mean: LeRobot returns float CHW in [0, 1], and renderers and H.264 decoders may differ
slightly, hence the 0.01 tolerance). A changed expert, layout seed or writer shows up here too.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "metaworld_lerobot" / "lerobot_view.json"
IMAGE_MEAN_TOL = 0.01  # [0, 1] units
pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("metaworld") is None, reason="metaworld not installed (optional extra)"
    ),
    pytest.mark.integration,  # the module's dataset fixture renders Meta-World episodes (23-35 s)
]


@pytest.fixture(scope="module")
def view() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def dataset(view, tmp_path_factory):
    from vlastack.data.reader import LeRobotDataset
    from vlastack.sim import generate as gen

    a = view["generate_args"]
    root = tmp_path_factory.mktemp("mw_lerobot") / "ds"
    cached = set(gen._ENVS)
    gen.generate(
        root,
        suite=a["suite"],
        tasks=a["tasks"],
        episodes_per_task=a["episodes_per_task"],
        image_size=a["image_size"],
        seed=a["seed"],
        render_quality=a["render_quality"],
        workers=0,
        progress=False,
    )
    ds = LeRobotDataset(root)
    yield ds
    ds.close()
    for key in set(gen._ENVS) - cached:  # free our GL contexts now, not in interpreter teardown
        gen._ENVS.pop(key).close()


def test_metadata_as_lerobot_reads_it(view, dataset):
    meta, info = view["meta"], dataset.info
    assert info["codebase_version"] == view["codebase_version"] == "v3.0"
    assert dataset.fps == meta["fps"] and info["robot_type"] == meta["robot_type"]
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (
        meta["total_episodes"],
        meta["total_frames"],
        meta["total_tasks"],
    )
    assert len(dataset) == view["num_frames"] and dataset.num_episodes == meta["total_episodes"]
    assert dataset.camera_keys == meta["camera_keys"]
    ours = {
        k: {"dtype": f["dtype"], "shape": list(f["shape"]), "names": f.get("names")}
        for k, f in info["features"].items()
    }
    # The fixture was frozen before the generator recorded LeRobot's per-frame reward and success:
    # they must be declared exactly as lerobot/metaworld_mt50's meta/info.json declares them.
    for key, dtype in (("next.reward", "float32"), ("next.success", "bool")):
        if key not in meta["features"]:
            assert ours.pop(key) == {"dtype": dtype, "shape": [1], "names": None}, key
    assert ours == meta["features"]


def test_episodes_and_frames_as_lerobot_reads_them(view, dataset):
    for k, ep in enumerate(view["episodes"]):
        e = dataset.episodes[k]
        assert int(e["episode_index"]) == ep["episode_index"] and list(e["tasks"]) == ep["tasks"]
        assert int(e["length"]) == ep["length"]
        assert dataset.episode_range(k) == (ep["dataset_from_index"], ep["dataset_to_index"])
        for want in ep["frames"]:
            item = dataset[want["index"]]
            where = f"episode {k} frame {want['frame_index']}"
            assert item["task"] == want["task"] == ep["tasks"][0], where
            for key in ("index", "frame_index", "episode_index", "task_index", "task_id"):
                assert int(item[key]) == want[key], (where, key)
            assert float(item["timestamp"]) == pytest.approx(want["timestamp"], abs=1e-6), where
            uv = "observation.environment_uv.image"  # vlastack's grounding supervision (`vla data add-uv`)
            for key in ("observation.state", "action", "observation.environment_state", uv):
                np.testing.assert_allclose(
                    item[key], np.float32(want[key]), rtol=0, atol=1e-6, err_msg=f"{where} {key}"
                )
            for cam in view["meta"]["camera_keys"]:
                img, lr = item[cam], want[cam]  # ours: uint8 HWC; LeRobot's: float32 CHW in [0, 1]
                assert img.dtype == np.uint8 and lr["dtype"] == "float32", where
                assert list(img.shape) == [lr["shape"][1], lr["shape"][2], lr["shape"][0]], where
                assert img.mean() / 255 == pytest.approx(lr["mean"], abs=IMAGE_MEAN_TOL), where
                np.testing.assert_allclose(
                    img.mean(axis=(0, 1)) / 255, lr["channel_means"], atol=IMAGE_MEAN_TOL
                )
