"""Episodes on a Ray cluster: ``vla eval --ray-address ADDRESS`` (``eval.ray_address``) and
``vla data generate --ray-address ADDRESS`` (``RayMap``).

Each episode is one Ray task (one CPU) running the same ``_episode_job`` a local worker process
runs, so a Ray evaluation writes the same ``eval.json`` as a local one: an episode is a pure
function of (policy, task, seed), and the results are put back in episode order. Ray reuses its
worker processes, so a worker builds the policy and each task's env once (``evaluate._WORKER``).

Faults: a task whose worker process or node dies is re-run elsewhere by Ray (``max_retries``;
system failures only, a policy's own error still stops the run with its message). The driver
collects each episode's result once, from its own task's reference, so nothing is lost or counted
twice, and every result is journaled as it arrives (``--resume`` continues after the driver dies).
One progress bar for the whole cluster (the driver's).

The policy spec travels to the workers (a checkpoint path must exist on every node: a shared file
system, or the same path copied to each); the model itself is never shipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

RETRIES = 3  # re-runs of an episode whose worker or node died


def _ray():
    try:
        import ray
    except ImportError:
        raise ValueError(
            "--ray-address (eval.ray_address) needs Ray: pip install 'vlastack[ray]' (or pip install ray); "
            "leave it empty to run the episodes in local processes"
        ) from None
    return ray


def connect(address: str) -> Any:
    """Join (or, for ``local``, start) the Ray cluster at ``address``: ``auto``, ``HOST:PORT`` or
    ``ray://HOST:10001``. Returns the ``ray`` module."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(
            address=None if address == "local" else address, log_to_driver=False, include_dashboard=False
        )
    return ray


def run_on_ray(
    address: str,
    episode_job: Callable[..., dict],
    spec: Any,
    env_kw: dict,
    run_kw: dict,
    jobs: list[tuple],
    on_result: Callable[[dict], Any] | None = None,
) -> list[dict]:
    """``episode_job(spec, env_kw, run_kw, *job)`` for each of ``jobs`` (episode, task, seed,
    record) as a Ray task -> the records in episode order; ``on_result`` gets each as it arrives.
    (The evaluator passes its own worker function, so this module imports nothing of it.)"""
    ray = connect(address)
    remote = ray.remote(num_cpus=1, max_retries=RETRIES)(_call)
    spec_ref, env_ref, run_ref = ray.put(spec), ray.put(env_kw), ray.put(run_kw)
    pending = {remote.remote(episode_job, spec_ref, env_ref, run_ref, *job): job for job in jobs}
    results: dict[int, dict] = {}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                job = pending.pop(ref)
                rec = ray.get(ref)  # a policy error raises here, with its own message
                results[job[0]] = on_result(rec) if on_result is not None else rec
    finally:
        for ref in pending:  # an error stopped the run: the other episodes are not needed
            ray.cancel(ref, force=True)
    return [results[j[0]] for j in jobs]


def _call(fn: Callable, *args: Any) -> Any:
    # (top-level arguments: Ray resolves the object references among them before the call)
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"  # one CPU per task, as Ray schedules it
    return fn(*args)


class RayMap:
    """The part of ``ProcessPoolExecutor`` that ``vla data generate`` uses, on a Ray cluster:
    ``map`` submits every call as a task (re-run elsewhere if its worker or node dies) and yields
    the results in submission order, so the dataset is written in the same order, with the same
    bytes, as with local workers."""

    def __init__(self, address: str) -> None:
        self.ray = connect(address)
        self._remote = self.ray.remote(num_cpus=1, max_retries=RETRIES)(_call)
        self._refs: list = []

    def map(self, fn: Callable, *iterables: Any):
        refs = [self._remote.remote(fn, *args) for args in zip(*iterables, strict=True)]
        self._refs += refs

        def results():
            for ref in refs:
                yield self.ray.get(ref)

        return results()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        if cancel_futures:
            for ref in self._refs:
                self.ray.cancel(ref, force=True)
        self._refs = []
