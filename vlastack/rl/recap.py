"""RECAP-style advantage conditioning (pi*0.6, Physical Intelligence 2025, arXiv 2511.14759): the
offline alternative to ``vla rl``'s on-policy updates, trained with the ordinary trainer.

    vla recap collect --policy runs/flow/final --out runs/recap/rollouts --episodes-per-task 200
    vla recap label --policy runs/flow/final --data runs/more_data --data runs/recap/rollouts \\
        --out runs/recap/data
    vla train --config runs/flow/final/config.yaml --data runs/recap/data train.init_from=runs/flow/final \\
        data.norm_stats=init_from model.advantage_conditioning=true model.max_text_len=45

1. ``collect``: the policy, sampling as ``vla eval`` runs it, on seeds of its own (from 4,000,000:
   disjoint from data, validation and test seeds). Every episode is kept, failures included, with
   its reward and success per frame: a LeRobot v3 dataset laid out like the expert's.
2. ``label``, the value: ``V(o)`` in (0, 1) predicts the discounted success ``G_t = gamma ** (T - 1
   - t)`` if the episode succeeds at its last frame ``T - 1``, else 0. A small MLP on the frozen
   policy's own view of the frame (``frame_features``: its prefix embedding, image tokens pooled
   to a 2 x 2 grid per camera, the mean text token; the normalized state; the step). It is fitted
   by episode-disjoint cross-fitting: a frame's value comes from a network that never saw its
   episode, so the Monte Carlo advantage is not fitted away.
3. ``label``, the indicator: ``A_t = G_t - V(o_t)``; a frame is positive when ``A_t`` is above its
   task's ``1 - positive_fraction`` quantile (pi*0.6 sets the threshold per task so that about
   30% of frames are positive); ``positive_data`` datasets (pi*0.6's human corrections; here
   expert demonstrations) are positive throughout. The datasets are merged into one with the
   ``advantage.positive`` column (``data/samples.py`` reads it).
4. Training: ``model.advantage_conditioning=true`` writes "Advantage: positive" or "negative" into
   each frame's prompt (``models/prompt.py``); ``Policy`` then asks for "positive".

Pure functions of their inputs and seeds: the same arguments give the same dataset.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vlastack.data.samples import ADVANTAGE_KEY, ENV_KEY, ENV_UV_KEY
from vlastack.progress import Progress

COLLECT_SEED = 4_000_000  # rollout seeds: data 0.., eval 1e6, validation 2e6, vla rl 3e6
REWARD_KEY, SUCCESS_KEY = "next.reward", "next.success"  # as sim/generate.py writes them
VALUE_FILE = "recap_value.json"  # what `label` measured, beside the labelled dataset


# ---------------------------------------------------------------------------- 1. collect


class _Recorder:
    """Wraps an env pool (``rl/envs.py``: in this process, worker processes or Ray actors) and keeps
    every frame of every episode it runs. The built-in suites' privileged key points are kept too,
    for recipes that supervise grounding with them (``model.grounding``, as the expert's data has
    them); the value never sees them."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.live, self.done = pool, {}, []

    def _keep(self, frames: list[tuple[Any, dict]]) -> None:
        """Append each (slot, observation) to its live episode, with the env's key points now."""
        if not frames:
            return
        for (slot, obs), priv in zip(
            frames, self.pool.privileged([(s, None) for s, _ in frames]), strict=True
        ):
            ep = self.live[slot]
            ep["obs"].append(obs)
            if priv is not None:
                ep["privileged"].append(np.asarray(priv[0], np.float32))
                ep["uv"].append({c: np.asarray(v, np.float32) for c, v in priv[1].items()})

    def take(self, tasks: list[str]) -> list:
        return self.pool.take(tasks)

    def reset(self, pairs: list) -> list:
        obs = self.pool.reset(pairs)
        for slot, seed in pairs:
            self.live[slot] = {"task": slot[0], "seed": int(seed), "obs": [], "action": [], "reward": [],
                               "success": [], "privileged": [], "uv": []}  # fmt: skip
        self._keep([(slot, o) for (slot, _), o in zip(pairs, obs, strict=True)])
        return obs

    def step(self, pairs: list) -> list:
        out = self.pool.step(pairs)
        going = []
        for (slot, action), (obs, reward, terminated, truncated, info) in zip(pairs, out, strict=True):
            ep = self.live[slot]
            ep["action"].append(np.asarray(action, np.float32))
            ep["reward"].append(float(reward))
            ep["success"].append(bool(info.get("success", terminated)))
            if terminated or truncated:
                self.done.append(self.live.pop(slot))
            else:
                going.append((slot, obs))
        self._keep(going)
        return out

    def close(self) -> None:
        self.pool.close()


def collect(
    policy_dir: str | Path,
    out: str | Path,
    episodes_per_task: int,
    tasks: tuple[str, ...] = (),
    seed: int = COLLECT_SEED,
    ema: bool = False,
    batch_episodes: int = 16,
    num_threads: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    env_workers: int = 0,
    ray_address: str = "",
) -> dict[str, Any]:
    """Roll the policy at ``policy_dir`` out ``episodes_per_task`` times on each task (seeds
    ``seed + i``), ``batch_episodes`` side by side, and write every episode to a LeRobot v3
    dataset at ``out``. The envs live in this process, in ``env_workers`` worker processes, or in
    that many Ray actors on ``ray_address`` (``rl/envs.py``: the same episodes wherever they run).
    -> {task: success rate}, also in ``out/meta/recap_rollouts.json``."""
    from vlastack.data.lerobot import LeRobotWriter
    from vlastack.infer.policy import Policy
    from vlastack.rl.envs import make_pool, rollout_env_kw
    from vlastack.rl.rollout import collect as run_episodes
    from vlastack.sim.env import suite_tasks

    if episodes_per_task < 1 or batch_episodes < 1:
        raise ValueError(f"need episodes_per_task >= 1 and batch_episodes >= 1, got {episodes_per_task}, "
                         f"{batch_episodes}")  # fmt: skip
    if ray_address and not env_workers:
        raise ValueError(
            "a Ray address needs env_workers >= 1 (--env-workers: the Ray actors to run the envs on)"
        )
    if num_threads:
        torch.set_num_threads(num_threads)
    cpu0 = _cpu_s()
    policy = Policy.from_pretrained(policy_dir, ema=ema, seed=seed)
    cfg = _config(policy_dir)
    names = suite_tasks(cfg.eval.suite, tuple(tasks) or tuple(cfg.eval.tasks))
    env_kw = rollout_env_kw(cfg)
    rec = _Recorder(make_pool(env_kw, env_workers, ray_address))
    jobs = [(t, seed + i, 0) for t in names for i in range(episodes_per_task)]
    c = policy.cfg

    def draw(batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # Policy._run's sampler
        noise = torch.randn((len(batch["state"]), c.action_horizon, c.action_dim), generator=policy.generator)
        actions, valid = policy.serving.sample(batch, noise.to(policy.device))
        ok = torch.ones(len(actions), dtype=torch.bool) if valid is None else valid.cpu()
        return actions, torch.zeros(len(actions), 1), ok

    episodes: list[dict] = []
    try:
        with Progress(len(jobs), "recap collect", "episode", enabled=progress) as bar:
            for i in range(0, len(jobs), batch_episodes):
                run_episodes(policy, rec, jobs[i : i + batch_episodes], cfg.eval.steps_per_chunk, draw,
                             on_episode=lambda _ep: bar.update(1))  # fmt: skip
                # the recorder finishes episodes in the order they end: back to job order
                order = {(t, s): k for k, (t, s, _) in enumerate(jobs[i : i + batch_episodes])}
                episodes += sorted(rec.done, key=lambda e: order[e["task"], e["seed"]])
                rec.done = []
    finally:
        rec.close()
    first = episodes[0]["obs"][0]
    cams = list(c.camera_names)
    hwc = ["height", "width", "channels"]
    features: dict[str, dict[str, Any]] = {
        f"observation.images.{k}": {"dtype": "video", "shape": list(first["images"][k].shape), "names": hwc}
        for k in cams
    }
    features["observation.state"] = {"dtype": "float32", "shape": [len(first["state"])], "names": None}
    features["action"] = {"dtype": "float32", "shape": [len(episodes[0]["action"][0])], "names": None}
    features[REWARD_KEY] = {"dtype": "float32", "shape": [1], "names": None}
    features[SUCCESS_KEY] = {"dtype": "bool", "shape": [1], "names": None}
    if episodes[0]["privileged"]:
        features[ENV_KEY] = {"dtype": "float32", "shape": [len(episodes[0]["privileged"][0])], "names": None}
        for k in episodes[0]["uv"][0]:
            features[f"{ENV_UV_KEY}.{k}"] = {"dtype": "float32", "shape": [4], "names": None}
    fps = int(json.loads((Path(cfg.data.path) / "meta" / "info.json").read_text())["fps"]) if (
        cfg.data.path and (Path(cfg.data.path) / "meta" / "info.json").exists()) else 10  # fmt: skip
    writer = LeRobotWriter(out, fps=fps, features=features, robot_type="vlastack_rollouts", overwrite=overwrite,
                           video_pix_fmt="yuv444p", video_crf=0)  # fmt: skip
    try:
        for ep in episodes:
            data = {f"observation.images.{k}": np.stack([o["images"][k] for o in ep["obs"]]) for k in cams}
            data["observation.state"] = np.stack([np.asarray(o["state"], np.float32) for o in ep["obs"]])
            data["action"] = np.stack(ep["action"])
            data[REWARD_KEY] = np.asarray(ep["reward"], np.float32)[:, None]
            data[SUCCESS_KEY] = np.asarray(ep["success"], bool)[:, None]
            if ep["privileged"]:
                data[ENV_KEY] = np.stack(ep["privileged"])
                data.update({f"{ENV_UV_KEY}.{k}": np.stack([u[k] for u in ep["uv"]]) for k in ep["uv"][0]})
            writer.add_episode(data, task=ep["obs"][0]["prompt"])
        writer.finalize()
    except BaseException:
        writer.abort()
        raise
    rates = {t: float(np.mean([e["success"][-1] for e in episodes if e["task"] == t])) for t in names}
    listed = [{"task": e["task"], "seed": e["seed"], "length": len(e["action"]), "success": e["success"][-1]}
              for e in episodes]  # fmt: skip
    meta = {"policy": str(policy_dir), "ema": ema, "seed": seed, "episodes_per_task": episodes_per_task,
            "success": rates, "cpu_s": round(_cpu_s() - cpu0, 1), "episodes": listed}  # fmt: skip
    (Path(out) / "meta" / "recap_rollouts.json").write_text(json.dumps(meta) + "\n")
    return rates


def _cpu_s() -> float:
    """CPU seconds of this process so far, every thread (what the RL runs' budgets count)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _config(policy_dir: str | Path):
    from vlastack.config import load_yaml

    return load_yaml(Path(policy_dir) / "config.yaml")


# ---------------------------------------------------------------------------- 2. the value


def returns(success: np.ndarray, lengths: list[int], gamma: float) -> np.ndarray:
    """Per frame: ``gamma ** (T - 1 - t)`` if its episode's last frame succeeds, else 0.
    ``success`` bool [N] (each frame's ``next.success``), ``lengths`` the episodes' in order. -> fp32 [N]."""
    out, at = np.zeros(len(success), np.float32), 0
    for n in lengths:
        if success[at + n - 1]:
            out[at : at + n] = gamma ** np.arange(n - 1, -1, -1, dtype=np.float32)
        at += n
    return out


@torch.no_grad()
def frame_features(
    policy: Any, ds: Any, max_steps: int, batch: int = 64, progress: bool = True
) -> np.ndarray:
    """The frozen policy's view of every frame of ``ds`` (a ``data.reader.LeRobotDataset``) ->
    fp32 [N, F]: per camera its image tokens mean-pooled on a 2 x 2 grid, the mean text token,
    the normalized state, and the step / ``max_steps``."""
    from vlastack.data.samples import dataset_camera_key

    c = policy.cfg
    keys = [dataset_camera_key(k, ds.camera_keys) for k in c.camera_names]
    tasks = ds.tasks
    n = len(ds.columns["index"])
    state = np.asarray(ds.columns["observation.state"], np.float32)
    step = np.asarray(ds.columns["frame_index"], np.float32).reshape(-1)
    task_index = np.asarray(ds.columns["task_index"]).reshape(-1)
    out = []
    with Progress(n, "recap features", "frame", enabled=progress) as bar:
        for i in range(0, n, batch):
            idx = range(i, min(n, i + batch))
            obs = [policy.check({"images": {cam: ds.image(k, t) for cam, k in zip(c.camera_names, keys, strict=True)},
                                 "state": state[t], "prompt": tasks[int(task_index[t])]}) for t in idx]  # fmt: skip
            b = policy.model_batch(obs)
            prefix, _ = policy.model.embed_prefix(b)
            p = policy.model.vision.num_patches
            side = round(p**0.5)
            img = prefix[:, : c.num_cameras * p].float().reshape(len(obs), c.num_cameras, side, side, -1)
            grid = torch.nn.functional.adaptive_avg_pool2d(img.permute(0, 1, 4, 2, 3).flatten(1, 2), 2)
            txt_mask = b["token_mask"].float()[..., None]
            txt = (prefix[:, c.num_cameras * p :].float() * txt_mask).sum(1) / txt_mask.sum(1).clamp(min=1)
            out.append(torch.cat([grid.flatten(1), txt, b["state"].float(),
                                  torch.from_numpy(step[i : i + len(obs)] / max_steps)[:, None]], 1).numpy())  # fmt: skip
            bar.update(len(obs))
    return np.concatenate(out)


class ValueNet(nn.Module):
    """features [B, F] -> logit of V [B] (``sigmoid`` is the value in (0, 1))."""

    def __init__(self, dim: int, width: int = 256) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                                 nn.Linear(width, 1))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(x.float())).squeeze(-1)


def fit_value(
    x: np.ndarray, y: np.ndarray, epochs: int = 20, lr: float = 1e-3, batch: int = 512, seed: int = 0
) -> ValueNet:
    """Binary cross-entropy on the soft targets ``y`` in [0, 1] (fp32 throughout)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = ValueNet(x.shape[1])
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    steps = epochs * max(1, len(x) // batch)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for j in range(0, len(x) - batch + 1 if len(x) >= batch else 1, batch):
            k = perm[j : j + batch]
            loss = nn.functional.binary_cross_entropy_with_logits(net(xt[k]), yt[k])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return net.eval()


def cross_fit_values(
    x: np.ndarray, y: np.ndarray, episode: np.ndarray, folds: int = 2, seed: int = 0, **kw: Any
) -> tuple[np.ndarray, dict[str, float]]:
    """Each frame's value from a network fitted on the other folds' episodes (``episode`` [N]: a
    global episode id per frame). -> (V fp32 [N], held-out BCE and that of the mean predictor)."""
    rng = np.random.default_rng(seed)
    ids = np.unique(episode)
    fold_of = dict(zip(ids, rng.permutation(len(ids)) % folds, strict=True))
    fold = np.array([fold_of[e] for e in episode])
    v = np.zeros(len(y), np.float32)
    for f in range(folds):
        held = fold == f
        net = fit_value(x[~held], y[~held], seed=seed + f, **kw)
        with torch.no_grad():
            v[held] = torch.sigmoid(net(torch.from_numpy(x[held]))).numpy()

    def bce(p: np.ndarray) -> float:
        p = np.clip(p, 1e-6, 1 - 1e-6)
        return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))

    return v, {"bce_heldout": bce(v), "bce_constant": bce(np.full_like(y, y.mean()))}


# ---------------------------------------------------------------------------- 3. label


def indicators(adv: np.ndarray, task: np.ndarray, positive_fraction: float) -> np.ndarray:
    """bool [N]: ``adv`` above its task's ``1 - positive_fraction`` quantile (``task`` [N] ids)."""
    if not 0 < positive_fraction < 1:
        raise ValueError(f"positive_fraction must be in (0, 1), got {positive_fraction}")
    out = np.zeros(len(adv), bool)
    for t in np.unique(task):
        m = task == t
        out[m] = adv[m] > np.quantile(adv[m], 1 - positive_fraction)
    return out


def label(
    policy_dir: str | Path,
    data: list[str | Path],
    out: str | Path,
    ema: bool = False,
    gamma: float = 0.95,
    positive_fraction: float = 0.3,
    folds: int = 2,
    seed: int = 0,
    num_threads: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    positive_data: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """Fit the value on every frame of ``positive_data`` and ``data``, label each frame, and merge
    them (in that order) into one dataset at ``out`` with the ``advantage.positive`` column (the
    features every input has). ``positive_data``: datasets positive throughout, as pi*0.6 labels
    its human corrections (here: expert demonstrations); ``data``'s frames are positive in their
    task's top ``positive_fraction`` of advantages among ``data`` alone.
    -> the report also written to ``out/meta/recap_value.json``."""
    from vlastack.data.reader import LeRobotDataset
    from vlastack.infer.policy import Policy
    from vlastack.sim.generate import merge_datasets

    if not data:
        raise ValueError("label needs at least one --data dataset to label")
    forced = len(positive_data)
    data = [*positive_data, *data]
    if gamma <= 0 or gamma > 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    if num_threads:
        torch.set_num_threads(num_threads)
    t0, cpu0 = time.perf_counter(), _cpu_s()
    policy = Policy.from_pretrained(policy_dir, ema=ema)
    max_steps = max(1, _config(policy_dir).eval.max_steps or 50)
    feats, ys, eps, tasks, lengths, source = [], [], [], [], [], []
    task_ids: dict[str, int] = {}
    for d, path in enumerate(data):
        ds = LeRobotDataset(path)
        try:
            if SUCCESS_KEY not in ds.features:
                raise ValueError(f"{path}: no {SUCCESS_KEY!r} feature: the value needs each frame's success")
            ep = np.asarray(ds.columns["episode_index"]).reshape(-1)
            lens = [ds.episode_range(k)[1] - ds.episode_range(k)[0] for k in range(ds.num_episodes)]
            succ = np.asarray(ds.columns[SUCCESS_KEY]).reshape(-1).astype(bool)
            feats.append(frame_features(policy, ds, max_steps, progress=progress))
            ys.append(returns(succ, lens, gamma))
            eps.append(ep + 1_000_000 * d)
            names = [ds.tasks[int(i)] for i in np.asarray(ds.columns["task_index"]).reshape(-1)]
            tasks.append(np.array([task_ids.setdefault(n, len(task_ids)) for n in names]))
            lengths.append(lens)
            source.append(np.full(len(ep), d))
        finally:
            ds.close()
    x, y, episode, task, src = map(np.concatenate, (feats, ys, eps, tasks, source))
    v, fit = cross_fit_values(x, y, episode, folds=folds, seed=seed)
    adv = y - v
    positive = np.ones(len(adv), bool)  # positive_data's frames
    ranked = src >= forced
    positive[ranked] = indicators(adv[ranked], task[ranked], positive_fraction)
    per_source = [{"data": str(p), "forced_positive": d < forced, "frames": int((src == d).sum()),
                   "positive": float(positive[src == d].mean()),
                   "mean_return": float(y[src == d].mean()), "mean_value": float(v[src == d].mean())}
                  for d, p in enumerate(data)]  # fmt: skip
    offsets = np.cumsum([0, *[int((src == d).sum()) for d in range(len(data))]])
    starts = [np.cumsum([0, *lens]) for lens in lengths]

    def columns(part: int, episode_k: int, length: int) -> dict[str, np.ndarray]:
        at = offsets[part] + starts[part][episode_k]
        return {ADVANTAGE_KEY: positive[at : at + length, None]}

    keep = _common_features(data)
    merge_datasets([Path(p) for p in data], Path(out), "lossless", overwrite, progress, keep=keep,
                   extra={ADVANTAGE_KEY: {"dtype": "bool", "shape": [1], "names": None}},
                   columns=columns)  # fmt: skip
    report = {"policy": str(policy_dir), "ema": ema, "gamma": gamma, "positive_fraction": positive_fraction,
              "folds": folds, "seed": seed, "frames": len(y), "features": int(x.shape[1]), **fit,
              "positive": float(positive.mean()), "sources": per_source,
              "seconds": round(time.perf_counter() - t0, 1), "cpu_s": round(_cpu_s() - cpu0, 1)}  # fmt: skip
    (Path(out) / "meta" / VALUE_FILE).write_text(json.dumps(report, indent=1) + "\n")
    return report


def _common_features(data: list[str | Path]) -> list[str]:
    """The features every dataset of ``data`` has, in the first one's order."""
    infos = [json.loads((Path(p) / "meta" / "info.json").read_text())["features"] for p in data]
    return [k for k in infos[0] if all(k in f for f in infos[1:]) and k != ADVANTAGE_KEY]
