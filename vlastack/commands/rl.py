"""``vla rl``: fine-tune a trained policy by on-policy RL in simulation; ``vla recap``: RECAP advantage
conditioning, its offline alternative (vlastack/rl/, docs/rl.md)."""

from __future__ import annotations

import argparse


def register(sub, groups) -> None:
    r = sub.add_parser(
        "rl",
        help="fine-tune a trained policy (token or flow head) by GRPO in simulation",
        description="GRPO on a token head's action tokens or a flow head's noisy denoising steps, rewards from the simulator's task success. "
        "Settings: rl.* (iterations, groups, group_size, temperature, lr, ...) and eval.* (suite, "
        "tasks, steps_per_chunk) on top of the policy's own config.yaml.",
    )
    r.add_argument("--policy", required=True, help="a vlastack policy folder (a run's final/)")
    r.add_argument("--out", required=True, help="run folder")
    r.add_argument("--ema", action="store_true", help="start from the policy's ema/ weights")
    r.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    r.add_argument("--overwrite", action="store_true", help="delete the run already in --out first")
    r.add_argument("--config", default=None, help="YAML applied on top of the policy's config.yaml")
    r.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rl.iterations=40 rl.tasks=[push]")
    r.set_defaults(func=_rl)
    register_recap(sub, groups)


def _rl(args: argparse.Namespace) -> int:
    from vlastack.rl.runner import RLRun, rl_config

    cfg = rl_config(args.policy, args.overrides, args.config)
    run = RLRun(args.policy, cfg, args.out, ema=args.ema, resume=args.resume, overwrite=args.overwrite)
    summary = run.fit()
    last = summary["last"]
    print(
        f"done: {summary['iterations']} iterations; policy at {summary['final']}; report: {summary['report']}"
    )
    if last:
        print(
            f"last iteration: rollout success {last['success']:.2f}, {last['cpu_s'] / 3600:.2f} CPU-h in all"
        )
    return 0


def register_recap(sub, groups) -> None:
    r = sub.add_parser(
        "recap",
        help="RECAP advantage conditioning: roll a policy out, label every frame by a value, train on both",
        description="pi*0.6's RECAP as the ordinary trainer runs it (vlastack/rl/recap.py, docs/rl.md): "
        "`collect` writes the policy's rollouts (failures included) as a dataset; `label` fits a value "
        "on rollouts and demonstrations and merges them with each frame's advantage indicator; then "
        "`vla train ... model.advantage_conditioning=true` fine-tunes on the result.",
    )
    s = r.add_subparsers(dest="recap_cmd", required=True)
    c = s.add_parser("collect", help="roll the policy out and keep every episode as a LeRobot v3 dataset")
    c.add_argument("--policy", required=True, help="a vlastack policy folder (a run's final/)")
    c.add_argument("--out", required=True, help="dataset folder to write")
    c.add_argument("--episodes-per-task", type=int, required=True)
    c.add_argument("--tasks", nargs="*", default=(), help="default: the policy config's eval tasks")
    c.add_argument("--seed", type=int, default=None, help="first env seed (default 4,000,000)")
    c.add_argument("--ema", action="store_true", help="roll out the policy's ema/ weights")
    c.add_argument("--batch-episodes", type=int, default=16, help="episodes side by side")
    c.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    c.add_argument("--env-workers", type=int, default=0, help="worker processes (or Ray actors) for the envs")
    c.add_argument(
        "--ray-address", default="", help="run the env workers as Ray actors there (local, auto, HOST:PORT)"
    )
    c.add_argument("--overwrite", action="store_true")
    c.set_defaults(func=_collect)
    lb = s.add_parser("label", help="fit the value and write the merged dataset with advantage indicators")
    lb.add_argument("--policy", required=True, help="the policy whose frozen features the value reads")
    lb.add_argument(
        "--data", action="append", required=True, help="a dataset to label (repeat: demos, rollouts)"
    )
    lb.add_argument(
        "--positive-data",
        action="append",
        default=[],
        help="a dataset positive throughout (pi*0.6's corrections; e.g. expert demos), first in the merge",
    )
    lb.add_argument("--out", required=True, help="dataset folder to write")
    lb.add_argument("--ema", action="store_true")
    lb.add_argument("--gamma", type=float, default=0.95, help="discount of the success reward per step")
    lb.add_argument("--positive-fraction", type=float, default=0.3, help="frames labelled positive, per task")
    lb.add_argument("--folds", type=int, default=2, help="cross-fitting folds (by episode)")
    lb.add_argument("--seed", type=int, default=0)
    lb.add_argument("--threads", type=int, default=0)
    lb.add_argument("--overwrite", action="store_true")
    lb.set_defaults(func=_label)


def _collect(args: argparse.Namespace) -> int:
    from vlastack.rl.recap import COLLECT_SEED, collect

    rates = collect(args.policy, args.out, args.episodes_per_task, tuple(args.tasks),
                    COLLECT_SEED if args.seed is None else args.seed, args.ema, args.batch_episodes,
                    args.threads, args.overwrite, env_workers=args.env_workers,
                    ray_address=args.ray_address)  # fmt: skip
    print(f"wrote {args.out}: success " + ", ".join(f"{t} {r:.0%}" for t, r in rates.items()))
    return 0


def _label(args: argparse.Namespace) -> int:
    from vlastack.rl.recap import label

    r = label(args.policy, args.data, args.out, args.ema, args.gamma, args.positive_fraction, args.folds,
              args.seed, args.threads, args.overwrite, positive_data=args.positive_data)  # fmt: skip
    print(f"wrote {args.out}: {r['frames']} frames, {r['positive']:.0%} positive; value BCE held out "
          f"{r['bce_heldout']:.3f} (a constant: {r['bce_constant']:.3f})")  # fmt: skip
    return 0
