"""Baseline policies, policy specs for worker processes, and the check on what a policy returns.

A policy is any object with ``infer(obs) -> {"actions": float32 [H, A]}`` (env units) and
optionally ``reset()``. Policies that set ``needs_env = True`` also get ``bind_env(env)`` at the
start of each episode: this is the documented privileged hook the scripted expert uses.

Evaluation workers build their own policy from a *spec* (never a pickled model):

- ``"random"`` / ``"expert"``: the baselines below;
- a checkpoint folder: ``vlastack.infer.policy.Policy.from_pretrained(path)``;
- ``Checkpoint(path, decoding)``: the same with token-decoding options (``vla eval --decode``);
- ``"ws://host:port"``: a policy served by ``vla serve`` (or any openpi server), queried with
  openpi's client as openpi's own LIBERO example does (``RemotePolicy``);
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
    """A checkpoint folder plus ``Policy`` decoding options (its head's ``DECODING``: a token
    head's temperature, invalid_decode..., a flow head's step_noise...) as (key, value) pairs;
    picklable, built in each worker."""

    path: str
    decoding: tuple[tuple[str, str], ...] = ()

    def __call__(self) -> Any:
        from vlastack.infer.policy import Policy

        return Policy.from_pretrained(self.path, decoding=dict(self.decoding) or None)


class PolicyOutputError(ValueError):
    """A policy returned something that is not a finite float [H, A] action chunk."""


class RandomPolicy:
    """Uniform actions in [-1, 1]: the floor any trained policy should beat. Sized by the env it
    runs in (4 actions in the built-in suite and Meta-World, 7 in LIBERO)."""

    needs_env = True

    def __init__(self, action_dim: int = 4, horizon: int = 8, seed: int = 0):
        self.action_dim, self.horizon = action_dim, horizon
        self.rng = np.random.default_rng(seed)

    def bind_env(self, env) -> None:
        self.action_dim = int(env.action_space.shape[0])

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
        if not hasattr(env, "expert_action"):
            task = getattr(env, "task_name", type(env).__name__)
            raise ValueError(
                f"{task}: this suite has no scripted expert (the built-in suite and Meta-World do)"
            )
        self.env = env

    def reset(self) -> None:
        pass

    def infer(self, obs: dict) -> dict[str, np.ndarray]:
        if self.env is None:
            raise RuntimeError("ExpertPolicy needs the env: call bind_env(env) before infer")
        return {"actions": np.asarray(self.env.expert_action(), np.float32)[None]}


class RemotePolicy:
    """A served policy at ``ws://host:port``, through openpi's ``WebsocketClientPolicy``.

    Each observation goes out as openpi's flat keys (``observation/<camera>`` by the server's own
    camera names, ``observation/state``, ``prompt``) and the reply's whole chunk comes back; the
    evaluator runs ``steps_per_chunk`` of it (default: the server's ``replan_steps``).

    A server whose metadata says ``needs_reset`` keeps per-connection state across steps (a LeRobot
    policy's action queue, ``scripts/lerobot_policy_server.py``): ``reset()`` then sends
    ``{"reset": true}`` at every episode start, as lerobot-eval calls ``policy.reset()``."""

    def __init__(self, url: str) -> None:
        from openpi_client.websocket_client_policy import WebsocketClientPolicy

        host, port = _host_port(url)
        self.client = WebsocketClientPolicy(host, port)
        self.metadata = self.client.get_server_metadata()

    def reset(self) -> None:
        if self.metadata.get("needs_reset"):
            self.client.infer({"reset": True})

    def infer(self, obs: dict) -> dict[str, np.ndarray]:
        msg: dict[str, Any] = {f"observation/{cam}": img for cam, img in obs["images"].items()}
        msg["observation/state"] = np.asarray(obs["state"], np.float32)
        msg["prompt"] = obs["prompt"]
        return {"actions": np.asarray(self.client.infer(msg)["actions"], np.float32)}


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlparse

    u = urlparse(url)
    if u.scheme != "ws" or not u.hostname or u.port is None:
        raise ValueError(f"a served policy is ws://HOST:PORT, got {url!r}")
    return u.hostname, u.port


def server_metadata(url: str) -> dict:
    """``/metadata`` of the policy served at ``url`` (its cameras and replan_steps), one round trip."""
    client = RemotePolicy(url)
    try:
        return dict(client.metadata)
    finally:
        client.client._ws.close()


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
    if spec.startswith("ws://"):
        return RemotePolicy(spec)
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
