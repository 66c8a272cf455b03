"""Meta-World as LeRobot runs it. Meta-World pins mujoco==3.3.0, as vlastack does; it is the optional
extra ``vlastack[metaworld]`` (part of the dev extras), so these tests run in CI. Env tests are
skipped only where the extra is absent. The end-to-end test is the CI-sized benchmark: two tasks
through generate, a few training steps of the MT10 recipe, and lerobot-eval's protocol."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from vlastack.sim.env import suite_tasks
from vlastack.sim.metaworld_tasks import DESCRIPTIONS, GROUPS, MT10, MT50, TASK_IDS, expand_tasks, group_of

HAS_MW = importlib.util.find_spec("metaworld") is not None
needs_mw = pytest.mark.skipif(
    not HAS_MW, reason="metaworld not installed (optional extra; pins mujoco==3.3.0, install in its own venv)"
)


def test_lerobot_task_tables_and_sets():
    assert len(MT50) == len(DESCRIPTIONS) == len(TASK_IDS) == 50 and len(MT10) == 10
    assert {g: len(ts) for g, ts in GROUPS.items()} == {"easy": 28, "medium": 11, "hard": 6, "very_hard": 5}
    assert sorted(sum(GROUPS.values(), ())) == sorted(MT50)
    assert DESCRIPTIONS["reach-v3"] == "Reach a goal position" and TASK_IDS["window-close-v3"] == 49
    assert suite_tasks("metaworld") == MT10 and suite_tasks("metaworld", ("MT50",)) == MT50
    assert expand_tasks(["hard", "push-v3", "metaworld-reach-v3"]) == (*GROUPS["hard"], "reach-v3")
    assert group_of("peg-insert-side-v3") == "medium"
    with pytest.raises(ValueError, match="unknown Meta-World task"):
        suite_tasks("metaworld", ("fly-v3",))
    # LeRobot's MT10 prompts fit the MT10 recipe's max_text_len and stay distinct when cut there.
    from vlastack.config import load_config

    for recipe, tasks in (("metaworld_mt10", MT10), ("metaworld_mt50", MT50)):
        n = load_config("tiny", recipe, []).model.max_text_len
        cut = {DESCRIPTIONS[t].encode()[:n] for t in tasks}
        assert len(cut) == len({DESCRIPTIONS[t] for t in tasks}), recipe


def test_missing_metaworld_gives_install_hint(monkeypatch):
    import sys

    from vlastack.sim.env import make_env

    for name in ("metaworld", "metaworld.env_dict", "metaworld.policies"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import metaworld...` fail, even if imported
    with pytest.raises(ImportError, match=r"\[metaworld\]"):
        make_env("reach-v3", suite="metaworld")


@pytest.mark.integration
@needs_mw
def test_metaworld_env_follows_lerobot():
    import mujoco

    from vlastack.sim.env import make_env
    from vlastack.sim.generate import rollout_expert
    from vlastack.sim.metaworld import LEROBOT_CORNER2_POS

    env = make_env("reach-v3", suite="metaworld", image_size=32, cameras=("image", "wrist"))
    assert env.max_steps == 500 and env.metadata["render_fps"] == 80
    cam = mujoco.mj_name2id(env.env.model, mujoco.mjtObj.mjOBJ_CAMERA, "corner2")
    assert np.allclose(env.env.model.cam_pos[cam], LEROBOT_CORNER2_POS)
    obs, _ = env.reset(seed=0)
    assert obs["images"]["image"].shape == (32, 32, 3) and obs["state"].shape == (4,)
    assert obs["prompt"] == "Reach a goal position" and env.raw_state().shape == (39,)
    assert np.allclose(obs["state"], env.raw_state()[:4])
    ep = rollout_expert(env, seed=1)
    assert ep["success"] and ep["action"].shape[1] == 4 and ep["env_state"].shape == (ep["length"], 39)
    goals = []
    for seed in (1, 2, 1):
        env.reset(seed=seed)
        goals.append(env.raw_state()[-3:].copy())  # the goal position
    assert not np.allclose(goals[0], goals[1]) and np.allclose(goals[0], goals[2])
    hand_to_goal = np.linalg.norm(env.raw_state()[:3] - goals[2])
    info = env.step(np.zeros(4, np.float32))[4]  # Meta-World's obj_to_target: for reach, the hand's
    assert abs(info["distance"] - hand_to_goal) < 0.02 and set(info) == {"task", "success", "distance"}
    env.close()
    with pytest.raises(ValueError, match="render_quality"):
        make_env("reach-v3", suite="metaworld", image_size=32, render_quality="best")


@pytest.mark.integration
@needs_mw
def test_metaworld_generate_train_eval_like_lerobot(tmp_path, capsys):
    """Generate 2 tasks x 2 episodes in LeRobot's layout, train the MT10 recipe a few steps, then
    score it by lerobot-eval's protocol; evaluating on the training layouts is refused."""
    from vlastack.cli import main
    from vlastack.data.reader import LeRobotDataset
    from vlastack.sim.evaluate import evaluate
    from vlastack.sim.generate import generate

    data = tmp_path / "mw"
    rep = generate(data, suite="metaworld", tasks=("reach-v3", "button-press-topdown-v3"), episodes_per_task=2,
                   workers=0, image_size=32, seed=1000, render_quality="fast", progress=False)  # fmt: skip
    info = json.loads((data / "meta/info.json").read_text())
    assert info["fps"] == 80 and info["robot_type"] == "metaworld"
    ft = info["features"]
    assert ft["observation.image"]["shape"] == [32, 32, 3] and ft["observation.state"]["shape"] == [4]
    assert ft["observation.environment_state"]["shape"] == [39] and ft["task_id"]["dtype"] == "int16"
    side = json.loads((data / "meta/vlastack_sim.json").read_text())
    assert [(e["task"], e["seed"]) for e in side["episode_info"]] == [
        ("reach-v3", 1000), ("reach-v3", 1001), ("button-press-topdown-v3", 1000), ("button-press-topdown-v3", 1001)
    ]  # fmt: skip
    assert rep["seed_scheme"] == "per_task"
    ds = LeRobotDataset(data)
    first = ds[0]
    assert first["task"] == "Reach a goal position" and int(np.asarray(first["task_id"]).reshape(-1)[0]) == 40
    # LeRobot's per-frame outcome columns: Meta-World's shaped reward and its success flag after the step.
    assert ft["next.reward"] == {"dtype": "float32", "shape": [1], "names": None}
    assert ft["next.success"] == {"dtype": "bool", "shape": [1], "names": None}
    reward, success = ds.columns["next.reward"], ds.columns["next.success"]
    assert reward.dtype == np.float32 and success.dtype == np.bool_
    for k in range(ds.num_episodes):
        lo, hi = ds.episode_range(k)
        assert success[hi - 1] and not success[lo : hi - 1].any(), k
        assert len(np.unique(reward[lo:hi])) > 2 and (reward[lo:hi] >= 0).all(), k  # shaped, not 0/1
    uv = np.stack([ds[i]["observation.environment_uv.image"] for i in range(len(ds))])
    ds.close()
    # `vla data add-uv` (for data made without it, e.g. LeRobot's own) computes the generator's values.
    assert main(["data", "add-uv", str(data)]) != 0 and "already has" in capsys.readouterr().err
    assert main(["data", "add-uv", str(data), "--overwrite"]) == 0
    ds = LeRobotDataset(data)
    np.testing.assert_array_equal(
        np.stack([ds[i]["observation.environment_uv.image"] for i in range(len(ds))]), uv
    )
    assert ((uv > 0) & (uv < 1)).all()
    assert main(["data", "add-uv", str(data), "--cameras", "wrist"]) != 0
    assert "moves with the robot" in capsys.readouterr().err

    run = tmp_path / "run"
    rc = main(["train", "--config", "metaworld_mt10", "--data", str(data), "--out", str(run),
               "train.steps=3", "train.compile=false", "train.precision=fp32", "train.log_every=1",
               "train.save_every=3", "data.num_workers=0", "train.warmup_steps=1", "model.vision.image_size=32",
               "model.vision.patch_size=8"])  # fmt: skip
    assert rc == 0
    ckpt = run / "final"
    from vlastack.infer.policy import Policy

    assert Policy.from_pretrained(ckpt).replan_steps == 1  # the recipe's eval.steps_per_chunk: one source
    seeds = json.loads((ckpt / "train_seeds.json").read_text())
    assert sorted(map(tuple, seeds["episodes"]))[0] == ("button-press-topdown-v3", 1000)
    tasks = ("reach-v3", "button-press-topdown-v3")
    with pytest.raises(ValueError, match="trained on"):  # lerobot-eval's seeds 1000+j: the training layouts
        evaluate(str(ckpt), suite="metaworld", tasks=tasks, episodes=1, seed=1000, seed_scheme="per_task",
                 num_workers=0, image_size=32, videos=0)  # fmt: skip
    out = tmp_path / "eval"
    rc = main(["eval", "--policy", str(ckpt), "--config", "metaworld_mt10", "--tasks", ",".join(tasks),
               "--episodes-per-task", "1", "--seed", "5000", "--workers", "0", "--image-size", "32",
               "--out", str(out), "--videos", "2", "--steps-per-chunk", "8", "eval.max_steps=40"])  # fmt: skip
    assert rc == 0
    res = json.loads((out / "eval.json").read_text())
    assert [(e["task"], e["seed"]) for e in res["episodes"]] == [(t, 5000) for t in tasks]
    assert all(e["steps"] <= 40 for e in res["episodes"]) and res["config"]["max_steps"] == 40
    assert set(res["groups"]) == {"easy"} and res["groups"]["easy"]["n"] == 2 and "group_average" not in res
    assert res["config"]["cameras"] == ["image"] and res["train_seeds"]["overlap"] == 0
    assert len(res["videos"]) == 2  # one per task
    assert "easy" in capsys.readouterr().out


@needs_mw
def test_points_uv_lands_on_the_rendered_goal():
    """``points_uv`` (the projection behind ``observation.environment_uv.image``) puts the goal where
    the renderer draws it: push's green and pick-place's blue goal marker, centroid within a pixel
    at 128 px (measured: within 0.1 px). Frame 0 is skipped: Meta-World's reset moves the goal site
    without a forward pass, so the first frame still draws the previous layout's goal."""
    from vlastack.sim.metaworld import MetaWorldEnv, fixed_camera, points_uv

    for task, channel in (("push-v3", 1), ("pick-place-v3", 2)):
        env = MetaWorldEnv(task, image_size=128, render_quality="fast")
        for seed in (3, 1001):
            env.reset(seed=seed)
            img = env.step(np.zeros(4, np.float32))[0]["images"]["image"].astype(int)
            others = [c for c in range(3) if c != channel]
            mask = (img[..., channel] > 120) & (img[..., others[0]] < 80) & (img[..., others[1]] < 80)
            ys, xs = np.nonzero(mask)
            assert mask.sum() >= 5, (task, seed)
            uv = env.privileged_uv()["image"]
            np.testing.assert_allclose(uv, points_uv(env.raw_state()), rtol=0, atol=0)
            assert (
                abs((xs.mean() + 0.5) / 128 - uv[2]) < 1 / 128
                and abs((ys.mean() + 0.5) / 128 - uv[3]) < 1 / 128
            )
        env.close()
    assert fixed_camera("image") and not fixed_camera("wrist")
    with pytest.raises(ValueError, match="moves with the robot"):
        points_uv(np.zeros(39), "wrist")
    with pytest.raises(ValueError, match="39 wide"):
        points_uv(np.zeros(7))


@pytest.mark.integration
@needs_mw
def test_blind_expert_pass_plays_the_rendered_episode():
    """`vla data generate` plays Meta-World's expert blind first and renders only successes: the
    blind pass must be the same episode (rendering never changes the state). box-close-v3's
    expert succeeds seed 0 and fails seed 7 (all 500 steps, played only blind)."""
    from vlastack.sim import generate as gen
    from vlastack.sim.env import make_env

    kw = {"suite": "metaworld", "image_size": 32, "cameras": ("image",), "render_quality": "fast"}
    seen, blind = make_env("box-close-v3", **kw), make_env("box-close-v3", **{**kw, "cameras": ()})
    try:
        a, b = gen.rollout_expert(seen, 0), gen.rollout_expert(blind, 0)
        assert a["success"] and b["success"] and a["length"] == b["length"]
        np.testing.assert_array_equal(a["action"], b["action"])
        np.testing.assert_array_equal(a["env_state"], b["env_state"])
        for key in ("reward", "next_success"):
            np.testing.assert_array_equal(a[key], b[key])
        assert a["next_success"][-1] and a["reward"].dtype == np.float32
        done = gen._job("box-close-v3", 0, kw, 0.0)  # blind, then rendered
        np.testing.assert_array_equal(done["images"]["image"], a["images"]["image"])
        np.testing.assert_array_equal(done["reward"], a["reward"])
        failed = gen._job("box-close-v3", 7, kw, 0.0)  # blind only: ~1 ms a step, not ~0.1 s
        assert failed["success"] is False and failed["length"] == 500 and "images" not in failed
        assert "reward" not in failed and "next_success" not in failed
    finally:
        for env in [seen, blind, *gen._ENVS.values()]:
            env.close()
        gen._ENVS.clear()
