"""LeRobot 0.6.1's own ACT and Diffusion Policy on our Meta-World MT10/MT50 (or LIBERO) data, under a measured CPU budget.

The LeRobot side of docs/metaworld.md: LeRobot's policies, trained by LeRobot's own training script
(``lerobot.scripts.lerobot_train``, the ``lerobot-train`` entry point) on the dataset that
``vla data generate`` wrote, scored by LeRobot's own ``lerobot-eval`` on the same seeds as vlastack
(episode j of every task: seed 1000 + j), and recorded beside vlastack's row in
bench/results/metaworld.json. This file imports nothing outside the standard library but its two
siblings, which are standard library only too (bench/lerobot_common.py: what ``train`` and ``eval``
share; bench/lerobot_metaworld_eval.py: ``eval`` and ``convert``): it runs under any Python (ours or
the LeRobot venv's) and starts LeRobot in the LeRobot venv as a subprocess (``--lerobot-python``,
default ``$LEROBOT_PYTHON`` or /work/lrvenv/bin/python).

    # ACT, 3 CPU-hours (vlastack's MT10 recipe is planned for ~3; pass the CPU-hours that vlastack's
    # row in bench/results/metaworld.json measured): a 40-step probe measures the CPU seconds of one
    # step, the run gets as many steps as fit in 95% of the budget, a watchdog stops it at the budget
    .venv/bin/python bench/lerobot_metaworld.py train --policy act --data /tmp/mw/mt10 --run runs/lr_act --cpu-hours 3
    .venv/bin/python bench/lerobot_metaworld.py eval --run runs/lr_act --tasks MT10 --episodes-per-task 50 --seed 1000
    .venv/bin/python bench/metaworld.py record --suite mt10 --policy lerobot_act \\
        --eval-json runs/lr_act/eval/eval.json --cpu-hours <the CPU-h that train printed>

    # Diffusion Policy: the same with --policy diffusion (and --resize 128), --run runs/lr_dp

    # LIBERO: the same train on `vla data generate --suite libero_object` data; scored by lerobot-eval's
    # LiberoEnv at the data's image size (seeds 1000 + j, fixed initial state j, as `vla eval`)
    .venv/bin/python bench/lerobot_metaworld.py eval --env libero --image-size 128 --run runs/lr_act_libero \
        --tasks libero_object --episodes-per-task 50 --chunk-tasks 5 --parallel 2

``train`` runs again with the same arguments after an interruption: it resumes LeRobot's last
checkpoint (``--resume=true --config_path=.../train_config.json``) with the planned total steps,
and the budget left. ``--steps N`` skips the probe. Extra LeRobot flags go after ``--`` (e.g.
``-- --batch_size=16``) and are recorded as non-default settings. ``convert`` turns an existing
``eval_info.json`` into our eval.json without running anything (``eval`` and ``convert`` live in
bench/lerobot_metaworld_eval.py). The venv: ``bash scripts/setup_lerobot_venv.sh``.

Run folder: ``lerobot/`` (LeRobot's ``--output_dir``: checkpoints/last/pretrained_model is the policy
that ``eval`` scores), ``cpu_ledger.json`` (one row per training segment: CPU seconds, wall, rc, the
exact command line), ``probe.json`` (the probe's command, CPU and per-step fit; not counted in the
run's CPU-hours), ``plan.json`` (steps, checkpoint period, budget), ``run.json`` (versions, LeRobot's
config, every non-default setting and why), ``train_log.txt``, and ``eval/`` (lerobot-eval's
``eval_info.json`` under eval/lerobot/part-NNN, one per chunk of ``--chunk-tasks`` tasks, and our
``eval.json``). ``eval`` run again with the same arguments keeps the finished chunks: an MT50
evaluation cut off with its session continues where it stopped.

CPU time is measured as bench/metaworld.py does: ``getrusage(RUSAGE_CHILDREN)`` (user + system) of
the LeRobot process and its joined workers, and /proc summed over the live tree every 2 s (the
watchdog's budget check); a segment records the larger, so a worker that dies unjoined counts.

Settings, what is known to differ before any run, and what only a run tells: docs/research/metaworld.md
("The LeRobot side: settings and known differences").
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import shutil
import sys
from pathlib import Path

# Run as a script, bench/ is first on sys.path: the repository root is needed for `bench.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lerobot_common import (
    LAST,
    LEDGER,
    LEROBOT_PYTHON,
    LOG,
    OFFLINE_ENV,
    OUT,
    PLAN,
    PROBE,
    RUN_INFO,
    TRAIN_MODULE,
    Segment,
    machine,
    now,
    read_json,
    task_onehot,
    versions,
    write_json,
)
from bench.lerobot_metaworld_eval import cmd_convert, cmd_eval

REQUIRED = {
    "act": ("accelerate",),
    "diffusion": ("accelerate", "diffusers"),
}  # not pulled by `pip install lerobot`

# What differs from LeRobot 0.6.1's defaults, and why. Flags that only name things (output_dir,
# job_name, dataset.repo_id/root) are not listed.
NON_DEFAULT = {
    "policy.pretrained_backbone_weights": (
        None,
        "default ResNet18_Weights.IMAGENET1K_V1 is downloaded at run time; nothing can be downloaded, "
        "and the comparison is from scratch",
    ),
    "policy.device": ("cpu", "the benchmark is a 2-core CPU; the default picks an accelerator if present"),
    "policy.push_to_hub": (False, "offline; the default (true) also demands a policy.repo_id"),
    "policy.input_features": (
        "observation.image + observation.state",
        "by default every observation.* key becomes an input, including observation.environment_state "
        "(39-d privileged sim state) that LeRobot's MetaworldEnv does not return at evaluation",
    ),
    "steps": ("from the CPU budget", "default 100000; the run gets what fits in --cpu-hours"),
    "save_freq": (
        "steps / --checkpoints",
        "default 20000; a few checkpoints to resume and to stop at the budget",
    ),
    "log_freq": ("50 (probe: 5)", "logging only: the probe reads CPU time at each logged step"),
    "env_eval_freq": (
        0,
        "no evaluation during training (no env configured either); lerobot-eval scores after",
    ),
    "wandb.enable": (False, "already the default; offline"),
}


def check_requirements(py: str, policy: str) -> dict:
    v = versions(py)
    if not v.get("lerobot"):
        sys.exit(f"lerobot is not installed for {py} (set --lerobot-python or $LEROBOT_PYTHON)")
    missing = [p for p in REQUIRED[policy] if not v.get(p)]
    if missing:
        sys.exit(
            f"{py} lacks {missing}: lerobot-train needs accelerate and the Diffusion policy diffusers "
            f"(LeRobot's extras 'training' / 'diffusion'). Install: {Path(py).parent}/pip install "
            "'accelerate>=1.14,<2' 'diffusers>=0.38,<0.40'"
        )
    return v


def ckpt_step(ckpt: Path) -> int | None:
    """The step a LeRobot checkpoint folder (checkpoints/<step> or checkpoints/last) holds."""
    st = read_json(ckpt / "training_state" / "training_step.json")
    return int(st["step"]) if st else None


# --------------------------------------------------------------------------------------------- train


def data_features(data: Path) -> dict:
    """--policy.input_features: the camera(s) and the robot state, channel-first as LeRobot wants;
    and the environment state only where it is the task as a one-hot (never a simulator's state)."""
    feats = read_json(data / "meta" / "info.json")["features"]
    out = {}
    for key, ft in feats.items():
        if ft["dtype"] in ("image", "video"):
            h, w, c = ft["shape"]
            out[key] = {"type": "VISUAL", "shape": [c, h, w]}
        elif key == "observation.state":
            out[key] = {"type": "STATE", "shape": list(ft["shape"])}
        elif key == "observation.environment_state" and task_onehot(data):
            out[key] = {"type": "ENV", "shape": list(ft["shape"])}
    if not any(v["type"] == "VISUAL" for v in out.values()) or "observation.state" not in out:
        sys.exit(f"{data}: expected an image/video feature and observation.state in meta/info.json")
    return out


def fresh_args(args: argparse.Namespace, out: Path, steps: int, save_freq: int, log_freq: int,
               save: bool = True) -> list[str]:  # fmt: skip
    a = [
        f"--policy.type={args.policy}",
        "--policy.device=cpu",
        "--policy.push_to_hub=false",
        "--policy.pretrained_backbone_weights=null",
        "--policy.input_features=" + json.dumps(data_features(Path(args.data)), separators=(",", ":")),
        f"--dataset.repo_id={args.repo_id}",
        f"--dataset.root={Path(args.data).resolve()}",
        f"--output_dir={out.resolve()}",
        f"--job_name={Path(args.data).name}_{args.policy}",
        f"--steps={steps}",
        f"--save_freq={save_freq}",
        f"--log_freq={log_freq}",
        "--env_eval_freq=0",
        "--wandb.enable=false",
    ]
    if args.resize:
        a.append(f"--policy.resize_shape=[{args.resize},{args.resize}]")
    if not save:
        a.append("--save_checkpoint=false")
    return a + list(args.extra)


def resume_args(out: Path, steps: int, save_freq: int, log_freq: int) -> list[str]:
    cfg = (out / LAST / "pretrained_model" / "train_config.json").resolve()
    return ["--resume=true", f"--config_path={cfg}", f"--steps={steps}", f"--save_freq={save_freq}",
            f"--log_freq={log_freq}"]  # fmt: skip


def fit_per_step(points: list[tuple[int, float, float]], total_cpu: float, steps: int) -> dict:
    """Least squares CPU = startup + per_step * step over the logged steps, the first one left out
    (warm-up, loader workers filling their queues). Falls back to total / steps (an overestimate)."""
    pts = [(s, c) for s, c, _ in points if s > 0][1:]
    if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
        n = len(pts)
        mx, my = sum(s for s, _ in pts) / n, sum(c for _, c in pts) / n
        sxx = sum((s - mx) ** 2 for s, _ in pts)
        slope = sum((s - mx) * (c - my) for s, c in pts) / sxx
        if slope > 0:
            return {
                "per_step_s": slope,
                "startup_s": max(0.0, my - slope * mx),
                "method": "fit",
                "points": pts,
            }
    return {"per_step_s": total_cpu / max(1, steps), "startup_s": 0.0, "method": "total/steps", "points": pts}


def cmd_train(args: argparse.Namespace) -> None:
    run = Path(args.run)
    out = run / OUT
    py = args.lerobot_python
    vers = check_requirements(py, args.policy)
    budget_s = args.cpu_hours * 3600
    ledger = read_json(run / LEDGER, [])
    plan = read_json(run / PLAN)
    used = sum(r["cpu_s"] for r in ledger)
    base = [py, "-m", TRAIN_MODULE]

    if plan and plan["policy"] != args.policy:
        sys.exit(f"{run} holds a {plan['policy']} run; use another --run")
    if plan is None:
        if out.exists():
            sys.exit(f"{out} exists without {run / PLAN}: not a run of this script; use another --run")
        steps = args.steps
        probe = None
        if steps is None:  # measure CPU seconds per step, then fit the run in the budget
            pdir = run / "probe"
            shutil.rmtree(pdir, ignore_errors=True)
            pargs = fresh_args(args, pdir / OUT, args.probe_steps, args.probe_steps, 5, save=False)
            seg = Segment(base + pargs, run / "probe_log.txt")
            row = seg.run()
            if row["rc"] != 0:
                write_json(run / PROBE, {**row, "points": seg.points})
                sys.exit(f"probe failed (rc {row['rc']}); see {run / 'probe_log.txt'}")
            fit = fit_per_step(seg.points, row["cpu_s"], args.probe_steps)
            left = budget_s * (1 - args.margin) - fit["startup_s"]
            steps = int(left // fit["per_step_s"])
            probe = {**row, **fit, "probe_steps": args.probe_steps, "planned_steps": steps}
            write_json(run / PROBE, probe)
            shutil.rmtree(pdir, ignore_errors=True)
            print(f"probe: {fit['per_step_s']:.2f} CPU-s/step, startup {fit['startup_s']:.0f} CPU-s "
                  f"({fit['method']}) -> {steps} steps in {args.cpu_hours} CPU-h", flush=True)  # fmt: skip
            if steps < 1:
                sys.exit("the budget does not buy one step")
        save_freq = max(1, math.ceil(steps / args.checkpoints))
        plan = {"policy": args.policy, "data": str(Path(args.data).resolve()), "steps": steps,
                "save_freq": save_freq, "log_freq": 50, "cpu_hours_budget": args.cpu_hours,
                "from_probe": probe is not None, "resize": args.resize, "extra": list(args.extra),
                "created": now()}  # fmt: skip
        write_json(run / PLAN, plan)
    else:
        if args.cpu_hours != plan["cpu_hours_budget"]:
            print(
                f"note: budget {args.cpu_hours} CPU-h given; the plan was made for {plan['cpu_hours_budget']}"
            )
        if (args.resize, list(args.extra)) != (plan["resize"], plan["extra"]):
            print(
                f"note: continuing with the plan's settings: --resize {plan['resize']}, extra {plan['extra']}"
            )
        args.resize, args.extra = plan["resize"], list(plan["extra"])
    # A row left by a segment whose supervisor died (no final row): its CPU stays counted.
    ledger = [dict(r, in_progress=False, supervisor_died=True) if r.get("in_progress") else r for r in ledger]
    used = sum(r["cpu_s"] for r in ledger)

    steps, save_freq, log_freq = plan["steps"], plan["save_freq"], plan["log_freq"]
    done = ckpt_step(out / LAST) if (out / LAST).exists() else None
    if done is not None and done >= steps:
        print(f"{run}: finished ({done}/{steps} steps); run total {used / 3600:.3f} CPU-h")
        return finish(run, args, vers, plan, ledger)
    if (ledger and ledger[-1].get("stopped_at_budget")) or used >= budget_s:
        print(f"{run}: CPU budget spent ({used / 3600:.3f} CPU-h) at step {done}; nothing to do")
        return finish(run, args, vers, plan, ledger)
    if done is not None:
        largs = resume_args(out, steps, save_freq, log_freq)
    else:
        if out.exists():  # a segment died before its first checkpoint: start over (its CPU stays counted)
            failed = run / f"{OUT}.failed-{datetime.datetime.now():%Y%m%d-%H%M%S}"
            out.rename(failed)
            print(f"no checkpoint in {out}: moved to {failed}, starting again")
        largs = fresh_args(args, out, steps, save_freq, log_freq)

    def tick(started: str, wall_s: float, cpu_s: float) -> None:
        write_json(run / LEDGER, [*ledger, {"started": started, "rc": None, "wall_s": round(wall_s, 1),
                                            "cpu_s": round(cpu_s, 1), "in_progress": True,
                                            "argv": base + largs}])  # fmt: skip

    seg = Segment(base + largs, run / LOG, budget_s=budget_s - used, out=out, prune=not args.keep_checkpoints,
                  on_tick=tick)  # fmt: skip
    row = seg.run()
    row["step_reached"] = ckpt_step(out / LAST) if (out / LAST).exists() else None
    ledger.append(row)
    write_json(run / LEDGER, ledger)
    total = sum(r["cpu_s"] for r in ledger)
    print(f"segment: {row['cpu_s'] / 3600:.3f} CPU-h in {row['wall_s'] / 3600:.2f} h, rc {row['rc']}; "
          f"run total {total / 3600:.3f} CPU-h, checkpoint at step {row['step_reached']}/{steps}")  # fmt: skip
    finish(run, args, vers, plan, ledger)
    if row["rc"] != 0 and not row["stopped_at_budget"]:
        sys.exit(row["rc"] or 1)


def train_finished(run: str | Path) -> bool:
    """The run of ``train`` in ``run`` has nothing left to do: its planned steps reached, or its
    CPU budget spent (then its last checkpoint is the policy)."""
    run = Path(run)
    plan, ledger = read_json(run / PLAN), read_json(run / LEDGER, [])
    if plan is None:
        return False
    done = ckpt_step(run / OUT / LAST) if (run / OUT / LAST).exists() else None
    used = sum(r["cpu_s"] for r in ledger)
    spent = bool(ledger and ledger[-1].get("stopped_at_budget")) or used >= plan["cpu_hours_budget"] * 3600
    return (done is not None and done >= plan["steps"]) or (spent and done is not None)


def finish(run: Path, args: argparse.Namespace, vers: dict, plan: dict, ledger: list[dict]) -> None:
    """run.json: what was run, with which versions and settings; and the record command."""
    out = run / OUT
    cfg_file = out / LAST / "pretrained_model" / "train_config.json"
    total_h = sum(r["cpu_s"] for r in ledger) / 3600
    non_default = {k: {"value": v, "why": why} for k, (v, why) in NON_DEFAULT.items()}
    non_default["steps"]["value"] = plan["steps"]
    non_default["save_freq"]["value"] = plan["save_freq"]
    if plan.get("resize"):
        non_default["policy.resize_shape"] = {
            "value": [plan["resize"]] * 2,
            "why": "opt-in (--resize): default None feeds 480 px frames to ResNet18; vlastack's policy sees 128 px",
        }
    if task_onehot(plan["data"]):
        non_default["policy.input_features"] = {
            "value": "observation.image + observation.state + observation.environment_state (the task as a one-hot)",
            "why": "the task identity vlastack's policy reads from its prompt, through the environment-state input "
            "LeRobot's ACT and Diffusion Policy have (vla data task-onehot; the simulator's state is not in that "
            "dataset); scripts/lerobot_policy_server.py --task-onehot sends it from the prompt",
        }
    for e in plan.get("extra", []):
        non_default[e.split("=", 1)[0].lstrip("-")] = {"value": e.split("=", 1)[-1], "why": "given after --"}
    info = {
        "policy": plan["policy"],
        "data": plan["data"],
        "plan": plan,
        "cpu_hours": total_h,
        "cpu_hours_budget": plan["cpu_hours_budget"],
        "step_reached": ckpt_step(out / LAST) if (out / LAST).exists() else None,
        "checkpoint": str((out / LAST / "pretrained_model").resolve()) if (out / LAST).exists() else None,
        "versions": vers,
        "train_module": TRAIN_MODULE,
        "offline_env": OFFLINE_ENV,
        "commands": [shlex.join(r["argv"]) for r in ledger],
        "probe": {k: v for k, v in (read_json(run / PROBE) or {}).items() if k != "machine"},
        "non_default": non_default,
        "lerobot_train_config": read_json(cfg_file),
        "segments": [
            # .get: a segment whose supervisor died left a row without the last two
            {
                k: r.get(k)
                for k in ("started", "wall_s", "cpu_s", "rc", "stopped_at_budget", "supervisor_died")
            }
            for r in ledger
        ],
        "machine": machine(),
    }
    write_json(run / RUN_INFO, info)
    name = f"lerobot_{plan['policy']}"
    suite = "mt50" if "mt50" in plan["data"].lower() else "mt10"
    print(f"wrote {run / RUN_INFO}; after eval record with:\n  .venv/bin/python bench/metaworld.py record "
          f"--suite {suite} --policy {name} --eval-json {run / 'eval' / 'eval.json'} --cpu-hours {total_h:.4f}")  # fmt: skip


# --------------------------------------------------------------------------------------------- main


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def main(argv: list[str] | None = None) -> None:
    ours, extra = split_extra(list(sys.argv[1:] if argv is None else argv))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lerobot-python", default=LEROBOT_PYTHON, help="python of the LeRobot 0.6.1 venv")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="lerobot-train within a CPU budget (resumable)")
    t.add_argument("--policy", choices=sorted(REQUIRED), required=True)
    t.add_argument("--data", required=True, help="the LeRobot v3 dataset folder (meta/info.json)")
    t.add_argument("--repo-id", default="local/mt10", help="--dataset.repo_id (a name only: offline)")
    t.add_argument("--run", required=True)
    t.add_argument(
        "--cpu-hours", type=float, required=True, help="budget: CPU-hours of the training process tree"
    )
    t.add_argument("--steps", type=int, default=None, help="total steps; default: as many as fit (probe)")
    t.add_argument("--probe-steps", type=int, default=40)
    t.add_argument("--margin", type=float, default=0.05, help="share of the budget the plan leaves unused")
    t.add_argument("--checkpoints", type=int, default=8, help="periodic checkpoints over the run")
    t.add_argument(
        "--keep-checkpoints", action="store_true", help="keep every checkpoint (default: the last)"
    )
    t.add_argument("--resize", type=int, default=None, help="Diffusion only: policy.resize_shape=[R,R]")
    v = sub.add_parser("eval", help="lerobot-eval on the run's last checkpoint -> eval/eval.json")
    v.add_argument("--run", required=True)
    v.add_argument("--checkpoint", default=None, help="a pretrained_model folder (default: the run's last)")
    v.add_argument(
        "--tasks",
        default="MT10",
        help="Meta-World: MT10, MT50, LeRobot's groups or task names, comma-separated; LIBERO: a suite "
        "(libero_object) or its tasks as SUITE/ID",
    )
    v.add_argument("--env", choices=("metaworld", "libero"), default="metaworld", help="lerobot-eval's env")
    v.add_argument(
        "--image-size", type=int, default=None, help="LIBERO: render at this size (LeRobot's default 360)"
    )
    v.add_argument("--episodes-per-task", type=int, default=50)
    v.add_argument("--seed", type=int, default=1000)
    v.add_argument("--batch-size", type=int, default=1, help="--eval.batch_size (envs per task)")
    v.add_argument("--out", default=None, help="default RUN/eval")
    v.add_argument(
        "--chunk-tasks",
        type=int,
        default=0,
        help="run lerobot-eval on this many tasks at a time, keeping finished chunks (resumable); 0 = all at once",
    )
    v.add_argument("--parallel", type=int, default=1, help="chunks evaluated side by side (one core each)")
    c = sub.add_parser("convert", help="an existing eval_info.json -> our eval.json")
    c.add_argument("--eval-info", required=True)
    c.add_argument("--tasks", default="MT10")
    c.add_argument("--env", choices=("metaworld", "libero"), default="metaworld")
    c.add_argument("--episodes-per-task", type=int, required=True)
    c.add_argument("--seed", type=int, default=1000)
    c.add_argument("--out", required=True)
    args = ap.parse_args(ours)
    args.extra = extra
    if args.cmd == "train" and args.resize and args.policy != "diffusion":
        ap.error("--resize: only Diffusion Policy has a resize field (ACT has none)")
    {"train": cmd_train, "eval": cmd_eval, "convert": cmd_convert}[args.cmd](args)


if __name__ == "__main__":
    main()
