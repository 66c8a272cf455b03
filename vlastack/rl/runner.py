"""``vla rl``: GRPO fine-tuning of a trained policy in simulation (docs/rl.md): a token head's
sampled tokens, or a flow head's noisy denoising steps: what a head samples and its
log-probabilities are the head's own (``rl_sample`` / ``rl_logprobs`` of its serving class,
``models/heads/flow/rl.py``, ``models/heads/tokens/rl.py``; a head without them is refused).

    vla rl --policy runs/fast/final --out runs/fast_rl rl.iterations=40 rl.tasks=[push]

One iteration (``RLConfig``): ``groups`` seeds x ``group_size`` rollouts sampled at
``rl.temperature`` (tokens) or with ``rl.flow_sigma`` noise per denoising step (flow;
``rollout.collect``) -> rewards (the task's success, 0/1; failures shaped by their progress with
``rl.progress_reward``) -> group-relative advantages (``grpo.group_advantages``) -> ``rl.epochs``
passes of the clipped surrogate over the decisions of the informative groups
(``grpo.clipped_loss``; + ``rl.imitation_coef`` x the training loss on demonstrations,
``anchor.py``) -> a checkpoint.

The run folder is a training run's: ``checkpoints/step_<iteration>/`` (a policy folder plus
``train_state``: the optimizer), ``metrics.jsonl`` (one row per iteration: rollout success by task,
informative groups, the update's statistics, CPU seconds), ``config.yaml`` and ``final/`` (a
policy folder ``vla eval`` takes). With ``rl.eval_every`` on, ``best/`` is the policy of the
iteration with the best validation success so far (the earliest on a tie; ``best.json`` says
which), so a run that peaks and then drifts is picked by its validation seeds, never by the test
seeds. ``--resume`` continues from the latest checkpoint and draws what an uninterrupted run
draws: each iteration's seeds and sampling noise depend only on its index. The envs live in this
process or in workers (``rl.env_workers``, ``rl/envs.py``); ``vla doctor --run`` reads the folder.
"""

from __future__ import annotations

import json
import resource
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlastack.config import Config, save_yaml
from vlastack.diagnostics.run_report import rl_report
from vlastack.infer.policy import Policy
from vlastack.progress import Progress
from vlastack.rl.envs import make_pool, rollout_env_kw
from vlastack.rl.grpo import clipped_loss, group_advantages
from vlastack.rl.rollout import Decision, collect
from vlastack.sim.env import suite_tasks
from vlastack.train.checkpoint import begin, claim_run_dir, commit, export_final, latest_checkpoint, sweep
from vlastack.train.state import atomic_write_text, load_state, save_state

METRICS = "metrics.jsonl"
STATE = "train_state"  # the optimizer's folder in a checkpoint; export_final leaves it out of final/
START_VALIDATION = "validation_start.json"  # the start's greedy score on the validation seeds


def episode_rewards(episodes: list[dict[str, Any]], progress_reward: float) -> torch.Tensor:
    """Each episode's reward: 1 for a success; a failure earns ``progress_reward`` x its progress
    (``rollout.progress``), 0 with the sparse reward. -> fp32 [E]. An env without distances cannot
    shape: refused."""
    out = []
    for e in episodes:
        if e["success"] or not progress_reward:
            out.append(float(e["success"]))
            continue
        if e.get("progress") is None:
            raise ValueError(
                f"rl.progress_reward={progress_reward} shapes a failure by its distance to done, and "
                f"task {e['task']!r}'s env reports none (info['distance']): set rl.progress_reward=0"
            )
        out.append(progress_reward * e["progress"])
    return torch.tensor(out, dtype=torch.float32)


def iteration_jobs(rl: Any, tasks: tuple[str, ...], it: int) -> list[tuple[str, int, int]]:
    """Iteration ``it``'s rollouts: ``groups`` seeds, ``group_size`` episodes each. Group g is seed
    ``env_seed + it * groups + g`` on task ``tasks[(it * groups + g) % len(tasks)]`` (the tasks
    take turns, as evaluation's "spread" scheme; a task named twice gets twice the groups, while
    validation scores each task once). -> [(task, seed, group)]."""
    out = []
    for g in range(rl.groups):
        k = it * rl.groups + g
        out += [(tasks[k % len(tasks)], rl.env_seed + k, g)] * rl.group_size
    return out


class RLRun:
    """A GRPO run from a policy folder into ``out_dir`` (``fit``)."""

    def __init__(
        self,
        policy_dir: str | Path,
        cfg: Config,
        out_dir: str | Path,
        *,
        ema: bool = False,
        resume: bool = False,
        overwrite: bool = False,
    ) -> None:
        self.cfg, self.rl = cfg, cfg.rl
        self.out = Path(out_dir)
        self.source = Path(policy_dir)
        if resume and overwrite:
            raise ValueError(
                "--resume continues the run in --out and --overwrite deletes it: pass one of them"
            )
        latest = latest_checkpoint(self.out) if resume else None
        if resume and latest is None:
            raise ValueError(f"--resume: {self.out} has no checkpoint to continue from")
        if not resume:
            claim_run_dir(self.out, overwrite)
        if self.rl.num_threads:
            torch.set_num_threads(self.rl.num_threads)
        self.policy = Policy.from_pretrained(latest or self.source, ema=ema and latest is None)
        self.head = self.policy.serving  # what the head samples and its log-probs (models/heads/*/rl.py)
        self.head.check_rl()  # refused here, before any rollout
        model = self.policy.model.float().eval()  # eval: no dropout, so old and new log-probs agree
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=self.rl.lr, weight_decay=self.rl.weight_decay)
        self.ref = None
        if self.rl.kl_coef > 0:
            self.ref = Policy.from_pretrained(self.source, ema=ema).model.float().eval().requires_grad_(False)
        self.anchor = None
        if self.rl.imitation_coef > 0:  # demonstrations beside the rollouts (rl/anchor.py)
            from vlastack.rl.anchor import ImitationAnchor

            self.anchor = ImitationAnchor(cfg, self.rl.imitation_data, self.policy.normalizer,
                                          self.rl.imitation_batch, self.rl.seed)  # fmt: skip
        self.start = 0
        if latest is not None:
            state = load_state(latest / STATE, "rl")
            self.opt.load_state_dict(state["optimizer"])
            for g in self.opt.param_groups:  # the saved state holds the run's first lr: these settings win
                g["lr"], g["weight_decay"] = self.rl.lr, self.rl.weight_decay
            self.start = int(state["iteration"])
        self.tasks = suite_tasks(cfg.eval.suite, self.rl.tasks or tuple(cfg.eval.tasks))
        self.pool = make_pool(rollout_env_kw(cfg), self.rl.env_workers, self.rl.ray_address)
        self.out.mkdir(parents=True, exist_ok=True)
        sweep(self.out)  # a checkpoint a crash left half-written
        save_yaml(cfg, self.out / "config.yaml")
        self._keep_metrics(self.start)
        self.best = self._load_best()

    # ------------------------------------------------------------------ the loop

    def fit(self) -> dict[str, Any]:
        rl = self.rl
        start_val = self.out / START_VALIDATION
        if rl.eval_every and self.start == 0 and not start_val.exists():
            # The curve's first point: the start on the same validation seeds. A measurement of the
            # start, not RL's work, so it runs before the CPU clock starts.
            atomic_write_text(start_val, json.dumps(self.validate()) + "\n")
        cpu0 = self._cpu_s() - self._prior_cpu_s()
        bar = Progress(rl.iterations, "rl", unit="iter")
        bar.update(self.start)
        row: dict[str, Any] = {}
        try:
            for it in range(self.start, rl.iterations):
                row = self.iteration(it)
                if rl.eval_every and (it + 1) % rl.eval_every == 0:
                    row.update(self.validate())
                row["cpu_s"] = round(self._cpu_s() - cpu0, 1)  # everything so far, validation too
                # A validated iteration is always saved: best/ is copied from its checkpoint.
                if (it + 1) % rl.save_every == 0 or it + 1 == rl.iterations or "val_success" in row:
                    ckpt = self.save(it + 1)
                    if "val_success" in row and row["val_success"] > self.best["val_success"]:
                        self._keep_best(ckpt, it + 1, row["val_success"])
                with open(self.out / METRICS, "a") as f:
                    f.write(json.dumps(row) + "\n")
                bar.update(
                    1, success=f"{row['success']:.2f}", groups=f"{row['informative_groups']}/{rl.groups}"
                )
        finally:
            bar.close()
            self.pool.close()
        final = export_final(self.out, latest_checkpoint(self.out))
        report = rl_report(self.out)
        return {"iterations": rl.iterations, "final": str(final), "last": row, "report": str(report)}

    def iteration(self, it: int) -> dict[str, Any]:
        """Roll out, score, update. -> the metrics row of iteration ``it``."""
        rl = self.rl
        gen = torch.Generator().manual_seed(rl.seed * 1_000_003 + it)  # resumes draw the same noise
        t0 = time.perf_counter()
        jobs = iteration_jobs(rl, self.tasks, it)
        ro = collect(
            self.policy, self.pool, jobs, self.cfg.eval.steps_per_chunk, lambda b: self._draw(b, gen)
        )
        t1 = time.perf_counter()
        success = torch.tensor([float(e["success"]) for e in ro.episodes])
        rewards = episode_rewards(ro.episodes, rl.progress_reward)
        groups = torch.tensor([e["group"] for e in ro.episodes])
        adv, informative = group_advantages(rewards, groups)
        if not rl.drop_uniform_groups:
            informative = torch.ones_like(informative)
        used = [d for d in ro.decisions if informative[d.episode]]
        stats = self.update(used, adv, gen, it) if used else {}
        by_task: dict[str, list[float]] = {}
        for e in ro.episodes:
            by_task.setdefault(e["task"], []).append(float(e["success"]))
        return {
            "iteration": it, "success": float(success.mean()),
            "success_by_task": {t: float(np.mean(v)) for t, v in by_task.items()},
            "episodes": len(ro.episodes), "decisions": len(ro.decisions), "decisions_used": len(used),
            "informative_groups": int(informative.view(rl.groups, rl.group_size)[:, 0].sum()),
            "invalid_chunks": ro.invalid_chunks, "mean_steps": float(np.mean([e["steps"] for e in ro.episodes])),
            "rollout_s": round(t1 - t0, 1), "update_s": round(time.perf_counter() - t1, 1), **stats,
            **({"reward": float(rewards.mean())} if rl.progress_reward else {}),
        }  # fmt: skip

    def validate(self) -> dict[str, Any]:
        """The greedy policy (as ``vla eval`` runs it) on ``rl.eval_episodes`` validation seeds."""
        from vlastack.sim.evaluate import evaluate

        rl, ev = self.rl, self.cfg.eval
        # The evaluator seeds the policy's generator per episode, so every validation draws the
        # same sampling noise (its points differ by the weights only, a resumed run validates as an
        # uninterrupted one); the rollouts' stream is put back after.
        gen = self.policy.generator
        kept = gen.get_state()
        # eval.batch_episodes side by side, one batched query per step, as `vla eval` runs the
        # policy's config (a token head decodes them exactly as one by one: tests/sim)
        try:
            res = evaluate(self.policy, ev, num_workers=0, episodes=rl.eval_episodes, seed=rl.eval_seed,
                           seed_scheme="spread", tasks=tuple(dict.fromkeys(self.tasks)), videos=0,
                           batch_episodes=ev.batch_episodes,
                           temporal_ensemble=0.0, cameras=tuple(self.cfg.model.camera_names))  # fmt: skip
        finally:
            gen.set_state(kept)
        return {
            "val_success": res["mean_task_success"],
            "val_by_task": {t: v["success_rate"] for t, v in res["tasks"].items()},
        }

    def _draw(self, batch: dict, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample the policy -> (normalized actions [B, H, A], what was sampled, valid [B])."""
        return self.head.rl_sample(batch, self.rl, gen)

    def _logprobs(self, model: torch.nn.Module, part: list[Decision]) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities [B, L] (tokens, or denoising steps) of what ``part`` sampled, and their mask."""
        batch = self.policy.model_batch([d.obs for d in part])
        sampled = torch.stack([d.sample for d in part]).to(self.policy.device)
        return self.head.rl_logprobs(model, batch, sampled, self.rl)

    def update(
        self, decisions: list[Decision], adv: torch.Tensor, gen: torch.Generator, it: int = 0
    ) -> dict[str, float]:
        """``rl.epochs`` passes of the clipped surrogate over ``decisions`` in minibatches of
        ``rl.minibatch`` (+ the imitation anchor's loss, iteration ``it``'s batches). The behaviour
        policy's log-probs (and the reference's) are computed first, with the weights that sampled
        the tokens."""
        rl, model = self.rl, self.policy.model
        mb = rl.minibatch
        parts = [decisions[i : i + mb] for i in range(0, len(decisions), mb)]
        with torch.no_grad():
            old = [self._logprobs(model, p)[0] for p in parts]
            ref = [self._logprobs(self.ref, p)[0] for p in parts] if self.ref is not None else None
        flat_old = torch.cat(old)
        flat_ref = torch.cat(ref) if ref is not None else None
        totals: dict[str, float] = {}
        steps = skipped = 0
        for _ in range(rl.epochs):
            order = torch.randperm(len(decisions), generator=gen)
            for s in range(0, len(decisions), mb):
                idx = order[s : s + mb]
                part = [decisions[i] for i in idx.tolist()]
                logp, mask = self._logprobs(model, part)
                a = adv[torch.tensor([d.episode for d in part])]
                loss, st = clipped_loss(logp, flat_old[idx], a, mask, rl.clip_low, rl.clip_high,
                                        None if flat_ref is None else flat_ref[idx], rl.kl_coef)  # fmt: skip
                if self.anchor is not None:
                    im = self.anchor.loss(model, it, steps + skipped)
                    loss = loss + rl.imitation_coef * im
                    st = {**st, "imitation_loss": im.detach()}
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                gnorm = torch.nn.utils.clip_grad_norm_(self.params, rl.max_grad_norm)
                if not (torch.isfinite(loss) and torch.isfinite(gnorm)):  # as vla train: skip, count
                    self.opt.zero_grad(set_to_none=True)
                    skipped += 1
                    continue
                self.opt.step()
                for k, v in {"loss": loss.detach(), "grad_norm": gnorm, **st}.items():
                    totals[k] = totals.get(k, 0.0) + float(v)
                steps += 1
        stats = {k: round(v / max(steps, 1), 5) for k, v in totals.items()}
        return stats | {"gradient_steps": steps, "skipped_steps": skipped}

    # ------------------------------------------------------------------ checkpoints

    def save(self, iteration: int) -> Path:
        """A policy folder of the current weights (the source's files, its ``ema/`` left out:
        those weights are not these) + the optimizer, committed atomically."""
        tmp = begin(self.out, iteration)
        # The source's other files (statistics, tokenizers) are the same for every checkpoint.
        skip = shutil.ignore_patterns("ema", STATE, "checkpoints", "model.safetensors")
        shutil.copytree(self.source, tmp, dirs_exist_ok=True, ignore=skip)
        self.policy.model.save_pretrained(tmp)
        save_yaml(self.cfg, tmp / "config.yaml")
        save_state({"optimizer": self.opt.state_dict(), "iteration": iteration}, tmp / STATE, "rl")
        return commit(self.out, iteration, self.rl.keep_last)

    def _load_best(self) -> dict[str, Any]:
        """The best validated iteration so far (a resumed run's ``best.json``, if its checkpoint is
        one the run still holds: iterations past ``self.start`` are redone)."""
        path = self.out / "best.json"
        if path.exists():
            best = json.loads(path.read_text())
            if best["iteration"] <= self.start:
                return best
        return {"iteration": None, "val_success": -1.0}

    def _keep_best(self, ckpt: Path, iteration: int, val_success: float) -> None:
        export_final(self.out, ckpt, name="best")
        self.best = {"iteration": iteration, "val_success": val_success}
        atomic_write_text(self.out / "best.json", json.dumps(self.best) + "\n")

    def _keep_metrics(self, start: int) -> None:
        """A resumed run keeps the rows of the iterations its checkpoint holds (a crash after a
        row but before its checkpoint would otherwise count that iteration twice)."""
        path = self.out / METRICS
        if not path.exists():
            return
        rows = [ln for ln in path.read_text().splitlines() if ln.strip()]
        kept = [ln for ln in rows if json.loads(ln)["iteration"] < start]
        atomic_write_text(path, "".join(ln + "\n" for ln in kept))

    def _prior_cpu_s(self) -> float:
        """The CPU seconds of the iterations a resumed run keeps (its last metrics row)."""
        path = self.out / METRICS
        rows = path.read_text().splitlines() if path.exists() else []
        return float(json.loads(rows[-1])["cpu_s"]) if rows else 0.0

    @staticmethod
    def _cpu_s() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime


def rl_config(policy_dir: str | Path, overrides: list[str], yaml_path: str | None = None) -> Config:
    """The policy's own training config (its ``config.yaml``: the suite, tasks and chunking it
    is evaluated with) + a YAML + dotted overrides (``rl.*``, ``eval.*``)."""
    from vlastack.config import apply_overrides, load_yaml

    src = Path(policy_dir) / "config.yaml"
    if not src.is_file():
        raise ValueError(f"{policy_dir} has no config.yaml: vla rl starts from a vlastack policy folder")
    cfg = load_yaml(src)
    if yaml_path is not None:
        cfg = load_yaml(yaml_path, cfg)
    return apply_overrides(cfg, overrides)
