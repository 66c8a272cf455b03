"""Rollouts for on-policy RL: episodes side by side, one batched forward pass per step for every
episode that needs a chunk, the head *sampling* its action tokens; every decision is kept (the
observation and the tokens it drew) for the update.

The loop is ``sim.evaluate.run_lockstep``'s, with the head's sampler called through ``draw``, so
that what was sampled (a token head's ids, a flow head's denoising trajectory) comes back with the
actions. Episodes of one GRPO group start from the same seed (the same initial scene) and differ
only by what the policy sampled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vlastack.infer.chunking import ActionChunker
from vlastack.infer.obs import Obs
from vlastack.rl.envs import EnvPool, EnvWorkers


@dataclass
class Decision:
    """One query of the policy: the checked observation, what it sampled (``draw``'s second output
    for one row: LM ids int64 [L], or a denoising trajectory fp32 [n + 1, H, A]), and the episode
    (index into the rollout's episode list) it belongs to."""

    obs: Obs
    sample: torch.Tensor
    episode: int


@dataclass
class Rollout:
    # task, seed, group, success, steps, progress (the share of the first step's distance to done
    # that the episode closed, in [0, 1]; None where the env reports no ``info["distance"]``)
    episodes: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    invalid_chunks: int = 0


def progress(d0: float | None, d_end: float | None, success: bool) -> float | None:
    """The share of its distance to done an episode closed: 1 - d_end / d0 clipped to [0, 1], where
    d0 is the distance after the first step (the scene as the policy first moved it) and d_end after
    the last; 1 on success. None without distances (an env that reports none)."""
    if success:
        return 1.0
    if d0 is None or d_end is None:
        return None
    return float(np.clip(1.0 - float(d_end) / max(d0, 1e-6), 0.0, 1.0))


@torch.no_grad()
def collect(
    policy: Any,
    pool: EnvPool | EnvWorkers,
    jobs: list[tuple[str, int, int]],
    steps_per_chunk: int,
    draw: Callable[[dict], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    on_episode: Any = None,
) -> Rollout:
    """Run ``jobs`` ((task, seed, group) each) to the end, side by side. ``draw(batch)`` samples
    the policy -> (normalized actions [B, H, A], what was sampled [B, ...], valid bool [B]).
    -> the episodes (in ``jobs`` order) and every decision. ``on_episode(record)`` after each
    finished episode (a progress bar). The envs live in ``pool`` (``rl/envs.py``): this process, or
    workers that step them all at once."""
    slots = pool.take([t for t, _, _ in jobs])
    first = pool.reset([(slot, seed) for slot, (_, seed, _) in zip(slots, jobs, strict=True)])
    out = Rollout()
    runs = []
    for i, (slot, obs, (task, seed, group)) in enumerate(zip(slots, first, jobs, strict=True)):
        out.episodes.append({"task": task, "seed": seed, "group": group, "success": False, "steps": 0})
        runs.append({"i": i, "slot": slot, "obs": obs, "t": 0, "done": False,
                     "chunker": ActionChunker(steps_per_chunk), "d0": None})  # fmt: skip
    while active := [r for r in runs if not r["done"]]:
        asking = [r for r in active if r["chunker"].needs_chunk()]
        if asking:
            checked = [policy.check(r["obs"]) for r in asking]
            batch = policy.model_batch(checked)
            normalized, sampled, valid = draw(batch)
            actions = policy.to_env_actions(normalized)
            out.invalid_chunks += int((~valid).sum())
            for k, r in enumerate(asking):
                r["chunker"].add(actions[k])
                out.decisions.append(Decision(checked[k], sampled[k].cpu(), r["i"]))
        steps = pool.step([(r["slot"], r["chunker"].next_action().astype(np.float32)) for r in active])
        for r, (obs, _, terminated, truncated, info) in zip(active, steps, strict=True):
            r["obs"], r["t"] = obs, r["t"] + 1
            if r["d0"] is None and "distance" in info:
                r["d0"] = float(info["distance"])
            if terminated or truncated:
                r["done"] = True
                ep = out.episodes[r["i"]]
                ok = bool(info.get("success", terminated))
                ep.update(success=ok, steps=r["t"], progress=progress(r["d0"], info.get("distance"), ok))
                if on_episode is not None:
                    on_episode(ep)
    return out
