"""``vla doctor --run RUN``: what a ``vla rl`` run folder says about itself, and what to change.

It reads ``metrics.jsonl`` (one row per iteration), ``config.yaml``, ``best.json`` and
``validation_start.json`` (the start's validation score, the curve's iteration 0) and answers
the questions a stalled RL run raises, each from the run's own numbers:

- **Is it learning?** Rollout success over the first and last fifth of the iterations, and each
  validation point with its 95% interval: a validation gain smaller than the noise of that many
  episodes is not a gain (the winner's curse of picking the best of several noisy points).
- **Is there a signal?** The share of groups whose rollouts disagree (only those reach the update).
- **Do the updates move the policy?** Gradient steps per iteration, clip fraction and mean
  |ratio - 1|: near zero, the policy barely changes from one iteration to the next.
- **Where does the time go?** Rollouts, update and validation per iteration.

Findings come with the settings to change (``rl.*`` overrides). ``doctor.json`` in the run folder
holds the same. Thresholds are rules of thumb, stated with each finding.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# A run whose mean clip fraction is below this and whose mean |ratio - 1| is below TINY_RATIO
# hardly changes its policy per iteration (PPO runs usually clip 5-20% of their samples).
TINY_CLIP, TINY_RATIO = 0.01, 0.02
FEW_INFORMATIVE = 0.5  # below half the groups disagreeing, most rollouts teach nothing


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def diagnose(run_dir: str | Path) -> dict[str, Any]:
    """-> {"summary": {...}, "validation": [...], "findings": [{"id", "title", "why", "overrides"}]}."""
    from vlastack.config import load_yaml
    from vlastack.stats import wilson
    from vlastack.train.logs import read_metrics

    run = Path(run_dir)
    path = run / "metrics.jsonl"
    if not path.is_file() or not (run / "config.yaml").is_file():
        raise ValueError(
            f"{run} is not a vla rl run folder (needs metrics.jsonl and config.yaml); "
            "vla doctor --run reads the folder vla rl --out wrote"
        )
    rows = [r for r in read_metrics(path) if "iteration" in r]
    if not rows:
        raise ValueError(f"{path} has no iteration rows yet: run vla rl for at least one iteration")
    rl = load_yaml(run / "config.yaml").rl
    n = len(rows)
    k = max(1, n // 5)
    first, last = rows[:k], rows[-k:]
    groups = rl.groups
    upd = [r for r in rows if r.get("gradient_steps")]
    cpu = rows[-1].get("cpu_s", 0.0)
    roll = sum(r.get("rollout_s", 0.0) for r in rows)
    update = sum(r.get("update_s", 0.0) for r in rows)
    summary = {
        "iterations": n,
        "cpu_hours": round(cpu / 3600, 3),
        "rollout_success_first": round(_mean([r["success"] for r in first]), 3),
        "rollout_success_last": round(_mean([r["success"] for r in last]), 3),
        "iterations_per_fifth": k,
        "informative_share": round(_mean([r["informative_groups"] / groups for r in rows]), 3),
        "gradient_steps_per_iteration": round(_mean([r["gradient_steps"] for r in upd]), 2) if upd else 0,
        "clip_fraction": round(_mean([r.get("clip_fraction", 0.0) for r in upd]), 5) if upd else 0.0,
        "ratio_dev": round(_mean([r.get("ratio_dev", 0.0) for r in upd]), 5) if upd else 0.0,
        "rollout_s": round(roll, 1),
        "update_s": round(update, 1),
        "env_workers": rl.env_workers,
    }
    val = []
    # the start on the same seeds (vla rl writes it before the first iteration): iteration 0
    start = run / "validation_start.json"
    points = [(0, json.loads(start.read_text())["val_success"])] if start.is_file() else []
    points += [(r["iteration"] + 1, r["val_success"]) for r in rows if "val_success" in r]
    for it, success in points:
        lo, hi = wilson(round(success * rl.eval_episodes), rl.eval_episodes)
        val.append({"iteration": it, "success": success, "ci95": [round(lo, 3), round(hi, 3)]})
    best = json.loads((run / "best.json").read_text()) if (run / "best.json").is_file() else None
    findings = []

    def add(id_: str, title: str, why: str, overrides: tuple[str, ...] = ()) -> None:
        findings.append({"id": id_, "title": title, "why": why, "overrides": list(overrides)})

    if upd and summary["clip_fraction"] < TINY_CLIP and summary["ratio_dev"] < TINY_RATIO:
        add(
            "tiny_updates",
            "The updates barely move the policy",
            f"mean clip fraction {summary['clip_fraction']:.2%} (< {TINY_CLIP:.0%}) and mean |ratio - 1| "
            f"{summary['ratio_dev']:.3f} (< {TINY_RATIO}) over {summary['gradient_steps_per_iteration']} "
            "gradient steps per iteration: the new policy is almost the old one. Take more or larger steps.",
            (
                f"rl.epochs={2 * rl.epochs}",
                f"rl.lr={rl.lr * 2:g}",
                f"rl.minibatch={max(rl.minibatch // 2, 1)}",
            ),
        )
    if summary["informative_share"] < FEW_INFORMATIVE:
        add(
            "few_informative_groups",
            "Most groups teach nothing",
            f"on average {summary['informative_share']:.0%} of the groups had rollouts that disagree; an "
            "all-success or all-failure group has zero advantage. More rollouts per seed, more sampling "
            "noise, or tasks where the policy is between about 10% and 90% give more signal.",
            (f"rl.group_size={2 * rl.group_size}",),
        )
    if len(val) >= 2:
        v0, vb = val[0], max(val, key=lambda v: v["success"])
        p = (v0["success"] + vb["success"]) / 2
        noise = 1.96 * math.sqrt(2 * p * (1 - p) / rl.eval_episodes)  # two independent proportions
        summary["validation_noise"] = round(noise, 3)
        first = "the start" if v0["iteration"] == 0 else "the first"
        first_s = "the start's" if v0["iteration"] == 0 else "the first point's"
        if vb is v0:
            add(
                "validation_not_rising",
                f"No later validation point beat {first}",
                f"{first} {v0['success']:.1%} (iteration {v0['iteration']}), last {val[-1]['success']:.1%}: "
                "the later iterations did not help the greedy policy (the 95% noise "
                f"of {rl.eval_episodes} episodes each is {noise:.1%}).",
            )
        elif vb["success"] - v0["success"] < noise:
            add(
                "validation_within_noise",
                "The validation curve does not separate from its noise",
                f"best {vb['success']:.1%} (iteration {vb['iteration']}) against {first_s} "
                f"{v0['success']:.1%}: a difference under {noise:.1%} is within the 95% noise of "
                f"{rl.eval_episodes} episodes each, and picking the best of {len(val)} points favours a "
                "lucky one. Score more validation episodes before trusting a pick.",
                (f"rl.eval_episodes={4 * rl.eval_episodes}",),
            )
    if n >= 10 and summary["rollout_success_last"] <= summary["rollout_success_first"]:
        add(
            "flat_rollout_success",
            "Rollout success did not rise",
            f"mean over the first {k} iterations {summary['rollout_success_first']:.1%}, over the last {k} "
            f"{summary['rollout_success_last']:.1%}: the sampled policy is not improving on the tasks it "
            "practises.",
        )
    if roll > 2 * update and rl.env_workers == 0:
        add(
            "rollouts_dominate",
            "Rollouts take most of the time",
            f"{roll:.0f} s of rollouts against {update:.0f} s of updates with the envs in the learner "
            "process: step them in parallel worker processes (or Ray actors, rl.ray_address).",
            ("rl.env_workers=2",),
        )
    if sum(r.get("invalid_chunks", 0) for r in rows):
        add(
            "invalid_chunks",
            "Some sampled chunks did not decode",
            f"{sum(r.get('invalid_chunks', 0) for r in rows)} invalid chunks in the rollouts: a lower "
            "temperature samples fewer malformed token sequences.",
            (f"rl.temperature={rl.temperature / 2:g}",),
        )
    return {"run": str(run), "summary": summary, "validation": val, "best": best, "findings": findings}


def format_report(d: dict[str, Any]) -> str:
    s = d["summary"]
    lines = [
        f"vla rl run {d['run']}: {s['iterations']} iterations, {s['cpu_hours']} CPU-h",
        f"  rollout success: {s['rollout_success_first']:.1%} (first {s['iterations_per_fifth']}) -> "
        f"{s['rollout_success_last']:.1%} (last {s['iterations_per_fifth']})",
        f"  informative groups: {s['informative_share']:.0%}; gradient steps per iteration "
        f"{s['gradient_steps_per_iteration']}, clip fraction {s['clip_fraction']:.2%}, |ratio - 1| {s['ratio_dev']:.4f}",
        f"  time: rollouts {s['rollout_s']:.0f} s, updates {s['update_s']:.0f} s (env workers: {s['env_workers']})",
    ]
    for v in d["validation"]:
        lo, hi = v["ci95"]
        at = "of the start" if v["iteration"] == 0 else f"at iteration {v['iteration']}"
        lines.append(f"  validation {at}: {v['success']:.1%} [{lo:.1%}, {hi:.1%}]")
    if d["best"]:
        lines.append(
            f"  best/: iteration {d['best']['iteration']} ({d['best']['val_success']:.1%} on validation)"
        )
    for f in d["findings"]:
        lines.append(f"- {f['title']}: {f['why']}")
        if f["overrides"]:
            lines.append(f"  try: {' '.join(f['overrides'])}")
    if not d["findings"]:
        lines.append("- nothing stands out")
    return "\n".join(lines)
