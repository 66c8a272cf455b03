"""Subcommands of the applications: ``vla demo`` (see vlastack/cli.py)."""

from __future__ import annotations

import argparse


def register(sub, groups) -> None:
    from vlastack.commands.common import add_config_args

    d = sub.add_parser(
        "demo",
        help="generate demos, train tiny, evaluate closed loop, write a report (~15 min on 2 CPU cores)",
    )
    d.add_argument("--out", default="runs/demo", help="folder for the dataset, run and report")
    d.add_argument("--episodes", type=int, default=None, help="demonstrations to generate")
    d.add_argument("--eval-episodes", type=int, default=None, help="closed-loop evaluation episodes")
    d.add_argument("--quick", action="store_true", help="a 1-2 minute smoke version (low success)")
    d.add_argument("--no-ablations", action="store_true", help="skip the blanked-image/instruction evals")
    d.add_argument(
        "--minutes", type=float, default=0.0,
        help="wall-time budget: a CPU too slow for the recipe's steps to end within it trains fewer "
        "(lower success); default 0: the recipe's steps, with the time they take said at the start",
    )  # fmt: skip
    add_config_args(d)
    d.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from vlastack.apps.demo import run_demo

    report = run_demo(
        out=args.out,
        preset=args.preset,
        config=args.config,
        overrides=args.overrides,
        episodes=args.episodes,
        eval_episodes=args.eval_episodes,
        quick=args.quick,
        ablations=not args.no_ablations,
        minutes=args.minutes,
    )
    print(f"report: {report / 'report.html'}")
    return 0
