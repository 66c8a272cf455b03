"""Are the scripted demonstrations imitable? Behavior cloning with perfect perception.

A small MLP sees what a vision policy has to infer, the task's key object positions
(``env.privileged_state()``), plus the robot state and the task id. It is trained by regression on
expert action chunks recorded under DART noise ``noise`` and scored closed-loop on unseen seeds.
If this oracle cannot imitate the experts, an image policy trained the same way on the same data
will not either, whatever its encoder: the check separates "the demos teach the skill" from "the
model sees the scene".

Measured (``bench/imitability.py``): the oracle scores 100% at noise 0 and 0.1, 94% at 0.2 and 26%
at 0.3. Under heavy noise the expert's gripper and phase switches (close within 1.2 cm,
release within 8 mm) happen at states that noise scatters across the switch, so regression
averages the labels: the oracle hovers over the bowl with the gripper command stuck at +0.4.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from vlastack.sim.env import SUITES, make_env
from vlastack.sim.evaluate import evaluate
from vlastack.sim.generate import rollout_expert

ENV_KW = {"image_size": 16, "cameras": ("scene",)}  # the oracle ignores images: render little


def _features(state: np.ndarray, key: np.ndarray, task_id: int, num_tasks: int) -> np.ndarray:
    """robot state [..., 5] + key object positions [..., 6] + task one-hot -> float32 [..., 11 + num_tasks]."""
    onehot = np.broadcast_to(np.eye(num_tasks, dtype=np.float32)[task_id], (*state.shape[:-1], num_tasks))
    return np.concatenate([state, key, onehot], axis=-1).astype(np.float32)


def collect(tasks: tuple[str, ...], episodes: int, noise: float, horizon: int, seed: int = 0) -> dict:
    """Noisy expert rollouts -> {x [N, F], y [N, horizon, 4], valid [N, horizon], expert_success}."""
    xs, ys, valid, success = [], [], [], {}
    for k, task in enumerate(tasks):
        env = make_env(task, **ENV_KW)
        eps = [rollout_expert(env, seed + e, noise, privileged=True) for e in range(episodes)]
        env.close()
        success[task] = float(np.mean([ep["success"] for ep in eps]))
        for ep in eps:
            n = ep["length"]
            idx = np.arange(n)[:, None] + np.arange(horizon)[None]  # [n, horizon]
            xs.append(_features(ep["state"], ep["privileged"], k, len(tasks)))
            ys.append(ep["action"][np.minimum(idx, n - 1)])  # past the end: last action, masked out
            valid.append(idx < n)
    return {
        "x": np.concatenate(xs),
        "y": np.concatenate(ys),
        "valid": np.concatenate(valid).astype(np.float32),
        "expert_success": success,
    }


class OraclePolicy:
    """The trained MLP as an evaluator policy; reads the key positions through ``bind_env``."""

    needs_env = True

    def __init__(
        self, net: nn.Module, tasks: tuple[str, ...], x_mean: np.ndarray, x_std: np.ndarray, horizon: int
    ):
        self.net, self.tasks, self.x_mean, self.x_std, self.horizon = net, tasks, x_mean, x_std, horizon
        self.env = None

    def bind_env(self, env) -> None:
        self.env = env

    def infer(self, obs: dict) -> dict[str, np.ndarray]:
        """-> {"actions": float32 [horizon, 4]}."""
        k = self.tasks.index(self.env.task_name)
        f = (
            _features(obs["state"], self.env.privileged_state(), k, len(self.tasks)) - self.x_mean
        ) / self.x_std
        with torch.no_grad():
            out = self.net(torch.from_numpy(f[None]).float()).view(self.horizon, -1)
        return {"actions": out.clamp(-1.0, 1.0).numpy()}


def oracle_bc(
    tasks: tuple[str, ...] = SUITES["builtin"],
    noise: float = 0.1,
    episodes: int = 500,
    steps: int = 3000,
    eval_episodes: int = 50,
    horizon: int = 8,
    steps_per_chunk: int = 4,
    width: int = 256,
    seed: int = 0,
) -> dict:
    """Train the privileged-state oracle and evaluate it.

    -> {"oracle_success": {task: rate}, "oracle_mean", "noisy_expert_success": {task: rate}, "noise",
    "frames", "final_loss", "seconds"}.
    """
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    data = collect(tuple(tasks), episodes, noise, horizon, seed)
    x_mean, x_std = data["x"].mean(0), data["x"].std(0) + 1e-3
    x = torch.from_numpy((data["x"] - x_mean) / x_std).float()
    y, valid = torch.from_numpy(data["y"]), torch.from_numpy(data["valid"])
    act = y.shape[-1]
    net = nn.Sequential(
        nn.Linear(x.shape[1], width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(), nn.Linear(width, horizon * act),
    )  # fmt: skip
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(len(x), (256,), generator=gen)
        pred = net(x[idx]).view(-1, horizon, act)  # [256, H, A]
        se = (pred - y[idx]).pow(2).mean(-1) * valid[idx]
        loss = se.sum() / valid[idx].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    net.eval()
    policy = OraclePolicy(net, tuple(tasks), x_mean, x_std, horizon)
    res = evaluate(
        policy, tasks=tasks, episodes=eval_episodes * len(tasks), seed=1_000_000 + seed, num_workers=0,
        steps_per_chunk=steps_per_chunk, videos=0, **ENV_KW,
    )  # fmt: skip
    success = {t: v["success_rate"] for t, v in res["tasks"].items()}
    return {
        "noise": noise,
        "oracle_success": success,
        "oracle_mean": float(np.mean(list(success.values()))),
        "noisy_expert_success": data["expert_success"],
        "frames": len(x),
        "final_loss": float(loss.detach()),
        "seconds": time.perf_counter() - t0,
    }
