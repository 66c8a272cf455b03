"""``vla rl``: fine-tune a trained policy by on-policy RL in simulation (vlastack/rl/, docs/rl.md)."""

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
