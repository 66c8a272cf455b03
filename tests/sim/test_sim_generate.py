"""`vla data generate`: parallel expert rollouts written as a LeRobot v3 dataset."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from vlastack.commands import sim as sim_cli
from vlastack.data.reader import LeRobotDataset
from vlastack.sim.generate import generate


def _run_cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    groups = {"data": sub.add_parser("data").add_subparsers()}
    sim_cli.register(sub, groups)
    args = p.parse_args(argv)
    return args.func(args)


def test_generate_cli_writes_lerobot_dataset(tmp_path, capsys):
    out = tmp_path / "demos"
    rc = _run_cli(["data", "generate", "--episodes", "8", "--out", str(out), "--workers", "2",
                   "--image-size", "32", "--noise", "0.1", "--seed", "5"])  # fmt: skip
    assert rc == 0 and "wrote 8 episodes" in capsys.readouterr().out
    info = json.loads((out / "meta/info.json").read_text())
    assert info["total_episodes"] == 8 and info["fps"] == 10
    assert info["features"]["observation.images.scene"]["shape"] == [32, 32, 3]
    assert info["features"]["action"]["shape"] == [4]
    side = json.loads((out / "meta/vlastack_sim.json").read_text())
    assert [e["task"] for e in side["episode_info"]] == ["reach", "push", "pick_place", "stack"] * 2
    assert [e["seed"] for e in side["episode_info"]] == list(range(5, 13))
    assert all(v == 1.0 for v in side["expert_success"].values())
    ds = LeRobotDataset(out)
    assert len(ds) == side["frames"]
    item = ds[len(ds) - 1]
    assert item["observation.images.wrist"].shape == (32, 32, 3)
    assert item["task"] == side["episode_info"][-1]["prompt"]
    assert np.isfinite(np.asarray(item["action"])).all()


def test_generate_is_reproducible_and_in_process(tmp_path):
    a = generate(tmp_path / "a", tasks=("push",), episodes=2, workers=0, image_size=32, noise=0.2, seed=3)
    b = generate(tmp_path / "b", tasks=("push",), episodes=2, workers=0, image_size=32, noise=0.2, seed=3)
    assert a["frames"] == b["frames"]
    ta = (tmp_path / "a/data/chunk-000/file-000.parquet").read_bytes()
    tb = (tmp_path / "b/data/chunk-000/file-000.parquet").read_bytes()
    assert ta == tb


def test_generate_records_reward_and_success_like_lerobot(tmp_path):
    """``next.reward`` float32 [1] and ``next.success`` bool [1] per frame, declared as LeRobot's sim
    datasets declare them: the outcome of the frame's step. A scripted episode (no settle) succeeds
    on its last step only; the built-in suite's reward is 1.0 there. The same seeds write the same
    bytes, and training samples ignore the columns (a copy without them, as an older dataset or
    LeRobot's own may be, gives the same samples)."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from vlastack.config import load_config
    from vlastack.data.samples import VLADataset
    from vlastack.sim.generate import REWARD_KEY, SUCCESS_KEY

    kw = {"tasks": ("reach", "push"), "episodes": 3, "workers": 0, "image_size": 16, "noise": 0.1, "seed": 11,
          "progress": False}  # fmt: skip
    generate(tmp_path / "a", **kw)
    generate(tmp_path / "b", **kw)
    info = json.loads((tmp_path / "a/meta/info.json").read_text())
    assert info["features"][REWARD_KEY] == {"dtype": "float32", "shape": [1], "names": None}
    assert info["features"][SUCCESS_KEY] == {"dtype": "bool", "shape": [1], "names": None}
    data = "data/chunk-000/file-000.parquet"
    schema = pq.read_schema(tmp_path / "a" / data)
    assert schema.field(REWARD_KEY).type == pa.float32() and schema.field(SUCCESS_KEY).type == pa.bool_()
    ds = LeRobotDataset(tmp_path / "a")
    reward, success = ds.columns[REWARD_KEY], ds.columns[SUCCESS_KEY]
    assert reward.dtype == np.float32 and success.dtype == np.bool_
    assert reward.shape == success.shape == (len(ds),)
    for k in range(ds.num_episodes):
        lo, hi = ds.episode_range(k)
        assert success[hi - 1] and not success[lo : hi - 1].any(), k
        np.testing.assert_array_equal(reward[lo:hi], success[lo:hi].astype(np.float32))
    assert ds.stats[SUCCESS_KEY]["max"].tolist() == [1.0] and ds.stats[REWARD_KEY]["min"].tolist() == [0.0]
    for rel in (data, "meta/episodes/chunk-000/file-000.parquet", "meta/stats.json", "meta/info.json"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel

    old = tmp_path / "old"  # the same dataset without the columns
    shutil.copytree(tmp_path / "a", old)
    pq.write_table(pq.read_table(old / data).drop_columns([REWARD_KEY, SUCCESS_KEY]), old / data)
    for rel in ("meta/info.json", "meta/stats.json"):
        meta = json.loads((old / rel).read_text())
        for key in (REWARD_KEY, SUCCESS_KEY):
            (meta["features"] if rel.endswith("info.json") else meta).pop(key)
        (old / rel).write_text(json.dumps(meta))
    cfg = load_config("tiny", overrides=["model.camera_names=[scene,wrist]"])
    new_ds, old_ds = VLADataset(cfg, tmp_path / "a"), VLADataset(cfg, old)
    assert REWARD_KEY not in old_ds.ds.columns
    for i in (0, len(new_ds) - 1):
        s, t = new_ds[i], old_ds[i]
        assert s.keys() == t.keys() and not any("reward" in k or "success" in k for k in s)
        for key in s:
            assert torch.equal(s[key], t[key]), (i, key)


def test_generate_rejects_seeds_overlapping_evaluation(tmp_path):
    with pytest.raises(ValueError, match="disjoint from evaluation seeds"):
        generate(tmp_path / "x", episodes=4, seed=999_999, workers=0)
    with pytest.raises(ValueError, match="unknown task"):
        generate(tmp_path / "y", tasks=("fly",), episodes=1, workers=0)


def test_generate_lossless_video_frames_equal_the_rendered_frames(tmp_path):
    """The demo's video_quality='lossless': what training decodes is what the simulator renders."""
    from vlastack.sim.env import make_env

    rep = generate(tmp_path / "d", tasks=("stack",), episodes=1, workers=0, image_size=32, seed=4,
                   video_quality="lossless")  # fmt: skip
    assert rep["video_quality"] == "lossless"
    env = make_env("stack", image_size=32)
    obs, _ = env.reset(seed=4)
    item = LeRobotDataset(tmp_path / "d")[0]
    for cam in ("scene", "wrist"):
        diff = np.abs(item[f"observation.images.{cam}"].astype(int) - obs["images"][cam].astype(int))
        assert diff.max() <= 1, cam
    with pytest.raises(ValueError, match="video_quality must be one of"):
        generate(tmp_path / "e", episodes=1, workers=0, video_quality="best")


def test_generate_records_environment_state_for_grounding(tmp_path):
    """Builtin demos carry the named object's and goal's positions per frame (privileged state), and
    a grounding model's samples get them normalized as ``env_state``."""
    from vlastack.config import load_config
    from vlastack.data.samples import ENV_KEY, VLADataset
    from vlastack.sim.env import make_env

    out = tmp_path / "d"
    generate(out, tasks=("reach", "stack"), episodes=2, workers=0, image_size=32, seed=7)
    ds = LeRobotDataset(out)
    assert ds.features[ENV_KEY]["shape"] == [6]
    for k, task in enumerate(("reach", "stack")):
        env = make_env(task, image_size=32)
        env.reset(seed=7 + k)
        first = ds[ds.episode_range(k)[0]]
        np.testing.assert_allclose(first[ENV_KEY], env.privileged_state(), atol=1e-6)
    cfg_over = ["model.camera_names=[scene,wrist]"]
    cfg = load_config("tiny", overrides=[*cfg_over, "model.grounding.points=2"])
    vds = VLADataset(cfg, out)
    s = vds[3]
    mean, std = (np.asarray(ds.stats[ENV_KEY][k], np.float32) for k in ("mean", "std"))
    np.testing.assert_allclose(s["env_state"].numpy(), (ds[3][ENV_KEY] - mean) / (std + 1e-8), atol=1e-4)
    with pytest.raises(ValueError, match="needs \\[9\\]"):
        VLADataset(load_config("tiny", overrides=["model.grounding.points=3"]), out)
    # model.grounding.state_index picks the points' dims (Meta-World's object 4:7 and goal 36:39).
    picked = load_config(
        "tiny", overrides=[*cfg_over, "model.grounding.points=1", "model.grounding.state_index=[3,4,5]"]
    )
    np.testing.assert_allclose(VLADataset(picked, out)[3]["env_state"].numpy(), s["env_state"].numpy()[3:])
    with pytest.raises(ValueError, match="reaches past"):
        VLADataset(
            load_config(
                "tiny",
                overrides=[*cfg_over, "model.grounding.points=1", "model.grounding.state_index=[4,5,6]"],
            ),
            out,
        )
    with pytest.raises(ValueError, match="state_index"):
        load_config("tiny", overrides=["model.grounding.points=2", "model.grounding.state_index=[0,1,2]"])
    # ... and where each camera sees those points, as recorded, for the head's attention loss.
    from vlastack.data.samples import ENV_UV_KEY

    for cam in ("scene", "wrist"):
        assert ds.features[f"{ENV_UV_KEY}.{cam}"]["shape"] == [4]
    env = make_env("reach", image_size=32)
    env.reset(seed=7)
    np.testing.assert_allclose(ds[0][f"{ENV_UV_KEY}.scene"], env.privileged_uv()["scene"], atol=1e-6)
    assert "env_uv" not in s
    over = [
        "model.camera_names=[wrist,scene]",
        "model.grounding.points=2",
        "model.grounding.attend_weight=0.1",
    ]
    s = VLADataset(load_config("tiny", overrides=over), out)[3]
    np.testing.assert_allclose(s["env_uv"].numpy(), ds[3][f"{ENV_UV_KEY}.wrist"])  # the first camera's
    over[0] = "model.camera_names=[top,scene]"  # no uv recorded for a camera the data lacks
    with pytest.raises(ValueError, match=r"environment_uv\.top"):
        VLADataset(load_config("tiny", overrides=over), out)


def test_per_task_generation_resumes_after_an_interruption(tmp_path, monkeypatch):
    """`--episodes-per-task` writes each task in blocks, each a finished part: a run stopped in the
    second task's second block keeps the blocks before it, and the re-run redoes only that block and
    ends with the data of an uninterrupted run; a run stopped in the merge merges again."""
    from vlastack.sim import generate as gen

    monkeypatch.setattr(gen, "PART_EPISODES", 1)  # a block per episode: two blocks per task

    kw = {
        "tasks": ("reach", "push"),
        "episodes_per_task": 2,
        "workers": 0,
        "image_size": 32,
        "progress": False,
    }
    # Fresh envs for every run: a renderer's first frames differ slightly from a warmed-up one's.
    monkeypatch.setattr(gen, "_ENVS", {})
    full = generate(tmp_path / "full", **kw)
    monkeypatch.setattr(gen, "_ENVS", {})
    real_job, calls = gen._job, []

    def stop_in_push(task, *a, **k):
        calls.append(task)
        if calls.count("push") == 2:  # push's second block
            raise KeyboardInterrupt
        return real_job(task, *a, **k)

    monkeypatch.setattr(gen, "_job", stop_in_push)
    with pytest.raises(KeyboardInterrupt):
        generate(tmp_path / "ds", **kw)
    finished = sorted(
        str(p.parent.parent.relative_to(tmp_path))
        for p in tmp_path.glob("ds.parts/*/*/meta/vlastack_sim.json")
    )
    assert finished == ["ds.parts/push/000", "ds.parts/reach/000", "ds.parts/reach/001"]
    assert not (tmp_path / "ds").exists()
    calls.clear()
    monkeypatch.setattr(gen, "_ENVS", {})
    monkeypatch.setattr(gen, "_job", lambda task, *a, **k: calls.append(task) or real_job(task, *a, **k))
    real_merge = gen._merge_parts

    def stop_in_merge(parts, out, *a):  # the merge dies after writing part of the dataset
        (out / "meta").mkdir(parents=True)
        (out / "meta" / "info.json").write_text("{")
        raise KeyboardInterrupt

    monkeypatch.setattr(gen, "_merge_parts", stop_in_merge)
    with pytest.raises(KeyboardInterrupt):
        generate(tmp_path / "ds", **kw)
    assert calls == ["push"] and (tmp_path / "ds.parts/push/001/meta/vlastack_sim.json").is_file()
    monkeypatch.setattr(gen, "_merge_parts", real_merge)
    resumed = generate(tmp_path / "ds", **kw)  # merges again over the unfinished output
    assert calls == ["push"] and not (tmp_path / "ds.parts").exists()  # no block was re-run
    assert resumed["episodes"] == full["episodes"] == 4 and resumed["frames"] == full["frames"]
    a, b = LeRobotDataset(tmp_path / "full"), LeRobotDataset(tmp_path / "ds")
    for key in ("observation.state", "action", "next.reward", "next.success", "episode_index", "task_index"):
        np.testing.assert_array_equal(np.asarray(a.columns[key]), np.asarray(b.columns[key]))
    for i in range(0, len(a), 7):
        assert np.array_equal(
            a.image("observation.images.scene", i), b.image("observation.images.scene", i)
        ), i
    side = json.loads((tmp_path / "ds/meta/vlastack_sim.json").read_text())
    assert [(e["task"], e["seed"], e["episode_index"]) for e in side["episode_info"]] == [
        ("reach", 0, 0), ("reach", 1, 1), ("push", 0, 2), ("push", 1, 3)
    ]  # fmt: skip
    with pytest.raises(ValueError, match="other settings"):
        (tmp_path / "x.parts").mkdir()
        (tmp_path / "x.parts/settings.json").write_text("{}")
        generate(tmp_path / "x", **kw)
