"""Scripted-expert demonstrations -> a LeRobot v3 dataset (``vla data generate``).

Rollouts run in spawned worker processes that return episode arrays; the main process alone
writes, through ``vlastack.data.lerobot.LeRobotWriter``. Only successful episodes are recorded
(failed seeds are replaced by fresh ones); the expert's success rate is reported and saved.

Noise (DART-style): the executed action is the expert's plus Gaussian noise of std ``noise`` on
dx, dy, dz, while the recorded ``action`` is the clean expert action for the state actually seen,
so demos cover small deviations together with the correction back.

Action representation (builtin and dynamic suites, ``action_representation``): ``delta`` (the
default, the demo's data) records (dx, dy, dz, grip); ``absolute`` records (x, y, z, grip), the
gripper's target position, on the same trajectories (the noise is the same draw, in metres). It is
recorded in ``meta/vlastack_sim.json`` and the action's feature names; training carries it into the
policy (``model.action_representation``).

Seeds: with ``episodes``, attempt ``k`` uses task ``tasks[k % len(tasks)]`` and seed ``seed + k``;
with ``episodes_per_task`` (LeRobot's layout: N episodes of every task, in task order), attempt ``j``
of every task uses seed ``seed + j``, as ``lerobot-eval`` numbers its episodes. The instruction is
the LeRobot task string; ``meta/vlastack_sim.json`` keeps suite, task, seed and prompt per episode:
the evaluator reads it to refuse scoring a policy on layouts it was trained on.

Meta-World data is laid out like LeRobot's ``lerobot/metaworld_mt50``: ``observation.image`` (the
480x480 ``corner2`` frames LeRobot's environment gives), ``observation.state`` [4], ``action`` [4]
(names x, y, z, gripper), ``observation.environment_state`` [39] (Meta-World's full state),
``task_id`` (LeRobot's ``TASK_NAME_TO_ID``), 80 fps, robot_type ``metaworld``. One difference: the
frames are stored as video (LeRobot v3's default for cameras) instead of PNG inside the parquet; a
480x480 PNG is ~177 KB and ~30 ms to encode here, ~7 GB for MT10 (docs/metaworld.md).

The builtin suite also records ``observation.environment_state``: the task's two key points (the
object the instruction names and its goal, metres; ``env.privileged_state()``) per frame, as
LeRobot does for privileged simulator state, and ``observation.environment_uv.<camera>``: where
each camera images those two points (fractions of the image, ``SimCore.project``). ``model.grounding``
trains on them; policies never receive them.

Every suite also records, as LeRobot's sim datasets do (``lerobot/metaworld_mt50``, PushT, ...),
``next.reward`` (float32 [1]) and ``next.success`` (bool [1]) per frame: the reward the env gave for
the step that frame's action led to, and its ``info["success"]`` after that step. Meta-World's reward
is its own shaped one (``MetaWorldEnv.step`` passes it on, as LeRobot's environment does); the
built-in suites' is 1.0 on success, else 0.0. Without ``settle`` only an episode's last frame is a
success. Training ignores both (``data.samples`` picks its keys).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlastack.data.format import DEFAULT_FEATURES
from vlastack.folderlock import FolderLock
from vlastack.progress import Progress
from vlastack.sim.env import ALL_TASKS, LIBERO_SUITES, SUITES
from vlastack.sim.pool import worker_pool
from vlastack.sim.scene import MAX_DELTA, STATE_DIM

EVAL_SEED_START = 1_000_000  # EvalConfig.seed: generation seeds must stay below it
STATE_NAMES = ["ee_x", "ee_y", "ee_z", "gripper_opening", "holding"]
VELOCITY_NAMES = ["ee_vx", "ee_vy", "ee_vz"]  # fragile families (sim/fragile.py), metres per step
OWN_SUITES = tuple(SUITES)  # the built-in scene's suites: privileged state, named dims
ACTION_NAMES = ["dx", "dy", "dz", "grip"]
ABSOLUTE_ACTION_NAMES = ["x", "y", "z", "grip"]
ENV_STATE_NAMES = ["object_x", "object_y", "object_z", "goal_x", "goal_y", "goal_z"]
ENV_UV_NAMES = ["object_u", "object_v", "goal_u", "goal_v"]
# Per-frame outcome of the frame's step, declared as LeRobot declares them (lerobot/metaworld_mt50).
REWARD_KEY, SUCCESS_KEY = "next.reward", "next.success"
# name -> (pix_fmt, crf): "standard" is LeRobot's yuv420p; "lossless" keeps the exact rendered
# colors, so training frames match what a policy sees from the simulator (see data/video.py).
VIDEO_QUALITY = {"standard": ("yuv420p", None), "lossless": ("yuv444p", 0)}
_ENVS: dict[tuple, Any] = {}  # (task, env kwargs) -> env, reused across jobs in one process


def rollout_expert(
    env, seed: int, noise: float = 0.0, privileged: bool = False, settle: int = 0
) -> dict[str, Any]:
    """One expert episode -> {success, prompt, length, images {cam: uint8 [T,H,W,3]}, state, action,
    reward, next_success}: ``reward`` float32 [T] is what ``env.step`` returned for each frame's step,
    ``next_success`` bool [T] its ``info["success"]`` after that step.

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
    rewards: list[float] = []
    successes: list[bool] = []
    uvs: dict[str, list] = {c: [] for c in obs["images"]}
    raws: list[np.ndarray] = []
    has_raw = hasattr(env, "raw_state")  # Meta-World: the 39-dim state LeRobot stores
    extra = 0
    absolute = getattr(env, "action_representation", "delta") == "absolute"
    for _ in range(env.max_steps + settle):
        a = np.asarray(env.expert_action(), np.float32)
        for c, im in obs["images"].items():
            imgs[c].append(im)
        states.append(obs["state"])
        if has_raw:
            raws.append(env.raw_state())
        if privileged:
            keys.append(env.privileged_state())
            for c, uv in env.privileged_uv().items():
                uvs[c].append(uv)
        actions.append(a)
        act = a.copy()
        if noise > 0 and absolute:  # the same draw in metres: the env limits the step as for a delta
            act[:3] = act[:3] + rng.normal(0.0, noise, 3) * MAX_DELTA
        elif noise > 0:
            act[:3] = np.clip(act[:3] + rng.normal(0.0, noise, 3), -1.0, 1.0)
        obs, reward, terminated, truncated, info = env.step(act)
        rewards.append(float(reward))
        successes.append(bool(info.get("success", terminated)))
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
        "reward": np.asarray(rewards, np.float32),
        "next_success": np.asarray(successes, np.bool_),
    }
    if has_raw:
        ep["env_state"] = np.stack(raws)
    if privileged:
        ep["privileged"] = np.stack(keys)
        ep["privileged_uv"] = {c: np.stack(v) for c, v in uvs.items()}
    return ep


def _job(task: str, seed: int, env_kw: dict, noise: float, settle: int = 0) -> dict[str, Any]:
    from vlastack.sim.env import make_env

    def env(kw: dict):  # keyed by the settings too: an in-process caller may use another image size
        key = (task, *sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in kw.items()))
        if key not in _ENVS:
            _ENVS[key] = make_env(task, **kw)  # (its renderer closes itself at exit: render.close_at_exit)
        return _ENVS[key]

    if env_kw.get("suite") == "metaworld" and env_kw.get("cameras"):
        # A 480 px frame is ~all of a Meta-World step's time (72-82 ms against 1.3 ms blind, on a
        # 2-core EPYC), and a failed attempt runs all 500 steps: the expert is first played blind
        # (physics only: rendering reads the state, never changes it) and rendered only when it
        # succeeds. MT50 has ~30 failed attempts in 2,500 (~20 min of rendering); the blind pass
        # costs ~2% of a successful episode. Not LIBERO: its physics and hard resets are a quarter
        # of an episode (a 186-step libero_object episode: 6.4 s blind + a 2.9 s reset against
        # ~30 s rendered at 128 px), and its experts failed none of their 70 random placements
        # (bench/results/libero_expert.json).
        blind = rollout_expert(env({**env_kw, "cameras": ()}), seed, noise, settle=settle)
        if not blind["success"]:
            return {
                "success": False,
                "prompt": blind["prompt"],
                "length": blind["length"],
                "task": task,
                "seed": seed,
            }
    privileged = env_kw.get("suite") in OWN_SUITES
    ep = rollout_expert(env(env_kw), seed, noise, privileged=privileged, settle=settle)
    ep.update(task=task, seed=seed)
    if not ep["success"]:  # don't ship frames we will not write
        per_frame = ("images", "state", "action", "reward", "next_success", "privileged", "privileged_uv")
        for k in (*per_frame, "env_state"):
            ep.pop(k, None)
    return ep


def _image_key(suite: str, camera: str) -> str:
    """The dataset key of a camera's frames: LeRobot's LIBERO datasets name even the agentview
    ``image`` ``observation.images.image``; other suites follow ``camera_key``."""
    from vlastack.data.samples import camera_key

    return f"observation.images.{camera}" if suite in LIBERO_SUITES else camera_key(camera)


def _episode_features(
    suite: str, cameras, image_size: int, state_dim: int, action_dim: int, representation: str = "delta"
) -> dict:
    from vlastack.data.samples import ENV_KEY, ENV_UV_KEY

    img_ft = {
        "dtype": "video",
        "shape": [image_size, image_size, 3],
        "names": ["height", "width", "channels"],
    }
    features = {_image_key(suite, c): dict(img_ft) for c in cameras}
    features["observation.state"] = {"dtype": "float32", "shape": [state_dim], "names": None}
    features["action"] = {"dtype": "float32", "shape": [action_dim], "names": None}
    features[REWARD_KEY] = {"dtype": "float32", "shape": [1], "names": None}
    features[SUCCESS_KEY] = {"dtype": "bool", "shape": [1], "names": None}
    if suite in OWN_SUITES:
        extra = state_dim - len(STATE_NAMES)  # fragile families: + the velocity
        features["observation.state"]["names"] = STATE_NAMES + VELOCITY_NAMES[: max(0, extra)]
        features["action"]["names"] = ABSOLUTE_ACTION_NAMES if representation == "absolute" else ACTION_NAMES
        features[ENV_KEY] = {"dtype": "float32", "shape": [len(ENV_STATE_NAMES)], "names": ENV_STATE_NAMES}
        for c in cameras:
            features[f"{ENV_UV_KEY}.{c}"] = {"dtype": "float32", "shape": [4], "names": ENV_UV_NAMES}
    elif suite == "metaworld":  # as lerobot/metaworld_mt50's meta/info.json
        features["action"]["names"] = ["x", "y", "z", "gripper"]
        features[ENV_KEY] = {"dtype": "float32", "shape": [39], "names": ["keypoints"]}
        features["task_id"] = {"dtype": "int16", "shape": [1], "names": None}
        # Not in LeRobot's dataset (a function of ENV_KEY, for grounding supervision; `vla data add-uv`).
        from vlastack.sim.metaworld import fixed_camera

        for c in cameras:
            if fixed_camera(c):
                features[f"{ENV_UV_KEY}.{c}"] = {"dtype": "float32", "shape": [4], "names": ENV_UV_NAMES}
    return features


def generate(
    out: str | Path,
    suite: str = "builtin",
    tasks: tuple[str, ...] | list[str] = (),
    episodes: int | None = 100,
    workers: int = 2,
    image_size: int | None = None,
    cameras: tuple[str, ...] | list[str] | None = None,
    noise: float = 0.0,
    seed: int = 0,
    overwrite: bool = False,
    video_quality: str = "standard",
    progress: bool = True,
    settle: int = 0,
    episodes_per_task: int | None = None,
    render_quality: str = "lerobot",
    resumable: bool = True,
    action_representation: str = "delta",
    ray_address: str = "",
) -> dict[str, Any]:
    """Write successful expert demos to a LeRobot v3 dataset at ``out``; returns a report.

    ``episodes`` in total (round-robin over ``tasks``), or ``episodes_per_task`` for every task,
    written task by task. ``image_size``/``cameras`` default to the suite's (``make_env``).
    ``resumable`` (per-task mode): each task is first written in blocks of ``PART_EPISODES``
    episodes, each its own finished dataset under ``<out>.parts/`` (lossless video), so an
    interrupted run re-run with the same arguments skips the finished blocks; the parts are then
    merged into ``out`` (the same episodes, seeds and values as an uninterrupted run) and removed.
    ``progress``: show a live bar (episodes/s, ETA, the expert's success so far); ``settle``: see
    ``rollout_expert``; ``action_representation``: ``delta`` or ``absolute`` (module docstring).
    ``ray_address``: roll the episodes out on that Ray cluster instead of ``workers`` local
    processes (``sim.ray_pool.RayMap``): the same episodes, written in the same order."""
    # One generation per output: a second one into the same ``out`` (or its ``.parts``) would
    # interleave or delete the first's episodes. Refused at once, naming the running one's pid.
    out, full = Path(out), Path(out).resolve()
    with FolderLock(full.parent / f".{full.name}.lock", "vla data generate", f"dataset {out}",
                    "wait for that generation to finish, stop it, or write to another --out"):  # fmt: skip
        return _generate(out, suite, tasks, episodes, workers, image_size, cameras, noise, seed, overwrite,
                         video_quality, progress, settle, episodes_per_task, render_quality, resumable,
                         action_representation, ray_address)  # fmt: skip


def _generate(
    out: Path,
    suite: str,
    tasks: tuple[str, ...] | list[str],
    episodes: int | None,
    workers: int,
    image_size: int | None,
    cameras: tuple[str, ...] | list[str] | None,
    noise: float,
    seed: int,
    overwrite: bool,
    video_quality: str,
    progress: bool,
    settle: int,
    episodes_per_task: int | None,
    render_quality: str,
    resumable: bool,
    action_representation: str,
    ray_address: str = "",
) -> dict[str, Any]:
    from vlastack.data.lerobot import LeRobotWriter
    from vlastack.data.samples import ENV_KEY, ENV_UV_KEY
    from vlastack.sim.env import default_cameras, make_env, suite_tasks

    names = suite_tasks(suite, tuple(tasks))
    cameras = tuple(cameras) if cameras else default_cameras(suite)
    if episodes_per_task is not None:
        if episodes_per_task < 1:
            raise ValueError(f"need episodes_per_task >= 1, got {episodes_per_task}")
        episodes = episodes_per_task * len(names)
    if episodes is None or episodes < 1 or workers < 0 or noise < 0:
        raise ValueError("need episodes (or episodes_per_task) >= 1, workers >= 0 and noise >= 0")
    if video_quality not in VIDEO_QUALITY:
        raise ValueError(f"video_quality must be one of {sorted(VIDEO_QUALITY)}, got {video_quality!r}")
    pix_fmt, crf = VIDEO_QUALITY[video_quality]
    max_attempts = 2 * episodes + 10
    last_seed = seed + (2 * episodes_per_task + 10 if episodes_per_task else max_attempts)
    if seed < 0 or last_seed > EVAL_SEED_START:
        raise ValueError(
            f"generation seeds {seed}..{last_seed} must lie in [0, {EVAL_SEED_START}) to stay "
            "disjoint from evaluation seeds"
        )
    env_kw = {"image_size": image_size, "cameras": cameras, "suite": suite, "render_quality": render_quality}
    if suite in LIBERO_SUITES:
        # LIBERO fixes its 50 evaluation layouts; demonstrations come from the task's own random
        # placements (seeded), none of which is an evaluation layout.
        env_kw["init_states"] = False
    if action_representation != "delta":  # checked by make_env: builtin and dynamic suites only
        env_kw["action_representation"] = action_representation
    probe = make_env(names[0], **env_kw)
    state_dim, action_dim = probe.observation_space["state"].shape[0], probe.action_space.shape[0]
    if suite in OWN_SUITES:  # one dataset, one state layout
        dims = {n: STATE_DIM + ALL_TASKS[n].extra_state_dim for n in names}
        if len(set(dims.values())) > 1:
            raise ValueError(
                f"these tasks observe states of different sizes and cannot share a dataset: {dims} "
                "(the fragile families add the gripper's velocity; generate them apart)"
            )
    image_size = int(probe.observation_space["images"][cameras[0]].shape[0])
    fps = int(probe.metadata.get("render_fps", 10))
    probe.close()
    if episodes_per_task and resumable:
        kw = {"suite": suite, "episodes_per_task": episodes_per_task, "workers": workers, "image_size": image_size,
              "cameras": cameras, "noise": noise, "seed": seed, "progress": progress, "settle": settle,
              "render_quality": render_quality}  # fmt: skip
        if action_representation != "delta":  # (a delta run's settings stamp stays as it was)
            kw["action_representation"] = action_representation
        if ray_address:  # where it runs, not what it writes: not in the settings stamp
            kw["ray_address"] = ray_address
        return _generate_by_parts(Path(out), names, kw, video_quality, overwrite)
    writer = LeRobotWriter(
        out,
        fps=fps,
        features=_episode_features(suite, cameras, image_size, state_dim, action_dim, action_representation),
        robot_type={"metaworld": "metaworld", **dict.fromkeys(LIBERO_SUITES, "panda")}.get(
            suite, f"vlastack_{suite}"
        ),
        overwrite=overwrite,
        video_pix_fmt=pix_fmt,
        video_crf=crf,
    )
    task_ids: dict[str, int] = {}
    uv_cams: list[str] = []
    if suite == "metaworld":
        from vlastack.sim.metaworld import fixed_camera, points_uv
        from vlastack.sim.metaworld_tasks import TASK_IDS

        task_ids = TASK_IDS
        uv_cams = [c for c in cameras if fixed_camera(c)]

    t0 = time.perf_counter()
    meta: list[dict] = []
    attempts: dict[str, list[int]] = {t: [0, 0] for t in names}  # task -> [tries, successes]
    if ray_address:
        from vlastack.sim.ray_pool import RayMap

        ex: Any = RayMap(ray_address)
    else:
        ex = worker_pool(workers) if workers > 0 else None
    bar = Progress(episodes, "generate", "episode", enabled=progress)

    def write(ep: dict) -> None:
        data = {_image_key(suite, c): ep["images"][c] for c in cameras}
        data.update({"observation.state": ep["state"], "action": ep["action"]})
        data.update({REWARD_KEY: ep["reward"], SUCCESS_KEY: ep["next_success"]})
        if "privileged" in ep:
            data[ENV_KEY] = ep["privileged"]
            data.update({f"{ENV_UV_KEY}.{c}": v for c, v in ep["privileged_uv"].items()})
        if suite == "metaworld":
            data[ENV_KEY] = ep["env_state"]
            data["task_id"] = np.full(ep["length"], task_ids[ep["task"]], np.int16)
            # Where the fixed cameras image the object and the goal: grounding supervision
            # (model.grounding.attend_weight). A function of the state (metaworld.points_uv).
            data.update({f"{ENV_UV_KEY}.{c}": points_uv(ep["env_state"], c) for c in uv_cams})
        idx = writer.add_episode(data, task=ep["prompt"])
        meta.append({"episode_index": idx, "task": ep["task"], "seed": ep["seed"],
                     "prompt": ep["prompt"], "length": ep["length"]})  # fmt: skip

    def run(jobs: list[tuple[str, int]], want: int) -> int:
        """Roll out ``jobs`` (in order), write successes until ``want``; returns how many were written."""
        args = [(t, s, env_kw, noise, settle) for t, s in jobs]
        results = ex.map(_job, *zip(*args)) if ex else (_job(*a) for a in args)
        wrote = 0
        for ep in results:  # map keeps the submission order: episodes are written in seed order
            attempts[ep["task"]][0] += 1
            if not ep["success"] or wrote == want:
                continue
            attempts[ep["task"]][1] += 1
            write(ep)
            wrote += 1
            tries = sum(n for n, _ in attempts.values())
            bar.update(1, expert_success=f"{len(meta) / tries:.0%}")
        return wrote

    try:
        if episodes_per_task:  # task by task (LeRobot's layout), attempt j of a task = seed + j
            for t in names:
                j, have = 0, 0
                while have < episodes_per_task:
                    if j >= 2 * episodes_per_task + 10:
                        raise RuntimeError(
                            f"the expert failed too often on {t}: {have} successes in {j} attempts"
                        )
                    n = episodes_per_task - have
                    have += run([(t, seed + j + i) for i in range(n)], n)
                    j += n
        else:
            k = 0
            while len(meta) < episodes:
                if k >= max_attempts:
                    raise RuntimeError(f"the expert failed too often: {len(meta)} successes in {k} attempts")
                n = episodes - len(meta)
                run([(names[(k + i) % len(names)], seed + k + i) for i in range(n)], n)
                k += n
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
        "episodes_per_task": episodes_per_task,
        "seed_scheme": "per_task" if episodes_per_task else "round_robin",
        "attempts": sum(n for n, _ in attempts.values()),
        "expert_success": rates,
        "frames": int(sum(m["length"] for m in meta)),
        "image_size": image_size,
        "cameras": list(cameras),
        "noise": noise,
        "seed": seed,
        "video_quality": video_quality,
        "render_quality": render_quality,
        "settle": settle,
        "action_representation": action_representation,
        "wall_s": time.perf_counter() - t0,
    }
    (Path(root) / "meta" / "vlastack_sim.json").write_text(
        json.dumps({**report, "episode_info": meta}, indent=1)
    )
    return report


PARTS_SUFFIX = ".parts"
# A task's episodes are written in blocks of this many, each a finished dataset: an interrupted
# run loses at most one block (a LIBERO block is ~15-25 min on 2 cores, a whole task ~2 h).
PART_EPISODES = 10


def finished_blocks(part: Path) -> list[Path]:
    """A task's finished blocks under ``<parts>/<task>/`` in order (``000``, ``001``, ...); a part
    written whole by an older vlastack (``<parts>/<task>/meta``) is one block."""
    if (part / "meta" / "vlastack_sim.json").is_file():
        return [part]
    blocks = sorted(p for p in part.glob("[0-9][0-9][0-9]") if p.is_dir())
    return [b for b in blocks if (b / "meta" / "vlastack_sim.json").is_file()]


def episodes_written(out: str | Path, tasks: Sequence[str]) -> int:
    """Episodes in the finished blocks of an unfinished per-task generation into ``out`` (0 when
    it has not started)."""
    parts = Path(out).with_name(Path(out).name + PARTS_SUFFIX)
    blocks = [b for t in tasks for b in finished_blocks(parts / t)]
    return sum(json.loads((b / "meta" / "info.json").read_text())["total_episodes"] for b in blocks)


def _generate_by_parts(
    out: Path, names: tuple[str, ...], kw: dict, video_quality: str, overwrite: bool
) -> dict:
    """Per-task mode, resumable: each task written in blocks of ``PART_EPISODES`` episodes, each
    block a finished dataset under ``<out>.parts/<task>/<block>``, then one merge.

    Block b of a task starts at the seed after the attempts of blocks 0..b-1, so the blocks hold
    the task's first ``episodes_per_task`` expert successes in seed order, as one uninterrupted
    pass does. Parts are stored as lossless video (H.264 in YUV 4:4:4), so the merge re-encodes the
    frames as rendered: where a run was interrupted changes no episode, seed, value or frame (with
    freshly built envs: a renderer's first frames differ slightly from a warmed-up one's;
    tests/sim/test_sim_generate.py)."""
    parts = out.with_name(out.name + PARTS_SUFFIX)
    # A merge stopped midway leaves ``out`` without its closing record while the parts remain:
    # it is this generation's own unfinished output, so the re-run merges again over it.
    merge_stopped = (
        out.exists()
        and not (out / "meta" / "vlastack_sim.json").is_file()
        and (parts / "settings.json").is_file()
    )
    if out.exists() and not overwrite and not merge_stopped:
        raise ValueError(f"{out}: already exists (pass overwrite=True to replace it)")
    # What decides the content (not workers or the progress bar): a resumed run must match it.
    settings = {k: v for k, v in kw.items() if k not in ("workers", "progress", "ray_address")}
    settings.update(cameras=list(kw["cameras"]), tasks=list(names))
    stamp = parts / "settings.json"
    if parts.exists() and (not stamp.exists() or json.loads(stamp.read_text()) != settings):
        if not overwrite:
            raise ValueError(
                f"{parts}: holds parts of a generation with other settings; pass overwrite=True to discard them"
            )
        shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(settings))
    t0 = time.perf_counter()
    want = kw["episodes_per_task"]
    total = want * len(names)
    reports: list[dict] = []  # one per task: what one pass over the whole task would report
    blocks: list[Path] = []  # every block, in the merged dataset's order
    made, t_made = 0, 0.0  # episodes written by this run, and their time: the pace for the estimate
    for i, t in enumerate(names):
        part = parts / t
        done = finished_blocks(part)
        block_reports = [json.loads((b / "meta" / "vlastack_sim.json").read_text()) for b in done]
        have = sum(r["episodes"] for r in block_reports)
        while have < want:
            n = min(PART_EPISODES, want - have)
            start = kw["seed"] + sum(r["attempts"] for r in block_reports)
            if kw["progress"]:
                before = sum(r["episodes"] for r in reports) + have
                pace = f"; ~{(total - before) * t_made / made / 60:.0f} min left at this pace" if made else ""
                print(f"task {i + 1}/{len(names)}: {t}, episodes {have}..{have + n - 1} "
                      f"({before} of {total} done{pace})", flush=True)  # fmt: skip
            block = part / f"{len(done):03d}"
            t1 = time.perf_counter()
            generate(block, tasks=(t,), video_quality="lossless", overwrite=True, resumable=False,
                     **{**kw, "episodes_per_task": n, "seed": start})  # fmt: skip
            made, t_made = made + n, t_made + time.perf_counter() - t1
            done.append(block)
            block_reports.append(json.loads((block / "meta" / "vlastack_sim.json").read_text()))
            have += n
        blocks += done
        attempts = sum(r["attempts"] for r in block_reports)
        info = [e for r in block_reports for e in r["episode_info"]]
        reports.append({**block_reports[0], "episodes": have, "attempts": attempts, "episode_info": info,
                        "frames": sum(r["frames"] for r in block_reports),
                        "expert_success": {t: have / attempts}})  # fmt: skip
    _merge_parts(blocks, out, video_quality, overwrite or merge_stopped, kw["progress"])
    report = {**reports[0], "tasks": list(names), "video_quality": video_quality,
              "episodes": sum(r["episodes"] for r in reports), "attempts": sum(r["attempts"] for r in reports),
              "frames": sum(r["frames"] for r in reports), "wall_s": time.perf_counter() - t0,
              "seed": kw["seed"], "expert_success": {t: r["expert_success"][t] for t, r in zip(names, reports)}}  # fmt: skip
    info, k = [], 0
    for r in reports:
        for e in r["episode_info"]:
            info.append({**e, "episode_index": k})
            k += 1
    (out / "meta" / "vlastack_sim.json").write_text(json.dumps({**report, "episode_info": info}, indent=1))
    shutil.rmtree(parts)
    return {k: v for k, v in report.items() if k != "episode_info"}


def add_metaworld_uv(
    root: str | Path, cameras: list[str] | None = None, overwrite: bool = False
) -> list[str]:
    """Give a Meta-World dataset recorded without them (an older ``vla data generate``, or
    LeRobot's ``lerobot/metaworld_mt50``) ``observation.environment_uv.<camera>`` for each
    world-fixed camera (default: every camera feature of the dataset that has one): where it images
    the object and the goal, computed from ``observation.environment_state`` as the generator does.
    -> the keys added."""
    from vlastack.data.edit import add_feature
    from vlastack.data.format import load_info
    from vlastack.data.samples import ENV_KEY, ENV_UV_KEY
    from vlastack.sim.metaworld import fixed_camera, points_uv

    info = load_info(Path(root))
    ft = info["features"].get(ENV_KEY)
    if ft is None or list(ft["shape"]) != [39]:
        raise ValueError(f"{root}: not a Meta-World dataset (needs a 39-wide {ENV_KEY!r})")
    if cameras is None:  # observation.image (LeRobot's key) -> "image"; observation.images.<c> -> c
        keys = [k for k, f in info["features"].items() if f["dtype"] in ("video", "image")]
        cameras = [k.rsplit(".", 1)[-1] for k in keys]
        cameras = [c for c in cameras if fixed_camera(c)]
    added = []
    for cam in cameras:
        if not fixed_camera(cam):
            raise ValueError(f"Meta-World camera {cam!r} moves with the robot: no fixed projection")
        key = f"{ENV_UV_KEY}.{cam}"
        add_feature(
            root, key, [ENV_KEY], lambda c, cam=cam: points_uv(c[ENV_KEY], cam), overwrite, ENV_UV_NAMES
        )
        added.append(key)
    return added


def _merge_parts(
    parts: list[Path], out: Path, video_quality: str, overwrite: bool, progress: bool = True
) -> None:
    """Concatenate finished per-task datasets (same features) into one, episode by episode."""
    merge_datasets(parts, out, video_quality, overwrite, progress)


def merge_datasets(
    parts: list[Path],
    out: Path,
    video_quality: str = "lossless",
    overwrite: bool = False,
    progress: bool = True,
    keep: list[str] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
    columns: Callable[[int, int, int], dict[str, np.ndarray]] | None = None,
) -> None:
    """Concatenate LeRobot v3 datasets into one at ``out``, episode by episode, in order.

    ``keep``: the features written (default: the first part's; each part must have them);
    ``extra``: features added (name -> ``{"dtype", "shape"}``), whose values ``columns(part,
    episode, length)`` returns per episode ({name: [length, ...]}; ``rl/recap.py`` adds its labels).
    Every frame is decoded and encoded again (~190k frames for MT50): a thread decodes the next
    episode while this one is encoded, and a bar shows the episodes written."""
    from concurrent.futures import ThreadPoolExecutor

    from vlastack.data.lerobot import LeRobotWriter
    from vlastack.data.reader import LeRobotDataset

    infos = [json.loads((p / "meta" / "info.json").read_text()) for p in parts]
    info = infos[0]
    names = [k for k in (keep or info["features"]) if k not in DEFAULT_FEATURES]
    for p, inf in zip(parts, infos, strict=True):
        if missing := [k for k in names if k not in inf["features"]]:
            raise ValueError(f"{p}: has no {missing} (merging needs every part to have the features kept)")
        if inf["fps"] != info["fps"]:
            raise ValueError(f"{p}: {inf['fps']} fps, {parts[0]} has {info['fps']}: cannot merge")
    features = {k: {kk: v for kk, v in info["features"][k].items() if kk != "info"} for k in names}
    features.update(extra or {})
    if extra and columns is None:
        raise ValueError("merge_datasets: extra features need columns() to give their values")
    pix_fmt, crf = VIDEO_QUALITY[video_quality]
    counts = [inf["total_episodes"] for inf in infos]
    jobs = [(i, k) for i, n in enumerate(counts) for k in range(n)]
    opened: dict[int, LeRobotDataset] = {}  # touched by the decoding thread only
    writer = LeRobotWriter(out, fps=info["fps"], features=features, robot_type=info["robot_type"],
                           overwrite=overwrite, video_pix_fmt=pix_fmt, video_crf=crf)  # fmt: skip
    keys = [k for k in names if features[k]["dtype"] not in ("video", "image")]

    def load(job: tuple[int, int]) -> tuple[dict[str, np.ndarray], str]:
        i, k = job
        if i not in opened:
            for j in [j for j in opened if j != i]:  # one part open at a time
                opened.pop(j).close()
            opened[i] = LeRobotDataset(parts[i])
        ds = opened[i]
        start, end = ds.episode_range(k)
        cams = [key for key in ds.camera_keys if key in names]
        data = {key: np.stack([ds.image(key, t) for t in range(start, end)]) for key in cams}
        data.update({key: np.asarray(ds.columns[key][start:end]) for key in keys})
        if columns is not None:
            data.update(columns(i, k, end - start))
        return data, ds.tasks[int(ds.columns["task_index"][start])]

    try:
        with ThreadPoolExecutor(1) as pool, Progress(len(jobs), "merge", "episode", enabled=progress) as bar:
            try:
                pending = pool.submit(load, jobs[0])
                for n in range(len(jobs)):
                    data, task = pending.result()
                    if n + 1 < len(jobs):
                        pending = pool.submit(load, jobs[n + 1])
                    writer.add_episode(data, task=task)
                    bar.update(1)
            finally:  # after the last load (the pool runs one job at a time)
                pool.submit(lambda: [ds.close() for ds in opened.values()]).result()
        writer.finalize()
    except BaseException:
        writer.abort()
        raise
