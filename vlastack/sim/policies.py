"""Baseline policies, policy specs for worker processes, and the check on what a policy returns.

A policy is any object with ``infer(obs) -> {"actions": float32 [H, A]}`` (env units) and
optionally ``reset()``. Policies that set ``needs_env = True`` also get ``bind_env(env)`` at the
start of each episode: this is the documented privileged hook the scripted expert uses.

Evaluation workers build their own policy from a *spec* (never a pickled model):

- ``"random"`` / ``"expert"``: the baselines below;
- a checkpoint folder: ``vlastack.infer.policy.Policy.from_pretrained(path)``;
- ``Checkpoint(path, decoding)``: the same with token-decoding options (``vla eval --decode``);
- any picklable zero-argument callable (a module-level function, ``functools.partial``...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PolicySpec = str | Callable[[], Any]


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder plus ``Policy`` decoding options (``DECODING_KEYS``: temperature,
    invalid_decode, exact_length...) as (key, value) pairs; picklable, built in each worker."""

    path: str
    decoding: tuple[tuple[str, str], ...] = ()

    def __call__(self) -> Any:
        from vlastack.infer.policy import Policy

        return Policy.from_pretrained(self.path, decoding=dict(self.decoding) or None)


class PolicyOutputError(ValueError):
    """A policy returned something that is not a finite float [H, A] action chunk."""


class RandomPolicy:
    """Uniform actions in [-1, 1]: the floor any trained policy should beat."""

    def __init__(self, action_dim: int = 4, horizon: int = 8, seed: int = 0):
        self.action_dim, self.horizon = action_dim, horizon
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        pass

    def infer(self, obs: dict) -> dict[str, np.ndarray]:
        a = self.rng.uniform(-1.0, 1.0, (self.horizon, self.action_dim))
        return {"actions": a.astype(np.float32)}


class ExpertPolicy:
    """The task's scripted expert as a policy. Reads privileged state through ``bind_env``.

    Returns a one-step chunk (the expert is closed-loop), so the evaluator re-queries every step.
    Works with any env that has ``expert_action()`` (the built-in suite and Meta-World adapter).
    """

    needs_env = True

    def __init__(self) -> None:
        self.env = None

    def bind_env(self, env) -> None:
        self.env = env

    def reset(self) -> None:
        pass

    def infer(self, obs: dict) -> dict[str, np.ndarray]:
        if self.env is None:
            raise RuntimeError("ExpertPolicy needs the env: call bind_env(env) before infer")
        return {"actions": np.asarray(self.env.expert_action(), np.float32)[None]}


def build_policy(spec: PolicySpec | Any) -> Any:
    """Spec (see module docstring) -> policy object. An object with ``infer`` is returned as is."""
    if hasattr(spec, "infer"):
        return spec
    if callable(spec):
        return spec()
    if not isinstance(spec, str):
        raise TypeError(f"policy spec must be a string, a callable or a policy, got {type(spec).__name__}")
    if spec == "random":
        return RandomPolicy()
    if spec == "expert":
        return ExpertPolicy()
    if not Path(spec).exists():
        raise ValueError(f"policy {spec!r} is neither 'random', 'expert' nor an existing checkpoint folder")
    from vlastack.infer.policy import Policy  # lazy: torch and the model load only when needed

    return Policy.from_pretrained(spec)


def policy_name(spec: PolicySpec | Any) -> str:
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Checkpoint):
        return spec.path
    return getattr(spec, "__qualname__", None) or type(spec).__name__


def check_actions(out: Any, action_dim: int, name: str, where: str) -> np.ndarray:
    """Validate ``policy.infer`` output -> float32 [H, action_dim]; raises ``PolicyOutputError``.

    ``where`` says when it happened (e.g. "step 12 of episode 3 (task push)") for the message.
    """
    prefix = f"policy {name!r} at {where}"
    if not isinstance(out, dict) or "actions" not in out:
        got = sorted(out) if isinstance(out, dict) else type(out).__name__
        raise PolicyOutputError(f"{prefix}: infer() must return {{'actions': array [H, A]}}, got {got}")
    a = out["actions"]
    if hasattr(a, "detach"):  # a torch tensor: say so rather than failing obscurely
        raise PolicyOutputError(f"{prefix}: 'actions' must be a numpy array, got a torch tensor")
    if not isinstance(a, np.ndarray):
        raise PolicyOutputError(f"{prefix}: 'actions' must be a numpy array, got {type(a).__name__}")
    if a.dtype not in (np.float32, np.float64):
        raise PolicyOutputError(f"{prefix}: 'actions' must be float32, got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] != action_dim:
        raise PolicyOutputError(
            f"{prefix}: 'actions' must have shape [H, {action_dim}] (H >= 1), got {tuple(a.shape)}"
        )
    if not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a))[0]
        raise PolicyOutputError(f"{prefix}: 'actions' contains NaN/inf (first at chunk index {tuple(bad)})")
    return a.astype(np.float32, copy=False)
