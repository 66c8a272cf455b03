"""Closed-loop evaluation: parallel rollouts, action chunking, Wilson intervals, plots and videos.

    res = evaluate("runs/tiny/checkpoint", cfg.eval, out_dir="runs/eval")   # an EvalConfig
    res = evaluate("runs/tiny/checkpoint", suite="builtin", episodes=100, num_workers=2)  # or fields
    res["overall"]["success_rate"], res["overall"]["ci95"]

Seeds (``eval.seed_scheme``): ``spread``, episode ``i`` runs task ``tasks[i % len(tasks)]`` with env
seed ``seed + i`` (the default 1_000_000 keeps evaluation layouts disjoint from data generation,
which uses small seeds); ``per_task``, every task runs ``episodes`` episodes with seeds ``seed + j``,
as ``lerobot-eval`` does (its seed is 1000). A checkpoint trained on generated data carries the
(task, seed) pairs behind it (``train_seeds.json``): scoring it on any of them is refused.
Meta-World results also get LeRobot's difficulty groups (``groups``: success pooled over each
group's episodes, as lerobot-eval; ``group_average``: the mean of the four, the SmolVLA table's).

Workers are spawned processes; each builds its own policy from the picklable spec (see ``policies.py``) so no
model is ever pickled. A worker that dies is reported (``EvalWorkerError``) instead of hanging the
run; a policy that returns a bad chunk stops the run with a ``PolicyOutputError`` naming it.

Chunks: the policy is queried every ``steps_per_chunk`` steps (or when its chunk runs out), with
optional temporal ensembling: ``infer.chunking.ActionChunker``, the same as ``Policy.select_action``.
``eval.execution`` (any method other than ``sync`` at delay 0) runs the episode through the
asynchronous runtime instead (``infer.realtime``) with a simulated inference delay, and adds
smoothness (the action jump at chunk boundaries) to the results.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import time
from concurrent.futures import FIRST_EXCEPTION, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from vlastack.config import EvalConfig, ExecutionConfig
from vlastack.infer.chunking import ActionChunker
from vlastack.infer.realtime import RealtimeRunner
from vlastack.progress import EpisodeProgress
from vlastack.sim.policies import PolicySpec, build_policy, check_actions, policy_name
from vlastack.sim.pool import worker_pool
from vlastack.stats import wilson


class EvalWorkerError(RuntimeError):
    """An evaluation worker process died (crash, os._exit, out of memory)."""


def _seed_sampler(policy: Any, seed: int) -> None:
    """Seed a sampling policy's generator from the episode (or side-by-side group) it runs next.

    Workers take episodes in whatever order they finish, so a generator seeded once per worker
    gave a stochastic sampler (a flow head's ``step_noise``, a token head's temperature) other
    draws on every evaluation. Seeded where each episode starts, an evaluation repeats whatever
    the scheduling and whatever ran before; deterministic samplers are unchanged."""
    gen = getattr(policy, "generator", None)
    if gen is not None and hasattr(gen, "manual_seed"):
        gen.manual_seed(int(seed))


def run_episode(
    env,
    policy,
    name: str,
    seed: int,
    steps_per_chunk: int = 8,
    temporal_ensemble: float = 0.0,
    record: bool = False,
    episode: int = 0,
    execution: ExecutionConfig | None = None,
) -> dict[str, Any]:
    """One closed-loop episode. Returns {task, seed, prompt, success, steps, [frames uint8 [T,H,W,3]]}
    (+ the execution stats: boundary jumps, starved and paused steps, with ``execution``)."""
    if execution is None or (execution.method == "sync" and execution.delay == 0):
        task = getattr(env, "task_name", "?")
        job = (episode, task, seed, record)
        return run_lockstep([env], policy, name, [job], steps_per_chunk, temporal_ensemble)[0]
    obs, _ = env.reset(seed=seed)
    if hasattr(policy, "reset"):
        policy.reset()
    _seed_sampler(policy, seed)
    if getattr(policy, "needs_env", False):
        policy.bind_env(env)
    frames = [_video_frame(obs)] if record else []
    return _realtime_episode(env, obs, policy, name, seed, steps_per_chunk, temporal_ensemble,
                             frames, episode, execution)  # fmt: skip


def batchable(policy: Any) -> bool:
    """Whether ``run_lockstep`` may batch this policy's queries: it has ``infer_batch(obs_list,
    streams)`` and says so (a vlastack ``Policy``: what a head keeps across queries, a token head's
    last valid chunk, is kept per stream, here per episode; the expert reads its own env)."""
    return bool(getattr(policy, "batchable", False)) and hasattr(policy, "infer_batch")


def run_lockstep(
    envs: list,
    policy,
    name: str,
    jobs: list[tuple[int, str, int, bool]],
    steps_per_chunk: int = 8,
    temporal_ensemble: float = 0.0,
    on_done=None,
) -> list[dict[str, Any]]:
    """Closed-loop episodes side by side, one env each (``jobs``: (episode, task, seed, record)):
    every step, the episodes that need a chunk are queried in one ``policy.infer_batch`` call (one
    episode: ``policy.infer``; that is ``run_episode``). Synchronous execution only. Returns the
    results in ``jobs`` order."""
    assert len(envs) == len(jobs), (len(envs), len(jobs))
    if len(envs) > 1 and not batchable(policy):
        raise ValueError(f"policy {name!r} cannot run episodes side by side (not batchable)")
    runs = []
    for env, (i, task, seed, record) in zip(envs, jobs, strict=True):
        obs, _ = env.reset(seed=seed)
        task = getattr(env, "task_name", task)  # the env's own name, as run_episode always reported
        runs.append({"env": env, "obs": obs, "episode": i, "task": task, "seed": seed, "t": 0,
                     "invalid": 0, "frames": [_video_frame(obs)] if record else None,
                     "chunker": ActionChunker(steps_per_chunk, temporal_ensemble), "out": None})  # fmt: skip
    if hasattr(policy, "reset"):
        policy.reset()
    _seed_sampler(policy, jobs[0][2])  # side by side: the first episode's seed
    if getattr(policy, "needs_env", False):
        policy.bind_env(envs[0])  # one env: a batchable policy never needs one
    while active := [r for r in runs if r["out"] is None]:
        asking = [r for r in active if r["chunker"].needs_chunk()]
        if len(runs) > 1:
            # each episode is its own stream: a token head repeats only that episode's chunks
            replies = (
                policy.infer_batch([r["obs"] for r in asking], [r["episode"] for r in asking])
                if asking
                else []
            )
        else:
            replies = [policy.infer(r["obs"]) for r in asking]
        for r, reply in zip(asking, replies, strict=True):
            adim = r["env"].action_space.shape[0]
            where = f"step {r['t']} of episode {r['episode']} (task {r['task']}, seed {r['seed']})"
            r["chunker"].add(check_actions(reply, adim, name, where))
            # Token heads say when tokens did not decode to a chunk; it still runs (as a robot
            # stack with no fallback would), but is counted so it cannot pass unnoticed.
            r["invalid"] += int(isinstance(reply, dict) and reply.get("valid", True) is False)
        for r in active:
            obs, _, terminated, truncated, info = r["env"].step(r["chunker"].next_action().astype(np.float32))
            r["obs"], r["t"] = obs, r["t"] + 1
            if r["frames"] is not None:
                r["frames"].append(_video_frame(obs))
            if terminated or truncated:
                r["out"] = {
                    "episode": r["episode"], "task": r["task"], "seed": r["seed"], "prompt": obs["prompt"],
                    "success": bool(info.get("success", terminated)), "steps": r["t"],
                    "invalid_chunks": r["invalid"], **episode_extras(info),
                }  # fmt: skip
                if r["frames"] is not None:
                    r["out"]["frames"] = np.stack(r["frames"])
                if on_done is not None:
                    on_done(r["out"])
    return [r["out"] for r in runs]


def episode_extras(info: dict) -> dict:
    """What a task adds to its last step's ``info`` that an episode record keeps (fragile
    families: ``spilled``, ``peak_accel``); nothing for the others, so their records are unchanged."""
    return {k: info[k] for k in ("spilled", "peak_accel") if k in info}


def lockstep_groups(jobs: list, batch: int, workers: int) -> list[list]:
    """``jobs`` cut into groups of at most ``batch``, as many as a multiple of ``workers`` (each
    worker gets the same share), of near-equal sizes."""
    if not jobs:
        return []
    n = -(-len(jobs) // batch)
    n = min(len(jobs), -(-n // max(1, workers)) * max(1, workers))
    base, extra = divmod(len(jobs), n)
    bounds = np.cumsum([0] + [base + (k < extra) for k in range(n)])
    return [jobs[a:b] for a, b in itertools.pairwise(bounds)]


def _video_frame(obs: dict, max_side: int = 160) -> np.ndarray:
    """The first camera's frame for a video, strided down to at most ``max_side`` px (a 500-step
    Meta-World episode at 480 px would hold 345 MB)."""
    img = next(iter(obs["images"].values()))
    k = -(-img.shape[0] // max_side)
    return img[::k, ::k] if k > 1 else img


def _realtime_episode(env, obs, policy, name, seed, steps_per_chunk, ensemble, frames, episode, execution):
    """``run_episode`` through ``RealtimeRunner`` with a simulated delay (deterministic)."""
    adim, task = env.action_space.shape[0], getattr(env, "task_name", "?")
    invalid, last = [0], {"obs": obs, "info": {}}

    def check(reply: Any, t: int) -> np.ndarray:
        invalid[0] += int(isinstance(reply, dict) and reply.get("valid", True) is False)
        return check_actions(reply, adim, name, f"step {t} of episode {episode} (task {task}, seed {seed})")

    def step(action: np.ndarray) -> tuple[dict, bool]:
        o, _, terminated, truncated, info = env.step(action.astype(np.float32))
        last.update(obs=o, info=info)
        if frames:
            frames.append(_video_frame(o))
        return o, terminated or truncated

    if hasattr(policy, "set_execution"):  # a vlastack Policy: RTC's guidance, BID's candidates
        policy.set_execution(execution)
    spc = execution.horizon or steps_per_chunk
    rep = getattr(env, "action_representation", "delta")
    runner = RealtimeRunner(
        policy, execution, adim, spc, hz=None, ensemble=ensemble, check=check, representation=rep
    )
    try:
        stats = runner.run(obs, step, max_steps=env.max_steps)
    finally:
        runner.close()
    out = {
        "episode": episode, "task": task, "seed": seed, "prompt": last["obs"]["prompt"],
        "success": bool(last["info"].get("success", False)), "steps": stats.steps,
        "invalid_chunks": invalid[0], **stats.summary(), **episode_extras(last["info"]),
    }  # fmt: skip
    if frames:
        out["frames"] = np.stack(frames)
    return out


# ----------------------------------------------------------------------------- worker side
_WORKER: dict[str, Any] = {}


def _init_worker(threads: int) -> None:
    # Each worker gets its share of the cores; set before torch is imported by the policy.
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = str(threads)


def _episode_job(
    spec: PolicySpec, env_kw: dict, run_kw: dict, episode: int, task: str, seed: int, record: bool
) -> dict:
    from vlastack.sim.env import make_env

    policy = _worker_policy(spec)
    envs = _WORKER.setdefault("envs", {})
    if task not in envs:
        envs[task] = make_env(task, **env_kw)
        # Closed before the interpreter tears down: robosuite's EGL contexts complain when freed late.
        __import__("atexit").register(_close_at_exit, envs[task])
    run_kw = {**run_kw, "record": record}
    return run_episode(envs[task], policy, policy_name(spec), seed, episode=episode, **run_kw)


def _worker_policy(spec: PolicySpec) -> Any:
    """This worker's policy, built from ``spec`` on first use."""
    if "policy" not in _WORKER:
        _WORKER["policy"] = build_policy(spec)
        if "torch" in __import__("sys").modules:
            import torch

            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    return _WORKER["policy"]


def _group_job(spec: PolicySpec, env_kw: dict, run_kw: dict, group: list) -> list[dict]:
    """A worker's share under ``eval.batch_episodes``: ``group`` side by side (``run_lockstep``)
    where the policy allows it, else one at a time."""

    policy = _worker_policy(spec)
    if not batchable(policy):
        return [_episode_job(spec, env_kw, run_kw, *j) for j in group]
    mine = group_envs(_WORKER.setdefault("slot_envs", {}), group, env_kw, at_exit=True)
    return run_lockstep(
        mine, policy, policy_name(spec), group, run_kw["steps_per_chunk"], run_kw["temporal_ensemble"]
    )


def group_envs(cache: dict, group: list, env_kw: dict, at_exit: bool = False) -> list:
    """One env per episode of ``group``, kept in ``cache`` by (task, slot) for the next group;
    the envs of tasks no longer in play are closed (their renderers freed)."""
    from vlastack.sim.env import make_env

    mine, seen = [], {}
    for _, task, _, _ in group:
        key = (task, seen.setdefault(task, 0))
        seen[task] += 1
        if key not in cache:
            cache[key] = make_env(task, **env_kw)
            if at_exit:  # a worker's envs: closed before the interpreter tears down
                __import__("atexit").register(_close_at_exit, cache[key])
        mine.append(cache[key])
    keep = {(t, k) for t, n in seen.items() for k in range(n)}
    for key in [k for k in cache if k not in keep]:
        _close_at_exit(cache.pop(key))
    return mine


def _close_at_exit(env) -> None:
    # MuJoCo's own EGL atexit hook may have run first (it registers when the first frame renders,
    # after this one, and atexit runs in reverse): the display is gone and the context went with it.
    with __import__("contextlib").suppress(Exception):  # at exit, a failed free prints no traceback
        env.close()


# ----------------------------------------------------------------------------- main side
def evaluate(
    policy_factory: PolicySpec | Any,
    cfg: EvalConfig | None = None,
    *,
    out_dir: str | Path | None = None,
    cameras: tuple[str, ...] | list[str] | None = None,
    camera_map: dict[str, str | None] | None = None,
    resume: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """Evaluate a policy spec (or, with ``num_workers=0``, a policy object) on a suite.

    ``cfg``: the evaluation settings (``EvalConfig``: suite, tasks, episodes, seed, num_workers,
    steps_per_chunk, temporal_ensemble, image_size, videos); ``overrides``: any of its fields.
    Returns the ``eval.json`` dict: per-task and overall success with Wilson 95% CIs, the episode
    list and timing. With ``out_dir`` also writes eval.json, eval.png and up to ``videos`` mp4s
    (one per task when ``videos`` covers the tasks, else half successes, half failures).
    ``cameras``: default the checkpoint's ``model.camera_names``, else the suite's; ``()`` renders
    nothing (the scripted expert reads the state: Meta-World's expert check runs 50x faster).
    ``camera_map``: LIBERO only, policy camera -> ``agentview`` / ``wrist`` / None, for names
    ``sim.libero.match_cameras`` cannot place.
    With ``out_dir``, every finished episode is journaled (``sim.eval_journal``); ``resume``
    continues an interrupted evaluation of the same policy and settings from its journal.
    """
    from vlastack.sim.env import suite_tasks

    cfg = cfg or EvalConfig()
    unknown = sorted(set(overrides) - {f.name for f in fields(EvalConfig)})
    if unknown:
        raise TypeError(f"evaluate() got unknown settings {unknown}; EvalConfig fields are accepted")
    cfg = replace(cfg, **{k: tuple(v) if k == "tasks" else v for k, v in overrides.items()})
    num_workers, videos = cfg.num_workers, cfg.videos
    names = suite_tasks(cfg.suite, tuple(cfg.tasks))
    if cfg.temporal_ensemble < 0:
        raise ValueError(f"need temporal_ensemble >= 0, got {cfg.temporal_ensemble}")
    if (num_workers > 0 or cfg.ray_address) and hasattr(policy_factory, "infer"):
        raise ValueError(
            "a policy object cannot be sent to worker processes; pass a spec ('random', 'expert', a "
            "checkpoint path or a picklable factory) or use num_workers=0 without ray_address"
        )
    served = served_metadata(policy_factory)  # one round trip to a ws:// server for the whole evaluation
    cameras = tuple(cameras) if cameras is not None else _policy_cameras(policy_factory, cfg.suite, served)
    representation = policy_representation(policy_factory, cfg.action_representation, cfg.suite, served)
    env_kw = {"image_size": cfg.image_size, "cameras": cameras, "suite": cfg.suite,
              "render_quality": cfg.render_quality, "max_steps": cfg.max_steps}  # fmt: skip
    if representation != "delta":  # the other suites' envs take deltas only (checked above)
        env_kw["action_representation"] = representation
    if cfg.lerobot_batch_size != 1:  # LIBERO only (make_env refuses it elsewhere)
        env_kw["lerobot_batch_size"] = cfg.lerobot_batch_size
    if cameras and (camera_map is not None or cfg.suite.startswith("libero")):
        from vlastack.sim.libero import match_cameras

        env_kw["camera_map"] = match_cameras(cameras, camera_map)  # checked here, once, not per worker
    run_kw = {
        "steps_per_chunk": cfg.steps_per_chunk,
        "temporal_ensemble": cfg.temporal_ensemble,
        "execution": cfg.execution,
    }
    if cfg.seed_scheme == "per_task":
        pairs = [(t, cfg.seed + j) for t in names for j in range(cfg.episodes)]
    else:
        pairs = [(names[i % len(names)], cfg.seed + i) for i in range(cfg.episodes)]
    seen = check_train_overlap(policy_factory, cfg.suite, pairs)
    # Frames are kept only for the episodes that may become videos: a few per task.
    per_task = -(-2 * videos // len(names)) if videos else 0
    firsts: dict[str, int] = {}
    jobs = []
    for i, (t, s) in enumerate(pairs):
        firsts[t] = firsts.get(t, 0) + 1
        jobs.append((i, t, s, firsts[t] <= per_task))
    name = policy_name(policy_factory)
    ex = cfg.execution
    lockstep = cfg.batch_episodes > 1 and ex.method == "sync" and ex.delay == 0
    if resume and out_dir is None:
        raise ValueError("resume continues the evaluation journaled in out_dir: pass out_dir (--out)")
    journal = None
    if out_dir is not None:
        from vlastack.sim.eval_journal import EvalJournal

        what = {"policy": policy_identity(policy_factory, served), "env": env_kw, "run": run_kw, "jobs": jobs,
                "batch": cfg.batch_episodes if lockstep else 1}  # fmt: skip
        journal = EvalJournal(Path(out_dir), what, resume, video_fps(cfg.suite))
        if journal.done:
            print(f"resuming: {len(journal.done)} of {len(jobs)} episodes done ({journal.path})", flush=True)
    all_jobs, jobs = jobs, [j for j in jobs if journal is None or j[0] not in journal.done]
    t0 = time.perf_counter()
    bar = EpisodeProgress(len(jobs), f"eval {name}")

    def finished(r: dict) -> dict:
        return bar.done(journal.add(r) if journal is not None else r)

    try:
        results = _run_jobs(policy_factory, cfg, env_kw, run_kw, jobs, names, name, lockstep, finished)
    finally:
        bar.close()
        if journal is not None:
            journal.close()
    if journal is not None:
        results = sorted([*journal.done.values(), *results], key=lambda r: r["episode"])
    assert len(results) == len(all_jobs), (len(results), len(all_jobs))
    wall = time.perf_counter() - t0 + (journal.prior_s if journal is not None else 0.0)
    res = summarize(results, names, name, cfg.suite, wall)
    res["train_seeds"] = seen
    if served is not None:
        # What was behind the address (its policy, type, version): a URL alone does not say.
        # (plain values only: a server's settings such as a LeRobot server's resize and overrides)
        res["server"] = {
            k: v for k, v in served.items() if isinstance(v, str | int | float | bool | list | dict)
        }
    res["resumed_episodes"] = len(journal.done) if journal is not None else 0
    res["config"] = {
        "episodes": cfg.episodes, "seed": cfg.seed, "seed_scheme": cfg.seed_scheme,
        "render_quality": cfg.render_quality, "max_steps": cfg.max_steps, "num_workers": num_workers,
        "steps_per_chunk": cfg.steps_per_chunk, "temporal_ensemble": cfg.temporal_ensemble,
        "image_size": cfg.image_size, "cameras": list(cameras), "execution": asdict(cfg.execution),
        "action_representation": representation, "batch_episodes": cfg.batch_episodes if lockstep else 1,
        "lerobot_batch_size": cfg.lerobot_batch_size,
    }  # fmt: skip
    if "camera_map" in env_kw:
        res["config"]["camera_map"] = env_kw["camera_map"]
    if out_dir is not None:
        write_outputs(res, results, Path(out_dir), videos)
        journal.finish()
    return res


def _run_jobs(spec, cfg: EvalConfig, env_kw, run_kw, jobs, names, name, lockstep, finished) -> list[dict]:
    """The episodes ``jobs`` in-process or over ``cfg.num_workers`` processes; ``finished`` is
    called with each record as it completes. Returns the records in episode order."""
    num_workers = cfg.num_workers
    if cfg.ray_address:  # one Ray task per episode (batch_episodes groups stay a local-worker feature)
        from vlastack.sim.ray_pool import run_on_ray

        return run_on_ray(cfg.ray_address, _episode_job, spec, env_kw, run_kw, jobs, finished)
    if num_workers == 0:
        from vlastack.sim.env import make_env

        policy = build_policy(spec)
        if lockstep and batchable(policy):
            results, cache = [], {}
            for group in lockstep_groups(jobs, cfg.batch_episodes, 1):
                envs_g = group_envs(cache, group, env_kw)
                results += run_lockstep(envs_g, policy, name, group, cfg.steps_per_chunk,
                                        cfg.temporal_ensemble, on_done=finished)  # fmt: skip
            for e in cache.values():
                e.close()
        else:
            envs = {t: make_env(t, **env_kw) for t in names if any(j[1] == t for j in jobs)}
            results = [
                finished(run_episode(envs[t], policy, name, s, episode=i, record=r, **run_kw))
                for i, t, s, r in jobs
            ]
            for e in envs.values():
                e.close()
        return results
    batch = cfg.batch_episodes if lockstep else 1
    return _run_parallel(spec, env_kw, run_kw, jobs, num_workers, name, finished, batch=batch)


def served_metadata(spec: Any) -> dict[str, Any] | None:
    """A served policy's (``ws://host:port``) ``/metadata``; None for any other spec."""
    if not (isinstance(spec, str) and spec.startswith("ws://")):
        return None
    from vlastack.sim.policies import server_metadata

    return server_metadata(spec)


def policy_identity(spec: Any, served: dict[str, Any] | None) -> dict[str, Any]:
    """What names the policy for a resumed evaluation: its name and decoding options, and for a
    checkpoint folder its files (name, size, mtime), so retrained weights never join a journal.
    A served policy (``ws://host:port``) is named by its host and the metadata its server sends
    (LeRobot's server: the checkpoint folder, resize, overrides), not by its port: a server
    started again with ``--port 0`` (bench/lerobot_served.py) gets a new one. ``served``: its
    metadata (``served_metadata``)."""
    if served is not None:
        return {"name": f"ws://{urlsplit(spec).hostname}", "server": served}
    out: dict[str, Any] = {"name": policy_name(spec), "decoding": list(getattr(spec, "decoding", ()))}
    folder = _checkpoint_dir(spec)
    if folder is not None:
        out["path"] = str(folder.resolve())
        out["files"] = sorted(
            (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*")
            if p.is_file()
        )
    return out


def _checkpoint_dir(spec: Any) -> Path | None:
    path = spec if isinstance(spec, str) else getattr(spec, "path", None)
    if not isinstance(path, str) or path in ("random", "expert") or not Path(path).is_dir():
        return None
    return Path(path)


def _policy_cameras(spec: Any, suite: str, served: dict[str, Any] | None) -> tuple[str, ...]:
    """A checkpoint's ``model.camera_names`` (what it was trained on), a server's (``served``: its
    metadata), else the suite's cameras."""
    from vlastack.sim.env import default_cameras

    if served is not None:
        names = served.get("camera_names")
        return tuple(names) if names else default_cameras(suite)
    ckpt = _located(spec)
    if ckpt is not None:
        from vlastack.models.convert.lerobot import camera_names

        if ckpt.fmt != "vlastack":
            return camera_names(ckpt.meta)  # a LeRobot / openpi checkpoint: its input features
        names = ckpt.meta["model"].get("camera_names")
        if names:
            return tuple(names)
    return default_cameras(suite)


def _located(spec: Any):
    """The checkpoint folder behind ``spec``, located (``convert.locate.locate``: the one format
    detection), or None: a baseline, a server, or a folder this evaluator does not load (it says
    so when it builds the policy)."""
    folder = _checkpoint_dir(spec)
    if folder is None or not (folder / "config.json").is_file():
        return None
    from vlastack.models.convert.locate import locate

    try:
        return locate(folder)
    except ValueError:
        return None


def policy_representation(spec: Any, wanted: str, suite: str, served: dict[str, Any] | None) -> str:
    """The action representation to evaluate in: the policy's own (a checkpoint's
    ``model.action_representation``, a server's ``/metadata``), ``wanted`` (``eval.action_representation``)
    for baselines and policies that do not say; ``auto`` = the policy's, else ``delta``. A policy
    that says one and an ``eval`` that asks for the other is refused: its chunks would run in the
    wrong one."""
    from vlastack.sim.env import check_representation

    own = None
    if served is not None:  # a served policy's metadata (served_metadata)
        own = served.get("action_representation") or None
    elif hasattr(spec, "action_representation"):  # a Policy object (num_workers=0)
        own = spec.action_representation
    elif (ckpt := _located(spec)) is not None and ckpt.fmt == "vlastack":
        own = ckpt.meta["model"].get("action_representation")
    if own in ("", "auto", "unspecified"):
        own = None
    if own is not None and wanted not in ("auto", own):
        raise ValueError(
            f"the policy acts in {own} actions and eval.action_representation={wanted}: its chunks "
            f"would run in the wrong representation; drop the setting (auto) or use a {wanted} policy"
        )
    return check_representation(own or ("delta" if wanted == "auto" else wanted), suite)


def check_train_overlap(spec: Any, suite: str, pairs: list[tuple[str, int]]) -> dict | None:
    """Refuse to evaluate a checkpoint on (task, seed) layouts from its own training data.

    Returns what eval.json records about the training seeds (None when the policy carries none:
    baselines, or data not made by ``vla data generate``)."""
    from vlastack.data.format import TRAIN_SEEDS, train_seeds

    folder = _checkpoint_dir(spec)
    if folder is None:
        return None
    info = None
    if (folder / TRAIN_SEEDS).is_file():
        info = json.loads((folder / TRAIN_SEEDS).read_text())
    elif (folder / "config.yaml").is_file():
        from vlastack.config import load_yaml

        info = train_seeds(load_yaml(folder / "config.yaml").data.path)
    if not info or info.get("suite") not in (None, suite):
        return None
    trained = {(t, int(s)) for t, s in info["episodes"]}
    overlap = sorted(p for p in pairs if p in trained)
    if overlap:
        raise ValueError(
            f"{len(overlap)} of the {len(pairs)} evaluation episodes use layouts the policy was trained on "
            f"(task, seed), e.g. {overlap[:3]}, from {info['dataset']}: pick evaluation seeds outside the "
            "training seeds (--seed; lerobot-eval uses 1000+j, vla data generate starts at 0)"
        )
    seeds = [s for _, s in info["episodes"]]
    return {"dataset": info["dataset"], "episodes": len(seeds), "min_seed": min(seeds, default=None),
            "max_seed": max(seeds, default=None), "overlap": 0}  # fmt: skip


def _run_parallel(
    spec, env_kw, run_kw, jobs, num_workers, name, on_result=None, batch: int = 1
) -> list[dict]:
    """``jobs`` over ``num_workers`` spawned processes, one episode per task, or with ``batch`` > 1
    groups of episodes (``lockstep_groups``) that each worker runs side by side. ``on_result``:
    called with each episode's result as it arrives (on the pool's thread)."""
    threads = max(1, (os.cpu_count() or 1) // num_workers)
    ex = worker_pool(num_workers, _init_worker, (threads,))
    if batch > 1:
        futs = {
            ex.submit(_group_job, spec, env_kw, run_kw, g): g[0]
            for g in lockstep_groups(jobs, batch, num_workers)
        }
    else:
        futs = {ex.submit(_episode_job, spec, env_kw, run_kw, *j): j for j in jobs}
    for f in futs if on_result else ():
        f.add_done_callback(functools.partial(_each_done, on_result))
    try:
        done, _ = wait(futs, return_when=FIRST_EXCEPTION)
        for f in done:
            exc = f.exception()
            if isinstance(exc, BrokenProcessPool):
                i, task, seed, _ = futs[f]
                finished = sum(1 for g in done if not g.exception())
                raise EvalWorkerError(
                    f"an evaluation worker process died (crashed, os._exit or killed) while evaluating "
                    f"policy {name!r}, around episode {i} (task {task}, seed {seed}); {finished} of "
                    f"{len(jobs)} episodes had finished. Re-run with num_workers=0 to see the error in-process."
                ) from exc
            if exc is not None:
                raise exc
        results = [f.result() for f in futs]
        if batch > 1:
            results = [r for group in results for r in group]
        return sorted(results, key=lambda r: r["episode"])
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _each_done(on_result, future) -> None:
    """A finished job's future (one episode, or a group's list of them) -> ``on_result`` per episode."""
    if future.cancelled() or future.exception() is not None:
        return
    res = future.result()
    for r in res if isinstance(res, list) else [res]:
        on_result(r)


def summarize(results: list[dict], tasks: tuple[str, ...], name: str, suite: str, wall_s: float) -> dict:
    def stats(rs: list[dict]) -> dict:
        k, n = sum(r["success"] for r in rs), len(rs)
        lo, hi = wilson(k, n)
        steps = float(np.mean([r["steps"] for r in rs])) if rs else 0.0
        out = {
            "n": n,
            "successes": k,
            "success_rate": k / n if n else 0.0,
            "ci95": [lo, hi],
            "mean_steps": steps,
        }
        jumps = [r for r in rs if r.get("boundaries")]
        if any("max_jump" in r for r in rs):  # asynchronous runtime: smoothness at chunk boundaries
            out["max_jump"] = max((r["max_jump"] for r in jumps), default=0.0)
            out["mean_max_jump"] = float(np.mean([r["max_jump"] for r in jumps])) if jumps else 0.0
            out["mean_jump"] = float(np.mean([r["mean_jump"] for r in jumps])) if jumps else 0.0
            out["starved_steps"] = int(sum(r["starved_steps"] for r in rs))
            out["fallbacks"] = int(sum(r["fallbacks"] for r in rs))
        return out

    per_task = {t: stats([r for r in results if r["task"] == t]) for t in tasks}
    rates = [v["success_rate"] for v in per_task.values() if v["n"]]
    out = {
        "policy": name,
        "suite": suite,
        "tasks": per_task,
        "overall": stats(results),
        "mean_task_success": float(np.mean(rates)) if rates else 0.0,
        "wall_s": wall_s,
        "episodes": [{k: v for k, v in r.items() if k not in ("frames", "video")} for r in results],
    }
    if suite == "metaworld":
        from vlastack.sim.metaworld_tasks import GROUPS

        groups = {g: stats([r for r in results if r["task"] in ts]) for g, ts in GROUPS.items()}
        out["groups"] = {g: v for g, v in groups.items() if v["n"]}
        if len(out["groups"]) == len(GROUPS):
            out["group_average"] = float(np.mean([v["success_rate"] for v in groups.values()]))
    return out


def write_outputs(res: dict, results: list[dict], out: Path, videos: int) -> None:
    """eval.json, eval.png (bar chart with Wilson CIs) and videos/*.mp4 under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    res["videos"] = (
        write_videos(results, out / "videos", videos, video_fps(res["suite"])) if videos > 0 else []
    )
    (out / "eval.json").write_text(json.dumps(res, indent=2))
    plot(res, out / "eval.png")


def video_fps(suite: str) -> int:
    """Frames per second of a suite's rollout videos: Meta-World steps at 80 Hz, slowed to 30 to watch."""
    return 30 if suite == "metaworld" else 10


def write_videos(results: list[dict], folder: Path, count: int, fps: int = 10) -> list[str]:
    """Up to ``count`` episodes' videos into ``folder``: one per task when ``count`` covers the
    tasks, else half successes, half failures; from the episodes' frames or their candidate video
    (``sim.eval_journal``)."""
    from vlastack.sim.eval_journal import encode_video, video_name

    recorded = [r for r in results if "frames" in r or "video" in r]
    tasks = list(dict.fromkeys(r["task"] for r in results))
    if count >= len(tasks) > 1:  # one video per task (its first recorded episode)
        pick = [
            next(r for r in recorded if r["task"] == t)
            for t in tasks
            if any(r["task"] == t for r in recorded)
        ]
    else:
        wins = [r for r in recorded if r["success"]]
        fails = [r for r in recorded if not r["success"]]
        n_win = min(len(wins), max(count - count // 2, count - len(fails)))
        pick = wins[:n_win] + fails[: count - n_win]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in pick:
        path = folder / video_name(r)
        if "frames" in r:
            encode_video(r["frames"], path, fps)
        else:
            os.replace(r["video"], path)
        paths.append(str(path))
    return paths


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = res.get("groups", {})
    labels = [*res["tasks"], *groups, "overall"]
    stats = [*res["tasks"].values(), *groups.values(), res["overall"]]
    rates = np.array([s["success_rate"] for s in stats])
    # Clipped at 0: an interval read from an older eval.json may miss its rate by a rounding error.
    err = np.array([[max(0.0, r - s["ci95"][0]), max(0.0, s["ci95"][1] - r)] for r, s in zip(rates, stats)]).T
    fig, ax = plt.subplots(figsize=(min(1.2 * len(labels) + 2, 0.45 * len(labels) + 6), 3.5))
    colors = ["C0"] * len(res["tasks"]) + ["C2"] * len(groups) + ["C1"]
    ax.bar(labels, rates, yerr=err, capsize=4 if len(labels) < 20 else 1, color=colors)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% Wilson CI)")
    ax.set_title(f"{res['policy']} on {res['suite']} ({res['overall']['n']} episodes)")
    plt.setp(ax.get_xticklabels(), rotation=20 if len(labels) < 20 else 90, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
