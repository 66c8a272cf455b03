"""The fair Meta-World protocol's bookkeeping (issue #64): seed splits, validation trials, and the
fields every row of bench/results/metaworld.json carries so a reader can tell how it was made.

Seeds. Meta-World's ``reset(seed=s)`` draws the object and goal positions, so a seed is a layout:

- training: ``vla data generate --episodes-per-task N`` uses generator seeds 0..N-1 per task;
- validation: ``VALIDATION_SEED + j`` (2000+j), for every tuning decision of every policy;
- test: ``TEST_SEED + j`` (1000+j, lerobot-eval's), scored once per final recipe.

Fields per row (``protocol_fields``): ``privileged_labels`` (trained on the simulator's object and
goal positions: ``lerobot/metaworld_mt50`` holds them in its 39-d ``observation.environment_state``,
but LeRobot's ``MetaworldEnv`` does not return them and the baselines are configured not to read
them, so a row trained on them is kept apart), ``evaluator``, ``trials_per_task``,
``validation_seeds`` (the seeds tuning used; ``null`` where tuning ran on the test seeds),
``tuning_trials`` (recipes tried before this one), ``demos_per_task``, ``samples_seen``,
``budget_multiple`` (the row's CPU-hours over the suite's reference row's) and ``lerobot_env_check``
(``{episodes, agree}``: the policy re-scored in LeRobot's own ``MetaworldEnv``, or ``null``).
"""

from __future__ import annotations

import json
from pathlib import Path

TEST_SEED = 1000  # lerobot-eval's seeds: episode j of every task is seed 1000 + j
VALIDATION_SEED = 2000  # disjoint from training (0..49) and test (1000..1049)
REFERENCE_ROW = "vlastack"  # whose measured CPU-hours set a suite's budget (budget_multiple = 1)
RESULTS = Path(__file__).parent / "results"
FIELDS = ("privileged_labels", "evaluator", "trials_per_task", "validation_seeds", "tuning_trials",
          "demos_per_task", "samples_seen", "budget_multiple", "lerobot_env_check")  # fmt: skip

# Rows recorded before the fair protocol: how each was tuned, from the records in docs/research/.
# The MT10 recipe went through four iterations scored on the test seeds (resize fix, grounding,
# more steps, attention supervision); MT50 reused it unchanged. The LeRobot rows were not tuned.
LEGACY_TUNING = {
    ("mt10", "vlastack"): 4,
    ("mt10", "vlastack_no_attention_supervision"): 3,
    ("mt10", "vlastack_39k_steps"): 3,
    ("mt50", "vlastack"): 4,
}


LEROBOT_DEFAULT_BATCH = 8  # lerobot-train's TrainPipelineConfig.batch_size, which the rows kept


def _train_steps_batch(row: dict) -> tuple[int | None, int]:
    tc = row.get("train_config") or {}
    steps = tc.get("steps_reached", tc.get("steps"))
    batch = tc.get("batch_size") or (
        LEROBOT_DEFAULT_BATCH if str(tc.get("trainer", "")).startswith("lerobot") else 0
    )
    return steps, batch * (tc.get("grad_accum") or 1)


def samples_seen(row: dict) -> int | None:
    """Training samples drawn: steps x batch x accumulation (LeRobot rows record it themselves)."""
    tc = row.get("train_config") or {}
    if tc.get("samples_seen"):
        return int(tc["samples_seen"])
    steps, batch = _train_steps_batch(row)
    return int(steps * batch) if steps and batch else None


def label_source(data: str | Path | None) -> str | None:
    """Where a dataset's grounding labels come from: "hindsight" (``vla data hindsight``: the
    demonstrations' own state and action columns), "simulator" (the recorded 39-d state), or None."""
    if not data:
        return None
    info = Path(data) / "meta" / "info.json"
    if not info.is_file():
        return None
    ft = json.loads(info.read_text())["features"].get("observation.environment_state")
    if ft is None:
        return None
    return "hindsight" if str((ft.get("names") or [""])[0]).startswith("hindsight_") else "simulator"


def data_arg(argv: list[str]) -> str | None:
    """The ``--data`` of a recorded ``vla train`` command line."""
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--data"), None)


def privileged(row: dict) -> bool:
    """Trained with the grounding head's simulator labels (object and goal positions). Rows recorded
    before the config was stored with them ran a Meta-World recipe, whose grounding was on. Labels
    derived from the demonstrations themselves (``grounding_labels: hindsight``) are not privileged:
    every policy's data holds the state and action columns they come from."""
    tc = row.get("train_config") or {}
    if tc.get("grounding_labels") == "hindsight":
        return False
    overrides = tc.get("overrides") or []
    if "model.grounding" not in tc:
        return tc.get("recipe", "").startswith("metaworld_") and "model.grounding.points=0" not in overrides
    return int((tc["model.grounding"] or {}).get("points", 0) or 0) > 0


def evaluator(row: dict) -> str:
    if row.get("eval", {}).get("evaluator"):
        return row["eval"]["evaluator"]
    if row.get("evaluator"):
        return row["evaluator"]
    return f"vla eval (vlastack's Meta-World env, render_quality={row.get('render_quality')})"


def demos_per_task(row: dict) -> int | list | None:
    if "train_episodes_per_task" in row:
        return row["train_episodes_per_task"]
    seeds = row.get("train_seeds") or {}
    counts = {v[2] for v in seeds.values() if isinstance(v, list | tuple) and len(v) == 3}
    return counts.pop() if len(counts) == 1 else (sorted(counts) or None)


# Rows whose policy was re-scored in LeRobot's own MetaworldEnv
# (scripts/metaworld_policy_in_lerobot_env.py) -> that script's output under bench/results/.
LEROBOT_ENV_CHECKS = {
    ("mt10", "vlastack"): "metaworld_policy_lerobot_env.json",
    ("mt10", "vlastack_hindsight"): "metaworld_policy_lerobot_env_hindsight.json",
}


def lerobot_env_check(suite: str, name: str) -> dict | None:
    """The row's policy re-scored in LeRobot's env (``LEROBOT_ENV_CHECKS``), or None."""
    path = RESULTS / LEROBOT_ENV_CHECKS.get((suite, name), "-")
    if not path.is_file():
        return None
    s = json.loads(path.read_text()).get("summary", {})
    return agreement(s["compared"], s["same_outcome"], s["success_vla_eval"], s["success_lerobot_env"])


def agreement(n: int, same: int, rate_ours: float, rate_lerobot: float) -> dict:
    """The same policy and seeds in both environments -> {episodes, same_outcome, agree}: ``agree``
    when the paired difference is within sampling noise (McNemar's test at 95%: |b - c| <= 1.96
    sqrt(b + c), b and c the two kinds of discordant episode)."""
    discordant = n - same
    diff = round(rate_ours * n) - round(rate_lerobot * n)  # = b - c
    return {
        "episodes": n,
        "same_outcome": same,
        "success_vla_eval": rate_ours,
        "success_lerobot_env": rate_lerobot,
        "agree": abs(diff) <= 1.96 * discordant**0.5,
    }


def protocol_fields(suite: str, name: str, row: dict, suite_rows: dict) -> dict:
    """The issue #64 fields for one row (keeps values a row already carries: a fair run records
    its own validation seeds, tuning trials and LeRobot-env check)."""
    ref = suite_rows.get(REFERENCE_ROW, {}).get("cpu_hours")
    out = {
        "privileged_labels": privileged(row),
        "evaluator": evaluator(row),
        "trials_per_task": row.get("episodes_per_task"),
        "validation_seeds": row.get("validation_seeds"),
        "tuning_trials": row.get("tuning_trials", LEGACY_TUNING.get((suite, name), 0)),
        "demos_per_task": demos_per_task(row),
        "samples_seen": samples_seen(row),
        "budget_multiple": round(row["cpu_hours"] / ref, 3) if ref and row.get("cpu_hours") else None,
        "lerobot_env_check": row.get("lerobot_env_check") or lerobot_env_check(suite, name),
    }
    if out["validation_seeds"] is None and out["tuning_trials"]:
        out["tuning_note"] = "tuned on the test seeds (before the fair protocol): not a held-out score"
    return out


def backfill(res: dict) -> dict:
    """Every row of every suite gets ``protocol_fields`` (idempotent)."""
    for suite, rows in res.items():
        if suite not in ("mt10", "mt50"):
            continue
        for name, row in rows.items():
            if isinstance(row, dict) and "per_task" in row:
                row.update(protocol_fields(suite, name, row, rows))
    return res


def record_validation(res: dict, suite: str, name: str, ev: dict, trial: dict) -> dict:
    """A tuning trial scored on validation seeds -> ``res[suite]["tuning"][name]`` (a list: every
    trial is kept, the chosen one and the rejected ones), never a table row."""
    seeds = sorted({e["seed"] for e in ev["episodes"]})
    if any(TEST_SEED <= s < VALIDATION_SEED for s in seeds):
        raise ValueError(f"validation trials must not use test seeds ({TEST_SEED}+j), got {seeds[:5]}...")
    per_task = {t: s["success_rate"] for t, s in ev["tasks"].items()}
    entry = {
        **trial,
        "seeds": [seeds[0], seeds[-1]] if seeds else [],
        "episodes_per_task": sorted({s["n"] for s in ev["tasks"].values()}),
        "per_task": per_task,
        "mean": sum(per_task.values()) / max(len(per_task), 1),
        "ci95": ev.get("overall", {}).get("ci95"),
    }
    trials = res.setdefault(suite, {}).setdefault("tuning", {}).setdefault(name, [])
    trials[:] = [t for t in trials if t.get("trial") != entry.get("trial")] + [entry]
    return entry


def record_stopped_trial(res: dict, suite: str, name: str, trial: dict, why: str) -> dict:
    """A tuning trial stopped before its budget and never scored (``why``: the training evidence)
    -> kept in ``res[suite]["tuning"][name]`` beside the scored ones, ``mean`` null, so the list
    shows every recipe tried, not only those that were validated."""
    entry = {**trial, "stopped": why, "seeds": [], "per_task": {}, "mean": None, "ci95": None}
    trials = res.setdefault(suite, {}).setdefault("tuning", {}).setdefault(name, [])
    trials[:] = [t for t in trials if t.get("trial") != entry.get("trial")] + [entry]
    return entry


def chosen_recipe(res: dict, suite: str, name: str, run: str | Path) -> dict:
    """The fair protocol's fields of a table row whose recipe was chosen on the validation seeds:
    ``run``'s trial in ``res[suite]["tuning"][name]`` must be the best scored one there (the rule
    every row's recipe is picked by); -> ``validation_seeds``, ``tuning_trials`` (every trial in
    the list, stopped ones too), ``chosen_trial`` and its ``validation_mean``."""
    trials = res.get(suite, {}).get("tuning", {}).get(name) or []
    scored = [t for t in trials if t.get("mean") is not None]
    mine = [t for t in scored if Path(t["run"]).resolve() == Path(run).resolve()]
    if not mine:
        raise ValueError(f"{run} is not a scored trial of {suite}.tuning.{name}: score it on the validation "
                         "seeds first (bench/lerobot_served.py --seed 2000 --trial ... --as NAME)")  # fmt: skip
    best = max(scored, key=lambda t: t["mean"])
    if mine[-1]["mean"] < best["mean"]:
        raise ValueError(f"{run} scored {mine[-1]['mean']:.1%} on the validation seeds, below {best['run']} "
                         f"({best['mean']:.1%}): the table takes the best validation trial")  # fmt: skip
    return {
        "validation_seeds": mine[-1]["seeds"],
        "tuning_trials": len(trials),
        "chosen_trial": mine[-1]["trial"],
        "validation_mean": mine[-1]["mean"],
    }
