"""Scripted-expert demonstrations -> a LeRobot v3 dataset (``vla data generate``).

Rollouts run in spawned worker processes that return episode arrays; the main process alone
writes, through ``vlastack.data.lerobot.LeRobotWriter``. Only successful episodes are recorded
(failed seeds are replaced by fresh ones); the expert's success rate is reported and saved.

Noise (DART-style): the executed action is the expert's plus Gaussian noise of std ``noise`` on
dx, dy, dz, while the recorded ``action`` is the clean expert action for the state actually seen,
so demos cover small deviations together with the correction back.

Episode ``k`` uses task ``tasks[k % len(tasks)]`` and seed ``seed + k``. The instruction is the
LeRobot task string; ``meta/vlastack_sim.json`` keeps suite, family, seed and prompt per episode.

The builtin suite also records ``observation.environment_state``: the task's two key points (the
object the instruction names and its goal, metres; ``env.privileged_state()``) per frame, as
LeRobot does for privileged simulator state, and ``observation.environment_uv.<camera>``: where
each camera images those two points (fractions of the image, ``SimCore.project``). ``model.grounding``
trains on them; policies never receive them.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from vlastack.progress import Progress

EVAL_SEED_START = 1_000_000  # EvalConfig.seed: generation seeds must stay below it
STATE_NAMES = ["ee_x", "ee_y", "ee_z", "gripper_opening", "holding"]
ACTION_NAMES = ["dx", "dy", "dz", "grip"]
ENV_STATE_NAMES = ["object_x", "object_y", "object_z", "goal_x", "goal_y", "goal_z"]
ENV_UV_NAMES = ["object_u", "object_v", "goal_u", "goal_v"]
# name -> (pix_fmt, crf): "standard" is LeRobot's yuv420p; "lossless" keeps the exact rendered
# colors, so training frames match what a policy sees from the simulator (see data/video.py).
VIDEO_QUALITY = {"standard": ("yuv420p", None), "lossless": ("yuv444p", 0)}
_ENVS: dict[tuple, Any] = {}  # (task, env kwargs) -> env, reused across jobs in one process


def rollout_expert(
    env, seed: int, noise: float = 0.0, privileged: bool = False, settle: int = 0
) -> dict[str, Any]:
    """One expert episode -> {success, prompt, length, images {cam: uint8 [T,H,W,3]}, state, action}.

    ``privileged``: also record ``env.privileged_state()`` per step as ``"privileged"`` float32 [T, 6]
    and ``env.privileged_uv()`` as ``"privileged_uv"`` {cam: float32 [T, 4]}. ``settle``: after a
    success, record this many more expert steps (it keeps tracking or holding), so action chunks
    near the goal are defined past their first actions: asynchronous execution runs a chunk's
    later actions (infer/realtime.py). 0 (the default, the demo's data) stops at the success.
    """
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng([seed, 7])
    imgs: dict[str, list] = {c: [] for c in obs["images"]}
    states, actions, keys, ok = [], [], [], False
    uvs: dict[str, list] = {c: [] for c in obs["images"]}
    extra = 0
    for _ in range(env.max_steps + settle):
        a = np.asarray(env.expert_action(), np.float32)
        for c, im in obs["images"].items():
            imgs[c].append(im)
        states.append(obs["state"])
        if privileged:
            keys.append(env.privileged_state())
            for c, uv in env.privileged_uv().items():
                uvs[c].append(uv)
        actions.append(a)
        act = a.copy()
        if noise > 0:
            act[:3] = np.clip(act[:3] + rng.normal(0.0, noise, 3), -1.0, 1.0)
        obs, _, terminated, truncated, info = env.step(act)
        if ok:
            extra += 1
            if extra >= settle:
                break
        elif terminated or truncated:
            ok = bool(info.get("success", terminated))
            if not ok or settle == 0:
                break
    ep = {
        "success": ok,
        "prompt": obs["prompt"],
        "length": len(actions),
        "images": {c: np.stack(v) for c, v in imgs.items()},
        "state": np.stack(states).astype(np.float32),
        "action": np.stack(actions).astype(np.float32),
    }
    if privileged:
        ep["privileged"] = np.stack(keys)
        ep["privileged_uv"] = {c: np.stack(v) for c, v in uvs.items()}
    return ep


def _job(task: str, seed: int, env_kw: dict, noise: float, settle: int = 0) -> dict[str, Any]:
    from vlastack.sim.env import make_env

    # Keyed by the env settings too: an in-process caller may generate at another image size.
    key = (task, *sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in env_kw.items()))
    if key not in _ENVS:
        _ENVS[key] = make_env(task, **env_kw)
    privileged = env_kw.get("suite") in ("builtin", "dynamic")
    ep = rollout_expert(_ENVS[key], seed, noise, privileged=privileged, settle=settle)
    ep.update(task=task, seed=seed)
    if not ep["success"]:  # don't ship frames we will not write
        for k in ("images", "state", "action", "privileged", "privileged_uv"):
            ep.pop(k, None)
    return ep


def generate(
    out: str | Path,
    suite: str = "builtin",
    tasks: tuple[str, ...] | list[str] = (),
    episodes: int = 100,
    workers: int = 2,
    image_size: int = 64,
    cameras: tuple[str, ...] | list[str] = ("scene", "wrist"),
    noise: float = 0.0,
    seed: int = 0,
    overwrite: bool = False,
    video_quality: str = "standard",
    progress: bool = True,
    settle: int = 0,
) -> dict[str, Any]:
    """Write ``episodes`` successful expert demos to a LeRobot v3 dataset at ``out``; returns a report.

    ``progress``: show a live bar (episodes/s, ETA, the expert's success so far); ``settle``: see
    ``rollout_expert``."""
    from vlastack.data.lerobot import LeRobotWriter
    from vlastack.data.samples import ENV_KEY, ENV_UV_KEY
    from vlastack.sim.env import make_env, suite_tasks

    names = suite_tasks(suite, tuple(tasks))
    if episodes < 1 or workers < 0 or noise < 0:
        raise ValueError("need episodes >= 1, workers >= 0 and noise >= 0")
    if video_quality not in VIDEO_QUALITY:
        raise ValueError(f"video_quality must be one of {sorted(VIDEO_QUALITY)}, got {video_quality!r}")
    pix_fmt, crf = VIDEO_QUALITY[video_quality]
    max_attempts = 2 * episodes + 10
    if seed < 0 or seed + max_attempts > EVAL_SEED_START:
        raise ValueError(
            f"generation seeds {seed}..{seed + max_attempts} must lie in [0, {EVAL_SEED_START}) to stay "
            "disjoint from evaluation seeds"
        )
    env_kw = {"image_size": image_size, "cameras": tuple(cameras), "suite": suite}
    probe = make_env(names[0], **env_kw)
    state_dim, action_dim = probe.observation_space["state"].shape[0], probe.action_space.shape[0]
    fps = int(probe.metadata.get("render_fps", 10))
    probe.close()
    img_ft = {
        "dtype": "video",
        "shape": [image_size, image_size, 3],
        "names": ["height", "width", "channels"],
    }
    features = {f"observation.images.{c}": dict(img_ft) for c in cameras}
    features["observation.state"] = {"dtype": "float32", "shape": [state_dim], "names": None}
    features["action"] = {"dtype": "float32", "shape": [action_dim], "names": None}
    if suite in ("builtin", "dynamic"):
        features["observation.state"]["names"] = STATE_NAMES
        features["action"]["names"] = ACTION_NAMES
        features[ENV_KEY] = {
            "dtype": "float32",
            "shape": [len(ENV_STATE_NAMES)],
            "names": ENV_STATE_NAMES,
        }
        for c in cameras:
            features[f"{ENV_UV_KEY}.{c}"] = {"dtype": "float32", "shape": [4], "names": ENV_UV_NAMES}
    writer = LeRobotWriter(
        out,
        fps=fps,
        features=features,
        robot_type=f"vlastack_{suite}",
        overwrite=overwrite,
        video_pix_fmt=pix_fmt,
        video_crf=crf,
    )

    t0 = time.perf_counter()
    meta: list[dict] = []
    attempts: dict[str, list[int]] = {t: [0, 0] for t in names}  # task -> [tries, successes]
    next_k = 0
    ex = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) if workers > 0 else None
    bar = Progress(episodes, "generate", "episode", enabled=progress)
    try:
        while len(meta) < episodes:
            if next_k >= max_attempts:
                raise RuntimeError(f"the expert failed too often: {len(meta)} successes in {next_k} attempts")
            want = episodes - len(meta)
            ks = range(next_k, next_k + want)
            next_k += want
            args = [(names[k % len(names)], seed + k, env_kw, noise, settle) for k in ks]
            results = ex.map(_job, *zip(*args)) if ex else (_job(*a) for a in args)
            for ep in results:
                attempts[ep["task"]][0] += 1
                if not ep["success"]:
                    continue
                attempts[ep["task"]][1] += 1
                data = {f"observation.images.{c}": ep["images"][c] for c in cameras}
                data.update({"observation.state": ep["state"], "action": ep["action"]})
                if "privileged" in ep:
                    data[ENV_KEY] = ep["privileged"]
                    data.update({f"{ENV_UV_KEY}.{c}": v for c, v in ep["privileged_uv"].items()})
                idx = writer.add_episode(data, task=ep["prompt"])
                meta.append({"episode_index": idx, "task": ep["task"], "seed": ep["seed"],
                             "prompt": ep["prompt"], "length": ep["length"]})  # fmt: skip
                tries = sum(n for n, _ in attempts.values())
                bar.update(1, expert_success=f"{len(meta) / tries:.0%}")
                if len(meta) == episodes:
                    break
        root = writer.finalize()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
        if ex:
            ex.shutdown(cancel_futures=True)
    rates = {t: (s / n if n else None) for t, (n, s) in attempts.items()}
    report = {
        "suite": suite,
        "tasks": list(names),
        "episodes": len(meta),
        "attempts": sum(n for n, _ in attempts.values()),
        "expert_success": rates,
        "frames": int(sum(m["length"] for m in meta)),
        "image_size": image_size,
        "cameras": list(cameras),
        "noise": noise,
        "seed": seed,
        "video_quality": video_quality,
        "settle": settle,
        "wall_s": time.perf_counter() - t0,
    }
    (Path(root) / "meta" / "vlastack_sim.json").write_text(
        json.dumps({**report, "episode_info": meta}, indent=1)
    )
    return report
