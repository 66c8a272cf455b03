"""The LIBERO row (issue #68): a vlastack policy trained from scratch on demonstrations generated
here, beside LeRobot 0.6.1's ACT and Diffusion Policy trained on the same data within the CPU-hours
vlastack's run measured, every row scored with 50 trials per task by lerobot-eval's protocol
-> bench/results/libero.json ``policies`` (docs/libero.md).

    # each stage only if not done yet: run the same command again to continue (days, sessions)
    .venv/bin/python bench/libero_policy.py pipeline --suite libero_object --data data/libero_object \\
        --run runs/libero_object --lerobot act,diffusion
    # where it stands (reads files, starts nothing)
    .venv/bin/python bench/libero_policy.py status --suite libero_object --data data/libero_object --run runs/libero_object

Stages:
1. data: ``vla data generate --suite S --episodes-per-task 50 --image-size 128``: the scripted expert
   (sim/libero_expert.py) on the tasks' own random placements (seeds 0.., never one of the 50 fixed
   evaluation states), resumable in blocks of 10 episodes.
2. vlastack: ``vla train --config S`` (vlastack/configs/S.yaml), its CPU time in the run's ledger
   (bench/metaworld.py ``train_recipe``); then ``vla eval`` on seeds 1000 + j (fixed initial state
   j, LIBERO's 50 per task) at the data's 128 px.
3. LeRobot: ``bench/lerobot_metaworld.py train`` (lerobot-train, its defaults, the budget from 2)
   and ``eval --env libero`` (lerobot-eval's LiberoEnv, same seeds and image size).

The two evaluators step the same episodes: vlastack's LiberoEnv equals LeRobot's image for image at
lerobot-eval's batch size 1 (tests/sim/test_libero.py). Nothing the policies see differs: images,
the 8-D state and the instruction; no simulator-only signal trains either side. The vlastack recipe
was fixed before any LIBERO score (it is the Meta-World MT10 recipe with LIBERO's two cameras, no
grounding head): no tuning trials, so no validation seeds were needed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [str(HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != HERE)]

from bench.metaworld import final_policy, machine, read_ledger, seed_ranges, train_recipe  # noqa: E402

RESULTS = HERE / "results" / "libero.json"
IMAGE_SIZE = 128  # the data's and every evaluation's
DEMOS_PER_TASK = 50  # LIBERO's datasets hold 50 demonstrations per task
TRIALS = 50  # per task: LIBERO's 50 fixed initial states, lerobot-eval's seeds 1000 + j
LEROBOT_TRAIN = {"act": [], "diffusion": ["--resize", str(IMAGE_SIZE)]}


# Published libero_object success (%) beside which the row stands, with each protocol as its source
# states it (../shared/reference/peers-2026-11-28.md, section 3c). All of them trained on LIBERO's
# human demonstrations (50 per task, 256 px), most from a pretrained VLM: not the data here.
PUBLISHED = {
    "pi05_openpi": {"success": 98.2, "protocol": "pi05_libero, one policy for the four suites; 50 trials "
                    "per task, seed 7, replanning every 5 steps", "source": "openpi examples/libero/README.md"},
    "pi05_lerobot": {"success": 99.0, "protocol": "LeRobot's pi0.5 fine-tune (6k steps, 8xH100, batch 256); "
                     "10 episodes per task", "source": "lerobot docs/source/libero.mdx"},
    "pi0_openpi": {"success": 98.8, "protocol": "50 trials per task", "source": "openpi examples/libero/README.md @ 7cf5f60"},
    "pi0_fast_openpi": {"success": 96.8, "protocol": "50 trials per task", "source": "openpi examples/libero/README.md @ 7cf5f60"},
    "openvla_oft": {"success": 98.4, "protocol": "one policy per suite; 50 trials per task, 3 seeds",
                    "source": "openvla-oft LIBERO.md"},
    "smolvla_0.45b": {"success": 96.0, "protocol": "10 trials per task", "source": "SmolVLA paper (arXiv 2506.01844)"},
    "diffusion_policy_scratch": {"success": 92.5, "protocol": "from scratch; trials not stated",
                                 "source": "VLA-Adapter paper, Table 5"},
}  # fmt: skip


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def save(res: dict) -> None:
    res.setdefault("published", {})["libero_object"] = PUBLISHED
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {RESULTS}")


def data_done(data: Path) -> bool:
    return (data / "meta" / "vlastack_sim.json").is_file()  # written last


def training_done(run: Path) -> bool:
    return (run / "final" / "config.yaml").is_file() and (run / "train_summary.json").is_file()


def row(ev: dict, cpu_hours: float | None, train: dict, evaluator: str, data: Path) -> dict:
    """One row of ``policies.<suite>``: per-task success, the mean with the pooled 95% Wilson
    interval, the budget and how the row was made."""
    per_task = {t: s["success_rate"] for t, s in ev["tasks"].items()}
    info = json.loads((data / "meta" / "vlastack_sim.json").read_text())
    return {
        "per_task": per_task,
        "mean": sum(per_task.values()) / len(per_task),
        "ci95": ev["overall"]["ci95"],
        "successes": ev["overall"]["successes"],
        "episodes": ev["overall"]["n"],
        "trials_per_task": sorted({s["n"] for s in ev["tasks"].values()}),
        "eval_seeds": [min(e["seed"] for e in ev["episodes"]), max(e["seed"] for e in ev["episodes"])],
        "image_size": ev["config"].get("image_size"),
        "evaluator": evaluator,
        "cpu_hours": cpu_hours,
        "train": train,
        "data": {
            "path": str(data),
            "episodes": info["episodes"],
            "frames": info["frames"],
            "train_seeds": seed_ranges([(e["task"], e["seed"]) for e in info["episode_info"]]),
            "placements": "the tasks' own random placements (init_states=False), seeded",
        },
        "privileged_labels": False,
        "tuning_trials": 0,
        "machine": machine(),
        "date": datetime.date.today().isoformat(),
    }


def cmd_pipeline(args: argparse.Namespace) -> None:
    data, run, suite = Path(args.data), Path(args.run), args.suite
    if not data_done(data):
        gen = [sys.executable, "-m", "vlastack.cli", "data", "generate", "--suite", suite, "--episodes-per-task",
               str(DEMOS_PER_TASK), "--image-size", str(IMAGE_SIZE), "--workers", str(args.workers),
               "--out", str(data)]  # fmt: skip
        print("$", " ".join(gen), flush=True)
        if subprocess.call(gen) != 0:
            sys.exit(1)
    if not training_done(run) and train_recipe(suite, run, str(data), args.overrides) != 0:
        sys.exit(1)
    ev_path = run / "eval" / "eval.json"
    if not ev_path.is_file():
        from vlastack.cli import main

        argv = ["eval", "--policy", str(final_policy(run)), "--config", suite, "--out", str(run / "eval"),
                "--resume", "--workers", str(args.workers), "--episodes-per-task", str(TRIALS), *args.overrides]  # fmt: skip
        if main(argv) != 0:
            sys.exit(1)
    res = load()
    rows = res.setdefault("policies", {}).setdefault(suite, {})
    if "vlastack" not in rows:
        ledger = read_ledger(run)
        rows["vlastack"] = row(
            json.loads(ev_path.read_text()),
            sum(r["cpu_s"] for r in ledger) / 3600,
            {
                "recipe": f"vlastack/configs/{suite}.yaml",
                "overrides": args.overrides,
                "segments": [{k: r[k] for k in ("started", "wall_s", "cpu_s", "rc")} for r in ledger],
            },
            "vla eval (vlastack's LiberoEnv, lerobot-eval's protocol at batch size 1)",
            data,
        )
        save(res)
    for policy in [p for p in (args.lerobot or "").split(",") if p]:
        lerobot_stage(suite, policy, data, run, args.workers)


def lerobot_stage(suite: str, policy: str, data: Path, run: Path, workers: int) -> None:
    """LeRobot's ``policy`` on the same data within vlastack's measured CPU-hours, scored by
    lerobot-eval's LiberoEnv on the same seeds and image size; each part only if not done."""
    from bench import lerobot_metaworld as lm

    if policy not in LEROBOT_TRAIN:
        sys.exit(f"--lerobot: unknown policy {policy!r}; known: {', '.join(LEROBOT_TRAIN)}")
    name = f"lerobot_{policy}"
    rows = load().get("policies", {}).get(suite, {})
    if name in rows:
        return
    budget = rows["vlastack"]["cpu_hours"]
    lr_run = run.with_name(f"{run.name}.{name}")
    script = [sys.executable, str(HERE / "lerobot_metaworld.py")]
    if not lm.train_finished(lr_run) or not (lr_run / lm.RUN_INFO).is_file():
        cmd = [*script, "train", "--policy", policy, "--data", str(data), "--repo-id", f"local/{suite}",
               "--run", str(lr_run), "--cpu-hours", f"{budget:.4f}", *LEROBOT_TRAIN[policy]]  # fmt: skip
        print("$", " ".join(cmd), flush=True)
        if subprocess.call(cmd) != 0 and not lm.train_finished(lr_run):
            sys.exit(1)
    ev_path = lr_run / "eval" / "eval.json"
    if not ev_path.is_file():
        cmd = [*script, "eval", "--env", "libero", "--image-size", str(IMAGE_SIZE), "--run", str(lr_run),
               "--tasks", suite, "--episodes-per-task", str(TRIALS), "--seed", "1000", "--chunk-tasks", "5",
               "--parallel", str(max(1, workers))]  # fmt: skip
        print("$", " ".join(cmd), flush=True)
        if subprocess.call(cmd) != 0:
            sys.exit(1)
    info = json.loads((lr_run / lm.RUN_INFO).read_text())
    res = load()
    ev = json.loads(ev_path.read_text())
    train = {"trainer": f"lerobot-train, LeRobot {info['versions'].get('lerobot')}, its {policy} defaults "
             "except non_default", "steps_planned": info["plan"]["steps"], "steps_reached": info["step_reached"],
             "non_default": info["non_default"], "commands": info["commands"]}  # fmt: skip
    res["policies"][suite][name] = row(
        ev, info["cpu_hours"], train, "lerobot-eval (LeRobot's LiberoEnv)", data
    )
    res["policies"][suite][name]["eval_command"] = ev["config"].get("command")
    save(res)


def cmd_status(args: argparse.Namespace) -> None:
    from vlastack.sim.generate import episodes_written
    from vlastack.sim.libero import task_keys

    data, run = Path(args.data), Path(args.run)
    if data_done(data):
        print(
            f"data      done: {json.loads((data / 'meta' / 'info.json').read_text())['total_episodes']} episodes"
        )
    else:
        tasks = task_keys(args.suite)
        n = episodes_written(data, tasks)
        print(
            f"data      {n} of {len(tasks) * DEMOS_PER_TASK} episodes written"
            if n
            else "data      not started"
        )
    cpu_h = sum(r["cpu_s"] for r in read_ledger(run)) / 3600
    state = "done" if training_done(run) else ("under way" if cpu_h else "not started")
    print(f"vlastack  training {state}, {cpu_h:.2f} CPU-h")
    journal = run / "eval" / "eval.partial.jsonl"
    if (run / "eval" / "eval.json").is_file():
        print("vlastack  evaluated")
    elif journal.is_file():
        done = sum(1 for line in journal.read_text().splitlines() if '"result"' in line)
        print(f"vlastack  {done} of {10 * TRIALS} episodes evaluated")
    rows = load().get("policies", {}).get(args.suite, {})
    for name, r in rows.items():
        ci = f"[{r['ci95'][0]:.1%}, {r['ci95'][1]:.1%}]"
        print(f"{name:<18} {r['mean']:.1%} {ci}, {r['cpu_hours'] or 0:.2f} CPU-h")
    from bench.lerobot_common import LEDGER

    for policy in LEROBOT_TRAIN:  # LeRobot runs under way: the budget spent so far
        name, lr_run = f"lerobot_{policy}", run.with_name(f"{run.name}.lerobot_{policy}")
        if name not in rows and (lr_run / LEDGER).is_file():
            spent = sum(r.get("cpu_s", 0.0) for r in json.loads((lr_run / LEDGER).read_text())) / 3600
            budget = rows.get("vlastack", {}).get("cpu_hours") or 0.0
            print(f"{name:<18} training: {spent:.2f} of {budget:.2f} CPU-h spent")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("pipeline", "status"):
        p = sub.add_parser(name)
        p.add_argument("--suite", choices=("libero_object",), default="libero_object")
        p.add_argument("--data", required=True)
        p.add_argument("--run", required=True)
        if name == "pipeline":
            p.add_argument("--workers", type=int, default=2)
            p.add_argument("--lerobot", default="", help="LeRobot policies to train and score: act,diffusion")
    args = ap.parse_args(argv)
    args.overrides = overrides
    {"pipeline": cmd_pipeline, "status": cmd_status}[args.cmd](args)


if __name__ == "__main__":
    main()
