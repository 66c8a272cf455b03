"""Where ``vla rl``'s rollout envs live: in this process (``EnvPool``), or in worker processes or
Ray actors (``EnvWorkers``: ``rl.env_workers``, ``rl.ray_address``) that step their envs at the
same time while the learner batches the policy over every episode that asks for a chunk.

Both are a vector of env *slots* with the same three calls, so ``rollout.collect`` is one loop:

    slots = pool.take(["push", "push", "stack"])        # one slot per episode, reused across iterations
    obs = pool.reset([(slot, seed), ...])                # -> [obs]
    out = pool.step([(slot, action), ...])               # -> [(obs, terminated, truncated, info)]

A slot is ``(task, i)``: the i-th env of that task, built on first use and kept (building a MuJoCo
scene costs more than resetting it). An episode is a pure function of its task, seed and actions,
so where its env runs changes nothing: ``tests/rl/test_envs.py`` checks that rollouts through
worker processes equal rollouts in this process, sample for sample.

Workers: slot k (in order of first use) lives on worker ``k % n``. A worker's error comes back with
its traceback; a worker that dies stops the run (its envs' episodes cannot be continued elsewhere;
``vla rl --resume`` redoes the iteration).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import traceback
from typing import Any

import numpy as np

Slot = tuple[str, int]


def rollout_env_kw(cfg: Any) -> dict[str, Any]:
    """``make_env`` keywords for a policy's rollouts: its evaluation setting and cameras."""
    ev = cfg.eval
    return {"suite": ev.suite, "image_size": ev.image_size, "cameras": tuple(cfg.model.camera_names),
            "max_steps": ev.max_steps, "render_quality": ev.render_quality}  # fmt: skip


def take(tasks: list[str]) -> list[Slot]:
    """One slot per entry of ``tasks`` (the same task twice: two envs)."""
    used: dict[str, int] = {}
    out = []
    for t in tasks:
        used[t] = used.get(t, -1) + 1
        out.append((t, used[t]))
    return out


class EnvPool:
    """Envs by slot, in this process (``rl.env_workers=0``), or in one worker of ``EnvWorkers``."""

    take = staticmethod(take)

    def __init__(self, env_kw: dict[str, Any]) -> None:
        self.env_kw = env_kw
        self.envs: dict[Slot, Any] = {}

    def _env(self, slot: Slot) -> Any:
        env = self.envs.get(slot)
        if env is None:
            from vlastack.sim.env import make_env

            env = self.envs[slot] = make_env(slot[0], **self.env_kw)
        return env

    def reset(self, items: list[tuple[Slot, int]]) -> list[dict]:
        return [self._env(slot).reset(seed=seed)[0] for slot, seed in items]

    def step(self, items: list[tuple[Slot, np.ndarray]]) -> list[tuple]:
        return [self._env(slot).step(action) for slot, action in items]

    def privileged(self, items: list[tuple[Slot, Any]]) -> list[tuple | None]:
        """Each slot's privileged key points now: (state float32 [6], {camera: uv [4]}) on the
        built-in suites, else None (``vla recap collect`` keeps them for grounding recipes)."""
        out: list[tuple | None] = []
        for slot, _ in items:
            env = self._env(slot)
            out.append(
                (env.privileged_state(), env.privileged_uv()) if hasattr(env, "privileged_state") else None
            )
        return out

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        self.envs.clear()


def _serve(conn: Any, env_kw: dict[str, Any]) -> None:
    """A worker process: (method, items) in, ("ok", result) or ("error", traceback) out."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    host = EnvPool(env_kw)
    try:
        while True:
            method, items = conn.recv()
            if method == "close":
                break
            try:
                conn.send(("ok", getattr(host, method)(items)))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        host.close()


class _ProcessWorker:
    def __init__(self, env_kw: dict[str, Any], index: int) -> None:
        ctx = mp.get_context("spawn")  # the learner holds torch threads and maybe open renderers
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, env_kw), daemon=True, name=f"rl-env-{index}")
        self.proc.start()
        child.close()
        self.index = index

    def send(self, method: str, items: list) -> None:
        self.conn.send((method, items))

    def receive(self) -> list:
        try:
            status, value = self.conn.recv()
        except EOFError:
            raise RuntimeError(
                f"rl env worker {self.index} died (exit code {self.proc.exitcode}); "
                "vla rl --resume redoes the iteration"
            ) from None
        if status == "error":
            raise RuntimeError(f"rl env worker {self.index} failed:\n{value}")
        return value

    def close(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self.conn.send(("close", None))
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
        self.conn.close()


class _RayWorker:
    def __init__(self, ray: Any, actor_cls: Any, env_kw: dict[str, Any], index: int) -> None:
        self.ray, self.index = ray, index
        self.actor = actor_cls.remote(env_kw)
        self.pending = None

    def send(self, method: str, items: list) -> None:
        self.pending = getattr(self.actor, method).remote(items)

    def receive(self) -> list:
        ref, self.pending = self.pending, None
        return self.ray.get(ref)

    def close(self) -> None:
        try:
            self.ray.get(self.actor.close.remote(), timeout=30)
        finally:
            self.ray.kill(self.actor)


class EnvWorkers:
    """``n`` worker processes (or, with ``ray_address``, Ray actors of one CPU each) holding the
    envs; ``reset`` and ``step`` send each worker its slots' share at once and wait for all."""

    def __init__(self, env_kw: dict[str, Any], n: int, ray_address: str = "") -> None:
        if n < 1:
            raise ValueError(f"EnvWorkers needs n >= 1 workers, got {n}")
        if ray_address:
            from vlastack.sim.ray_pool import connect

            ray = connect(ray_address)
            actor_cls = ray.remote(num_cpus=1)(EnvPool)
            self.workers: list = [_RayWorker(ray, actor_cls, env_kw, i) for i in range(n)]
        else:
            self.workers = [_ProcessWorker(env_kw, i) for i in range(n)]
        self.home: dict[Slot, int] = {}  # slot -> worker, fixed at first use

    take = staticmethod(take)

    def _call(self, method: str, items: list[tuple[Slot, Any]]) -> list:
        share: dict[int, list[int]] = {}
        for k, (slot, _) in enumerate(items):
            w = self.home.setdefault(slot, len(self.home) % len(self.workers))
            share.setdefault(w, []).append(k)
        for w, ks in share.items():
            self.workers[w].send(method, [items[k] for k in ks])
        out: list = [None] * len(items)
        for w, ks in share.items():
            for k, result in zip(ks, self.workers[w].receive(), strict=True):
                out[k] = result
        return out

    def reset(self, items: list[tuple[Slot, int]]) -> list[dict]:
        return self._call("reset", items)

    def step(self, items: list[tuple[Slot, np.ndarray]]) -> list[tuple]:
        return self._call("step", items)

    def privileged(self, items: list[tuple[Slot, Any]]) -> list[tuple | None]:
        return self._call("privileged", items)

    def close(self) -> None:
        for w in self.workers:
            w.close()


def make_pool(env_kw: dict[str, Any], workers: int = 0, ray_address: str = "") -> EnvPool | EnvWorkers:
    """``rl.env_workers`` = 0: the envs in this process; else that many workers (processes, or Ray
    actors with ``rl.ray_address``)."""
    return EnvWorkers(env_kw, workers, ray_address) if workers else EnvPool(env_kw)
