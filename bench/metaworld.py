"""Meta-World MT10 / MT50 benchmark table -> bench/results/metaworld.json (docs/metaworld.md).

    # the scripted expert by lerobot-eval's protocol (a data check)
    .venv/bin/python bench/metaworld.py expert --tasks MT50 --episodes-per-task 50
    # train a recipe, counting the CPU time of the run and all its processes (resumable: run the
    # same command again after an interruption; each segment's CPU time is added to the run's ledger)
    .venv/bin/python bench/metaworld.py train --suite mt10 --run runs/mt10 --data data/mt10 [-- key=value ...]
    # evaluate the run's final policy and record its row (policy name: vlastack, or --as NAME)
    .venv/bin/python bench/metaworld.py eval --suite mt10 --run runs/mt10 [--episodes-per-task 50] [--as NAME]
    # the grounding head's object / goal error in cm, training vs held-out layouts
    .venv/bin/python bench/metaworld.py grounding --suite mt10 --run runs/mt10 [--as NAME]
    # all of it, each step only if not done yet: run the same command again to continue; --lerobot
    # then trains and scores LeRobot's ACT and Diffusion Policy on the same data within the CPU-hours
    # vlastack's row measured (bench/lerobot_metaworld.py, LeRobot's venv), resumable the same way
    .venv/bin/python bench/metaworld.py pipeline --suite mt50 --data data/mt50 --run runs/mt50 --episodes-per-task 10 \
        --lerobot act,diffusion
    # where that pipeline stands: each stage done, under way (how far, CPU-hours, time left) or not started
    .venv/bin/python bench/metaworld.py status --suite mt50 --data data/mt50 --run runs/mt50 --episodes-per-task 10
    # one policy's evaluations on disjoint seeds (each its own resumable `eval --as PART`) -> one eval.json
    .venv/bin/python bench/metaworld.py merge runs/mt50/eval_a/eval.json runs/mt50/eval_b/eval.json --out runs/mt50/eval/eval.json
    # record a row evaluated elsewhere (e.g. a LeRobot policy scored on the same seeds)
    .venv/bin/python bench/metaworld.py record --suite mt10 --policy lerobot_act --eval-json X --cpu-hours H
    # the fair protocol (bench/metaworld_protocol.py): a tuning trial scored on the validation seeds
    # (2000+j), kept under mt10.tuning.NAME, never a table row; the protocol fields on every row
    .venv/bin/python bench/metaworld.py validate --suite mt10 --run runs/mt10 --as NAME --trial "no labels, recipe"
    .venv/bin/python bench/metaworld.py backfill

Shape of metaworld.json: ``expert.per_task``; under ``mt10`` / ``mt50`` one entry per policy with
``per_task``, ``mean``, ``cpu_hours``, ``episodes_per_task``, ``eval_seeds``, ``train_seeds``,
``train_config`` and, for MT50, ``groups`` and ``group_average``; success as fractions in [0, 1].
Every entry carries the CPU model and flags, torch version and date, and the fair protocol's fields
(``privileged_labels``, ``evaluator``, ``trials_per_task``, ``validation_seeds``, ``tuning_trials``,
``demos_per_task``, ``samples_seen``, ``budget_multiple``, ``lerobot_env_check``: see
bench/metaworld_protocol.py); ``mt10.tuning`` holds the validation-seed trials.

CPU hours are measured, not inferred from wall time: ``resource.getrusage(RUSAGE_CHILDREN)``
(user + system) of the ``vla train`` process tree, which includes its data-loader workers and
compile workers once they have exited.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

# `python bench/metaworld.py` puts bench/ first on sys.path, where this file would shadow the
# `metaworld` package (in spawned evaluation workers too): swap it for the repository root.
HERE = Path(__file__).resolve().parent
sys.path[:] = [str(HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != HERE)]

from bench.metaworld_protocol import (  # noqa: E402
    VALIDATION_SEED,
    backfill,
    chosen_recipe,
    data_arg,
    label_source,
    protocol_fields,
    record_validation,
)

RESULTS = HERE / "results" / "metaworld.json"
RECIPES = {"mt10": "metaworld_mt10", "mt50": "metaworld_mt50"}
LEDGER = "cpu_ledger.json"  # in the run folder: one row per training segment
PROTOCOL = "protocol.json"  # in the run folder: validation_seeds and tuning_trials of a fair run


def machine() -> dict:
    """CPU model, flags, cores and date (bench/lerobot_common.py's, which is stdlib-only) + torch."""
    import torch

    from bench.lerobot_common import machine as cpu

    return {**cpu(), "torch": torch.__version__}


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def save(res: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {RESULTS}")


def final_policy(run: Path) -> Path:
    """The run's policy to score: its EMA weights when the recipe keeps them (train.ema_decay), as
    `vla demo` and in-training eval do."""
    return run / "final" / "ema" if (run / "final" / "ema").is_dir() else run / "final"


def read_ledger(run: Path) -> list[dict]:
    """The run's CPU ledger (one row per training segment), [] before its first segment."""
    return json.loads((run / LEDGER).read_text()) if (run / LEDGER).is_file() else []


def rates(ev: dict) -> dict[str, float]:
    return {t: s["success_rate"] for t, s in ev["tasks"].items()}


def eval_seeds(ev: dict) -> list[int]:
    return sorted({e["seed"] for e in ev["episodes"]})


def entry_from_eval(ev: dict, suite: str, cpu_hours: float | None, train_seeds, train_config) -> dict:
    per_task = rates(ev)
    n = {s["n"] for s in ev["tasks"].values()}
    out = {
        "per_task": per_task,
        "mean": sum(per_task.values()) / len(per_task),
        "cpu_hours": cpu_hours,
        "episodes_per_task": n.pop() if len(n) == 1 else sorted(n),
        "eval_seeds": eval_seeds(ev),
        "ci95": ev.get("overall", {}).get("ci95"),  # 95% Wilson interval of the pooled success
        "seed_scheme": ev["config"].get("seed_scheme"),
        "render_quality": ev["config"].get("render_quality"),
        "train_seeds": train_seeds,
        "train_config": train_config,
        "machine": machine(),
    }
    if train_seeds:  # derived, so a re-recorded row keeps it: demos per task behind the policy
        counts = {c for _, _, c in train_seeds.values()}
        out["train_episodes_per_task"] = counts.pop() if len(counts) == 1 else sorted(counts)
    if suite == "mt50":
        out["groups"] = {g: s["success_rate"] for g, s in ev.get("groups", {}).items()}
        out["group_average"] = ev.get("group_average")
        if not out["groups"]:  # lerobot-eval's converted eval.json has none: the tasks' groups
            out["groups"], out["group_average"] = groups_of(out["per_task"])
    return out


def groups_of(per_task: dict[str, float]) -> tuple[dict[str, float], float]:
    """MT50 difficulty groups from per-task success (equal episodes per task, so the mean over a
    group's tasks is its pooled rate) -> (groups, their average)."""
    from vlastack.sim.metaworld_tasks import group_of

    by: dict[str, list[float]] = {}
    for t, r in per_task.items():
        by.setdefault(group_of(t), []).append(r)
    groups = {g: sum(v) / len(v) for g, v in by.items()}
    return groups, sum(groups.values()) / len(groups)


def cmd_expert(args: argparse.Namespace) -> None:
    from vlastack.sim.evaluate import evaluate

    # The expert reads Meta-World's state, not pixels: no camera is rendered (cameras=()).
    ev = evaluate("expert", suite="metaworld", tasks=(args.tasks,), episodes=args.episodes_per_task,
                  seed=args.seed, seed_scheme="per_task", num_workers=args.workers, videos=0,
                  cameras=())  # fmt: skip
    res = load()
    per_task = rates(ev)
    res["expert"] = {
        "per_task": per_task,
        "mean": sum(per_task.values()) / len(per_task),
        "below_90": {t: r for t, r in per_task.items() if r < 0.9},
        "groups": {g: s["success_rate"] for g, s in ev.get("groups", {}).items()},
        "episodes_per_task": args.episodes_per_task,
        "eval_seeds": eval_seeds(ev),
        "ci95": ev.get("overall", {}).get("ci95"),  # 95% Wilson interval of the pooled success
        "rendered": False,
        "wall_s": ev["wall_s"],
        "machine": machine(),
    }
    print(
        f"expert: mean {res['expert']['mean']:.1%} over {len(per_task)} tasks; below 90%: {res['expert']['below_90']}"
    )
    save(res)


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, its live descendants and every child they have
    reaped (``/proc/<pid>/stat`` utime, stime, cutime, cstime), read while the tree runs."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        stats[int(d.name)] = fields
        children.setdefault(int(fields[1]), []).append(int(d.name))  # fields[1]: the parent pid
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            f = stats[p]  # after the ")": state ppid ... utime(11) stime(12) cutime(13) cstime(14)
            total += sum(int(x) for x in f[11:15])
        todo += children.get(p, [])
    return total / tick


def cmd_train(args: argparse.Namespace) -> None:
    sys.exit(train_recipe(RECIPES[args.suite], Path(args.run), args.data, args.overrides))


def train_recipe(recipe: str, run: Path, data: str, overrides: list[str]) -> int:
    """``vla train --config recipe`` into ``run`` (``--resume`` where it has a checkpoint), its CPU
    time added to the run's ledger as it goes -> the exit status. Also bench/libero_policy.py's."""
    from vlastack.train.checkpoint import latest_checkpoint

    ledger = read_ledger(run)
    resume = latest_checkpoint(run) is not None
    cmd = [sys.executable, "-m", "vlastack.cli", "train", "--config", recipe, "--data", data,
           "--out", str(run), *(["--resume"] if resume else []), *overrides]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    row = {"started": datetime.datetime.fromtimestamp(t0).isoformat(timespec="seconds"), "rc": None,
           "wall_s": 0.0, "cpu_s": 0.0, "argv": cmd[3:], "machine": machine()}  # fmt: skip
    ledger.append(row)
    run.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        (run / LEDGER).write_text(json.dumps(ledger, indent=1) + "\n")

    # The row is rewritten every 30 s while the run trains, so a segment killed with this process
    # (a machine taken back, SIGKILL) still counts the CPU time it spent (to within 30 s; rc stays null).
    # A delta: this process's earlier children (the pipeline's `vla data generate`) are in the totals too.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd)
    while True:
        try:
            rc = proc.wait(timeout=30)
            break
        except subprocess.TimeoutExpired:
            row.update(
                wall_s=round(time.time() - t0, 1), cpu_s=round(max(row["cpu_s"], tree_cpu_s(proc.pid)), 1)
            )
            write()
    # The exact figure once it has exited: its own and its reaped children's (getrusage).
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    row.update(rc=rc, wall_s=round(time.time() - t0, 1), cpu_s=round(max(row["cpu_s"], used), 1))
    write()
    total = sum(r["cpu_s"] for r in ledger)
    print(
        f"segment: {row['cpu_s'] / 3600:.2f} CPU-h in {row['wall_s'] / 3600:.2f} h; run total {total / 3600:.2f} CPU-h"
    )
    return rc


def cmd_eval(args: argparse.Namespace) -> None:
    from vlastack.cli import main

    run = Path(args.run)
    out = Path(args.out or run / "eval")
    policy = final_policy(run)
    # --resume: an evaluation cut off with its session continues from its journal (hours on MT50).
    argv = ["eval", "--policy", str(policy), "--config", RECIPES[args.suite], "--out", str(out), "--resume",
            "--workers", str(args.workers), *(["--episodes-per-task", str(args.episodes_per_task)]
                                              if args.episodes_per_task else []), *args.overrides]  # fmt: skip
    if main(argv) != 0:
        sys.exit(1)
    record(args.suite, args.row, out / "eval.json", run)


def training_done(run: Path) -> bool:
    """The run reached its recipe's ``train.steps`` and exported ``final``."""
    summary = run / "train_summary.json"
    if not (run / "final" / "config.yaml").is_file() or not summary.is_file():
        return False
    from vlastack.config import load_yaml

    return json.loads(summary.read_text())["steps"] >= load_yaml(run / "final" / "config.yaml").train.steps


def cmd_pipeline(args: argparse.Namespace) -> None:
    """Whatever is left of generate -> train -> eval, each step resumable: the same command
    continues a run spread over several sessions or days."""
    data, run = Path(args.data), Path(args.run)
    if not (data / "meta" / "vlastack_sim.json").is_file():  # written last: a finished dataset
        gen = [sys.executable, "-m", "vlastack.cli", "data", "generate", "--suite", "metaworld",
               "--tasks", args.suite.upper(), "--episodes-per-task", str(args.data_episodes_per_task),
               "--render-quality", "fast", "--workers", str(args.workers), "--out", str(data)]  # fmt: skip
        print("$", " ".join(gen), flush=True)
        if subprocess.call(gen) != 0:
            sys.exit(1)
    if not training_done(run):
        targs = argparse.Namespace(suite=args.suite, run=str(run), data=str(data), overrides=args.overrides)
        try:
            cmd_train(targs)
        except SystemExit as e:
            if e.code:
                raise
    out = run / "eval"
    if not (out / "eval.json").is_file():
        cmd_eval(argparse.Namespace(suite=args.suite, run=str(run), out=str(out), workers=args.workers,
                                    episodes_per_task=args.episodes_per_task, row=args.row,
                                    overrides=args.overrides))  # fmt: skip
    for policy in [p for p in (args.lerobot or "").split(",") if p]:
        lerobot_stage(args.suite, policy, data, run, args.row, args.lerobot_episodes_per_task)


def cmd_status(args: argparse.Namespace) -> None:
    """Where a ``pipeline`` stands, one line per stage: done (with its figure), under way (how far,
    the CPU-hours so far and the time left at the measured pace) or not started. Reads files only."""
    from bench import lerobot_metaworld as lm
    from vlastack.config import load_yaml
    from vlastack.sim.metaworld_tasks import expand_tasks

    def say(stage: str, text: str) -> None:
        print(f"{stage:<17} {text}")

    data, run = Path(args.data), Path(args.run)
    tasks = expand_tasks([args.suite.upper()])
    n_tasks = len(tasks)
    if (data / "meta" / "vlastack_sim.json").is_file():
        info = json.loads((data / "meta" / "info.json").read_text())
        say("data", f"done: {info['total_episodes']} episodes, {info['total_frames']} frames in {data}")
    else:
        from vlastack.sim.generate import PARTS_SUFFIX, episodes_written

        n = episodes_written(data, tasks)
        if n:
            stamp = data.with_name(data.name + PARTS_SUFFIX) / "settings.json"
            per_task = json.loads(stamp.read_text())["episodes_per_task"]
            say("data", f"{n} of {per_task * n_tasks} episodes written, then the merge")
        else:
            say("data", "not started")
    ledger = read_ledger(run)
    cpu_h = sum(r["cpu_s"] for r in ledger) / 3600
    if training_done(run):
        say(
            "train",
            f"done: {json.loads((run / 'train_summary.json').read_text())['steps']} steps, {cpu_h:.2f} CPU-h",
        )
    elif (run / "config.yaml").is_file():
        cfg = load_yaml(run / "config.yaml")
        latest = run / "checkpoints" / "latest"
        step = int(latest.read_text().strip().rsplit("_", 1)[-1]) if latest.is_file() else 0
        metrics = (
            (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").is_file() else []
        )
        # the median of the last 5 logged windows: one window slowed by another job misled the estimate
        pace = [r["train/samples_per_s"] for r in map(json.loads, metrics) if "train/samples_per_s" in r][-5:]
        pace = [statistics.median(pace)] if pace else []
        left = f", ~{(cfg.train.steps - step) * cfg.train.batch_size / pace[0] / 3600:.1f} h left at " \
            f"{pace[0]:.0f} samples/s" if pace else ""  # fmt: skip
        say("train", f"step {step} of {cfg.train.steps} saved, {cpu_h:.2f} CPU-h so far{left}")
    else:
        say("train", "not started")
    out = run / "eval"
    if (out / "eval.json").is_file():
        r = rates(json.loads((out / "eval.json").read_text()))
        say("eval", f"done: mean {sum(r.values()) / len(r):.1%} over {len(r)} tasks")
    elif (out / "eval.partial.jsonl").is_file():  # a half-written last line (a kill) is left out
        lines = [x for x in (out / "eval.partial.jsonl").read_text().splitlines()[1:] if x.endswith("}")]
        ok = sum(bool(json.loads(x)["result"]["success"]) for x in lines)
        total = f" of {n_tasks * args.episodes_per_task}" if args.episodes_per_task else ""
        say("eval", f"{len(lines)}{total} episodes journaled, {ok} successes so far")
    else:
        say("eval", "not started")
    res = load().get(args.suite, {})
    for policy in [p for p in (args.lerobot or "").split(",") if p]:
        name, lr_run = f"lerobot_{policy}", run.with_name(f"{run.name}.lerobot_{policy}")
        if name in res:
            say(name, f"done: mean {res[name]['mean']:.1%}, {res[name]['cpu_hours']:.2f} CPU-h")
        elif lm.train_finished(lr_run):
            chunks = len(list((lr_run / "eval" / "lerobot").glob("part-*/eval_info.json")))
            say(name, f"trained; lerobot-eval: {chunks} of {-(-n_tasks // 5)} chunks of 5 tasks done")
        elif (lr_run / lm.LEDGER).is_file():
            used = sum(r["cpu_s"] for r in json.loads((lr_run / lm.LEDGER).read_text())) / 3600
            budget = res.get(args.row, {}).get("cpu_hours") or 0
            say(name, f"training: {used:.2f} of {budget:.2f} CPU-h spent")
        else:
            say(name, "not started")


# LeRobot's policies beside vlastack's row, as the MT10 rows were made (docs/metaworld.md): Diffusion
# Policy trains at 128 px (its resize_shape) and is scored with DDIM in 10 steps (DDPM's 100 steps
# per chunk make a 480 px evaluation take days here); ACT as LeRobot ships it.
LEROBOT_SETTINGS = {
    "act": {"train": [], "eval": []},
    "diffusion": {
        "train": ["--resize", "128"],
        "eval": ["--", "--policy.noise_scheduler_type=DDIM", "--policy.num_inference_steps=10"],
    },
}


def lerobot_stage(suite: str, policy: str, data: Path, run: Path, row: str, episodes_per_task: int) -> None:
    """LeRobot 0.6.1's ``policy`` trained by lerobot-train on the same data within the CPU-hours
    vlastack's row measured, scored by lerobot-eval on the same seeds (in chunks of 5 tasks, kept
    as they finish, two side by side), and recorded: each part only if not done, like the rest of the pipeline."""
    from bench import lerobot_metaworld as lm

    if policy not in LEROBOT_SETTINGS:
        sys.exit(f"--lerobot: unknown policy {policy!r}; known: {', '.join(LEROBOT_SETTINGS)}")
    name = f"lerobot_{policy}"
    if name in load().get(suite, {}):
        return
    ours = load().get(suite, {}).get(row, {})
    if not ours.get("cpu_hours"):
        sys.exit(f"no CPU-hours recorded for {suite}.{row}: vlastack's row sets the LeRobot budget")
    lr_run = run.with_name(f"{run.name}.{name}")
    script = [sys.executable, str(HERE / "lerobot_metaworld.py")]
    settings = LEROBOT_SETTINGS[policy]
    # (a finished run without run.json, e.g. its last segment's write failed: train writes it)
    if not lm.train_finished(lr_run) or not (lr_run / lm.RUN_INFO).is_file():
        cmd = [*script, "train", "--policy", policy, "--data", str(data), "--repo-id", f"local/{suite}",
               "--run", str(lr_run), "--cpu-hours", f"{ours['cpu_hours']:.4f}", *settings["train"]]  # fmt: skip
        print("$", " ".join(cmd), flush=True)
        if subprocess.call(cmd) != 0 and not lm.train_finished(lr_run):
            sys.exit(1)
    ev = lr_run / "eval" / "eval.json"
    if not ev.is_file():
        cmd = [*script, "eval", "--run", str(lr_run), "--tasks", suite.upper(), "--episodes-per-task",
               str(episodes_per_task), "--seed", "1000", "--chunk-tasks", "5", "--parallel", "2",
               *settings["eval"]]  # fmt: skip
        print("$", " ".join(cmd), flush=True)
        if subprocess.call(cmd) != 0:
            sys.exit(1)
    record_lerobot(suite, name, ev, lr_run, f"bench/metaworld.py pipeline --lerobot {policy}", data,
                   {"evaluator": "lerobot-eval (LeRobot's MetaworldEnv, 480 px, its renderer)"},
                   eval_fields=("command", "eval_wall_s", "eval_cpu_s", "extra_eval_args"))  # fmt: skip


def record_lerobot(suite: str, name: str, eval_json: Path, lr_run: Path, by: str, data: Path, evaluator: dict,
                   tuning: dict | None = None, eval_fields: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """The row ``suite.name`` for a LeRobot run (bench/lerobot_metaworld.py train: its run.json has
    the CPU-hours, commands, steps and non-default settings) trained on ``data`` and scored in
    ``eval_json`` (``eval_fields``: its config's entries copied into ``evaluator``). ``tuning``: the
    fair protocol's fields of a recipe chosen on the validation seeds (``chosen_recipe``)."""
    from bench.lerobot_metaworld import TRAIN_MODULE

    info = json.loads((lr_run / "run.json").read_text())
    record(suite, name, eval_json, None, info["cpu_hours"], dataset_train_seeds(Path(data)))
    cfg = json.loads(Path(eval_json).read_text())["config"] if eval_fields else {}  # record() read it whole
    res = load()
    row = res[suite][name]
    row["train_config"] = {
        "trainer": f"lerobot-train ({TRAIN_MODULE}), LeRobot {info['versions'].get('lerobot')}, "
        f"its own {info.get('policy', name.removeprefix('lerobot_'))} defaults except non_default",
        "commands": info["commands"], "steps_planned": info["plan"]["steps"],
        "steps_reached": info["step_reached"], "non_default": info["non_default"],
        "versions": info["versions"], "segments": info["segments"], "data": str(data), "by": by,
    }  # fmt: skip
    row["eval"] = {**evaluator, **{k: cfg.get(k) for k in eval_fields}}
    row.update(tuning or {})
    row.update(protocol_fields(suite, name, row, res[suite]))
    save(res)
    return row


def dataset_train_seeds(data: Path) -> dict[str, list[int]] | None:
    """{task: [first seed, last seed, episodes]} of a dataset ``vla data generate`` wrote."""
    side = data / "meta" / "vlastack_sim.json"
    if not side.is_file():
        return None
    return seed_ranges((e["task"], e["seed"]) for e in json.loads(side.read_text())["episode_info"])


def seed_ranges(pairs) -> dict[str, list[int]]:
    """(task, seed) pairs -> {task: [first seed, last seed, count]}."""
    by_task: dict[str, list[int]] = {}
    for t, k in pairs:
        by_task.setdefault(t, []).append(int(k))
    return {t: [min(v), max(v), len(v)] for t, v in by_task.items()}


def grounding_errors(policy_dir: Path, tasks: list[str], train_pairs: list, n: int = 20) -> dict:
    """How far the grounding head's object and goal estimates are from the truth, in cm, on ``n``
    training layouts and ``n`` held-out ones (seeds 1000.., lerobot-eval's) of every task. Read on
    the frame after one zero action: Meta-World's reset moves the goal site without a forward
    pass, so the first frame still draws the previous layout's goal (in LeRobot's env as well)."""
    import numpy as np
    import torch

    from vlastack.infer.policy import Policy
    from vlastack.sim.metaworld import GROUNDING_INDEX, MetaWorldEnv

    pol = Policy.from_pretrained(policy_dir)
    cfg = pol.cfg
    idx = list(cfg.grounding.state_index) or list(GROUNDING_INDEX)
    key = "observation.environment_state"
    out = {}
    for task in tasks:
        env = MetaWorldEnv(task, image_size=480, render_quality="fast")
        seen = sorted(s for t, s in train_pairs if t == task)[:n]
        row = {}
        for name, seeds in (("train", seen), ("heldout", list(range(1000, 1000 + n)))):
            errs = []
            for seed in seeds:
                env.reset(seed=seed)
                obs = env.step(np.zeros(4, np.float32))[0]
                batch = pol.model_batch([pol.check(obs)])
                with torch.inference_mode(), pol.autocast():
                    pred = pol.model.head.predict_grounding(pol.model, batch).float().numpy()[0]
                full = pol.normalizer.normalize(key, np.zeros(39, np.float32))
                full[idx] = pred
                est = np.asarray(pol.normalizer.unnormalize(key, full))[idx].reshape(-1, 3)
                errs.append(np.linalg.norm(est - env.raw_state()[idx].reshape(-1, 3), axis=1) * 100)
            e = np.array(errs)
            row[name] = {"layouts": len(seeds), "object_cm": round(float(e[:, 0].mean()), 2),
                         "goal_cm": round(float(e[:, 1].mean()), 2),
                         "goal_over_5cm": round(float((e[:, 1] > 5).mean()), 3)}  # fmt: skip
        env.close()
        out[task] = row
        print(f"{task:28s} train: object {row['train']['object_cm']:.1f} cm, goal {row['train']['goal_cm']:.1f} cm;"
              f" held-out: object {row['heldout']['object_cm']:.1f} cm, goal {row['heldout']['goal_cm']:.1f} cm",
              flush=True)  # fmt: skip
    return out


def cmd_grounding(args: argparse.Namespace) -> None:
    from vlastack.sim.metaworld_tasks import expand_tasks

    run = Path(args.run)
    policy = final_policy(run)
    pairs = json.loads((run / "final" / "train_seeds.json").read_text())["episodes"]
    errors = grounding_errors(policy, list(expand_tasks(args.tasks.split(","))), pairs, args.layouts)
    res = load()
    res.setdefault(args.suite, {}).setdefault(args.row, {})["grounding_error"] = {
        "note": "grounding head estimate vs truth, cm, after one zero action; train = training layouts, "
        "heldout = seeds 1000..",
        "per_task": errors,
    }
    save(res)


def run_protocol(res: dict, suite: str, policy: str, run: Path) -> dict:
    """A fair run's validation seeds and trials: its ``protocol.json`` where it has one, else, where
    the row's name has validation trials (``res[suite]["tuning"][policy]``), ``chosen_recipe``'s
    fields, which refuses a run that is not the best of them."""
    if (run / PROTOCOL).exists():
        return json.loads((run / PROTOCOL).read_text())
    if res.get(suite, {}).get("tuning", {}).get(policy):
        return chosen_recipe(res, suite, policy, run)
    return {}


def record(
    suite: str,
    policy: str,
    eval_json: Path,
    run: Path | None,
    cpu_hours: float | None = None,
    train_seeds: dict | None = None,
) -> None:
    """Write ``suite.policy`` anew from an eval.json; ``run`` (a vlastack run) supplies the CPU
    ledger, training seeds and config, else ``cpu_hours`` and ``train_seeds`` are given."""
    ev = json.loads(Path(eval_json).read_text())
    train_config = None
    if run is not None:
        ledger = read_ledger(run)
        cpu_hours = cpu_hours if cpu_hours is not None else sum(r["cpu_s"] for r in ledger) / 3600 or None
        seeds_file = run / "final" / "train_seeds.json"
        if seeds_file.exists():
            s = json.loads(seeds_file.read_text())
            train_seeds = seed_ranges(s["episodes"])
        from vlastack.config import load_yaml, to_dict

        cfg = to_dict(load_yaml(run / "final" / "config.yaml"))
        train_config = {
            "recipe": RECIPES[suite],
            **cfg["train"],
            "model.grounding": cfg["model"]["grounding"],
        }
        overrides = [a for r in ledger for a in r["argv"] if "=" in a and not a.startswith("-")]
        if ledger and int(cfg["model"]["grounding"].get("points") or 0):
            train_config["grounding_labels"] = label_source(data_arg(ledger[-1]["argv"]))
        if overrides:  # the dotted overrides on top of the recipe, as given to `vla train`
            train_config["overrides"] = sorted(set(overrides))
        train_config["segments"] = [{k: r[k] for k in ("started", "wall_s", "cpu_s", "rc")} for r in ledger]
    res = load()
    kept = {k: v for k, v in res.get(suite, {}).get(policy, {}).items() if k in ("grounding_error", "note")}
    res.setdefault(suite, {})[policy] = (
        entry_from_eval(ev, suite, cpu_hours, train_seeds, train_config) | kept
    )
    e = res[suite][policy]
    if run is not None:
        e.update(run_protocol(res, suite, policy, run))
    e.update(protocol_fields(suite, policy, e, res[suite]))
    print(
        f"{suite} {policy}: mean {e['mean']:.1%}, {e['cpu_hours'] or 0:.2f} CPU-h, {e['episodes_per_task']}/task"
    )
    save(res)


def cmd_validate(args: argparse.Namespace) -> None:
    """Score the run's final policy on the validation seeds (VALIDATION_SEED + j): a tuning trial."""
    from vlastack.cli import main

    run = Path(args.run)
    out = run / "eval_val"
    policy = final_policy(run)
    argv = ["eval", "--policy", str(policy), "--config", RECIPES[args.suite], "--out", str(out), "--resume",
            "--workers", str(args.workers), "--episodes-per-task", str(args.episodes_per_task),
            "--seed", str(VALIDATION_SEED), "--videos", "0", *args.overrides]  # fmt: skip
    if main(argv) != 0:
        sys.exit(1)
    ev = json.loads((out / "eval.json").read_text())
    ledger = read_ledger(run)
    data = data_arg(ledger[-1]["argv"]) if ledger else None
    trial = {"trial": args.trial, "run": str(run), "cpu_hours": sum(r["cpu_s"] for r in ledger) / 3600 or None,
             "overrides": sorted({a for r in ledger for a in r["argv"] if "=" in a and not a.startswith("-")}),
             "data": data, "grounding_labels": label_source(data),
             "date": datetime.date.today().isoformat(),
             "machine": ledger[-1]["machine"] if ledger else machine()}  # fmt: skip
    res = load()
    entry = record_validation(res, args.suite, args.row, ev, trial)
    save(res)
    print(
        f"{args.suite} tuning {args.row} [{args.trial}]: {entry['mean']:.1%} on validation seeds {entry['seeds']}"
    )


def cmd_backfill(args: argparse.Namespace) -> None:
    save(backfill(load()))
    print("protocol fields written on every mt10/mt50 row")


def merge_evals(paths: list[Path], out: Path) -> dict:
    """Evaluations of one policy on disjoint seeds (e.g. seeds 1000-1004, then 1005-1009, each run
    as its own resumable ``vla eval``) -> one eval.json as a single run over all of them would give:
    the same per-task, group and pooled statistics. Refuses another policy, other settings or a
    (task, seed) pair twice."""
    from vlastack.sim.evaluate import summarize

    def settings(ev: dict) -> tuple:  # what must agree: all but the seeds each part ran
        return (
            ev["policy"],
            ev["suite"],
            {k: v for k, v in ev["config"].items() if k not in ("seed", "episodes")},
        )

    evs = [json.loads(Path(p).read_text()) for p in paths]
    episodes, seen = [], set()
    for p, ev in zip(paths, evs, strict=True):
        if settings(ev) != settings(evs[0]):
            raise ValueError(f"{p}: another policy or other settings than {paths[0]}; not merged")
        for e in ev["episodes"]:
            if (e["task"], e["seed"]) in seen:
                raise ValueError(f"{p}: {e['task']} seed {e['seed']} is in two of the evaluations")
            seen.add((e["task"], e["seed"]))
            episodes.append(e)
    tasks = tuple(evs[0]["tasks"])
    episodes.sort(key=lambda e: (tasks.index(e["task"]), e["seed"]))
    episodes = [{**e, "episode": i} for i, e in enumerate(episodes)]
    res = summarize(episodes, tasks, evs[0]["policy"], evs[0]["suite"], sum(ev["wall_s"] for ev in evs))
    per_task = {len([e for e in episodes if e["task"] == t]) for t in tasks}
    res["config"] = {**evs[0]["config"], "seed": min(ev["config"]["seed"] for ev in evs),
                     "episodes": per_task.pop() if len(per_task) == 1 else None}  # fmt: skip
    res["train_seeds"] = evs[0].get("train_seeds")
    res["merged_from"] = [str(p) for p in paths]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"merged {len(episodes)} episodes of {len(paths)} evaluations into {out}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("expert")
    e.add_argument("--tasks", default="MT50")
    e.add_argument("--episodes-per-task", type=int, default=50)
    e.add_argument("--seed", type=int, default=1000)
    e.add_argument("--workers", type=int, default=2)
    t = sub.add_parser("train")
    t.add_argument("--suite", choices=sorted(RECIPES), required=True)
    t.add_argument("--run", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("overrides", nargs="*", help="dotted config overrides")
    v = sub.add_parser("eval")
    v.add_argument("--suite", choices=sorted(RECIPES), required=True)
    v.add_argument("--run", required=True)
    v.add_argument("--out", default=None)
    v.add_argument("--workers", type=int, default=2)
    v.add_argument("--episodes-per-task", type=int, default=None)
    v.add_argument("--as", dest="row", default="vlastack", help="the row's name in metaworld.json")
    v.add_argument("overrides", nargs="*", help="dotted config overrides")
    g = sub.add_parser("grounding", help="the grounding head's error on training and held-out layouts")
    g.add_argument("--suite", choices=sorted(RECIPES), required=True)
    g.add_argument("--run", required=True)
    g.add_argument("--tasks", default="MT10")
    g.add_argument("--layouts", type=int, default=20)
    g.add_argument("--as", dest="row", default="vlastack", help="the row's name in metaworld.json")
    p = sub.add_parser("pipeline", help="generate -> train -> eval, each only if not done (resumable)")
    p.add_argument("--suite", choices=sorted(RECIPES), required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--episodes-per-task", type=int, default=None, help="evaluation (default: the recipe's)")
    p.add_argument("--data-episodes-per-task", type=int, default=50, help="generated (LeRobot's: 50)")
    p.add_argument("--as", dest="row", default="vlastack", help="the row's name in metaworld.json")
    p.add_argument(
        "--lerobot",
        default="",
        help="then LeRobot's policies on the same data and CPU-hours, e.g. act,diffusion (its own venv)",
    )
    p.add_argument("--lerobot-episodes-per-task", type=int, default=2, help="lerobot-eval episodes per task")
    p.add_argument("overrides", nargs="*", help="dotted config overrides (training and evaluation)")
    st = sub.add_parser("status", help="where a pipeline stands (reads its files; starts nothing)")
    st.add_argument("--suite", choices=sorted(RECIPES), required=True)
    st.add_argument("--run", required=True)
    st.add_argument("--data", required=True)
    st.add_argument("--episodes-per-task", type=int, default=None)
    st.add_argument("--as", dest="row", default="vlastack", help="vlastack's row (it sets LeRobot's budget)")
    st.add_argument("--lerobot", default="act,diffusion", help="the LeRobot rows to report")
    r = sub.add_parser("record")
    r.add_argument("--suite", choices=sorted(RECIPES), required=True)
    r.add_argument("--policy", required=True)
    r.add_argument("--eval-json", required=True)
    r.add_argument("--cpu-hours", type=float, default=None)
    r.add_argument("--run", default=None)
    va = sub.add_parser("validate", help="a tuning trial: the run's policy on the validation seeds (2000+j)")
    va.add_argument("--suite", choices=sorted(RECIPES), required=True)
    va.add_argument("--run", required=True)
    va.add_argument("--as", dest="row", required=True, help="the recipe's name (mt10.tuning.NAME)")
    va.add_argument("--trial", required=True, help="what this trial tried, e.g. 'lr 3e-4'")
    va.add_argument("--episodes-per-task", type=int, default=10)
    va.add_argument("--workers", type=int, default=2)
    va.add_argument("overrides", nargs="*", help="dotted config overrides (evaluation)")
    sub.add_parser("backfill", help="write the fair protocol's fields on every mt10/mt50 row")
    m = sub.add_parser("merge", help="evaluations of one policy on disjoint seeds -> one eval.json")
    m.add_argument("evals", nargs="+", help="eval.json files")
    m.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.cmd == "merge":
        merge_evals([Path(p) for p in args.evals], Path(args.out))
    elif args.cmd == "record":
        record(
            args.suite,
            args.policy,
            Path(args.eval_json),
            Path(args.run) if args.run else None,
            args.cpu_hours,
        )
    else:
        cmds = {"expert": cmd_expert, "train": cmd_train, "eval": cmd_eval, "grounding": cmd_grounding}
        cmds |= {"validate": cmd_validate, "backfill": cmd_backfill}
        {**cmds, "pipeline": cmd_pipeline, "status": cmd_status}[args.cmd](args)


if __name__ == "__main__":
    main()
