"""Subcommands of the training layer: ``vla train`` and ``vla demo`` (see vlastack/cli.py)."""

from __future__ import annotations

import argparse


def register(sub, groups) -> None:
    from vlastack.cli_common import add_config_args

    t = sub.add_parser(
        "train",
        help="train a policy (single process, or DDP/FSDP2 under torchrun)",
        description="Train on a LeRobot v3 dataset. Under torchrun set train.parallel=ddp|fsdp.",
    )
    t.add_argument("--data", default=None, help="dataset folder (default: data.path)")
    t.add_argument("--out", default=None, help="run folder (default: train.out_dir)")
    t.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    t.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    add_config_args(t)
    t.set_defaults(func=_train)

    d = sub.add_parser(
        "demo",
        help="generate demos, train tiny, evaluate closed loop, write a report (~15 min on 2 CPU cores)",
    )
    d.add_argument("--out", default="runs/demo", help="folder for the dataset, run and report")
    d.add_argument("--episodes", type=int, default=None, help="demonstrations to generate")
    d.add_argument("--eval-episodes", type=int, default=None, help="closed-loop evaluation episodes")
    d.add_argument("--quick", action="store_true", help="a 1-2 minute smoke version (low success)")
    d.add_argument("--no-ablations", action="store_true", help="skip the blanked-image/instruction evals")
    add_config_args(d)
    d.set_defaults(func=_demo)


def _train(args: argparse.Namespace) -> int:
    from vlastack.cli_common import config_from_args
    from vlastack.train.trainer import Trainer

    cfg = config_from_args(args)
    trainer = Trainer(cfg, data_path=args.data, run_dir=args.out, resume=args.resume, device=args.device)
    summary = trainer.fit()
    if trainer.is_main:
        print(f"done: {summary['steps']} steps in {summary['train_s']:.0f}s; policy at {summary['final']}")
    from vlastack.train.parallel import shutdown_distributed

    shutdown_distributed()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from vlastack.train.demo import run_demo

    report = run_demo(
        out=args.out,
        preset=args.preset,
        config=args.config,
        overrides=args.overrides,
        episodes=args.episodes,
        eval_episodes=args.eval_episodes,
        quick=args.quick,
        ablations=not args.no_ablations,
    )
    print(f"report: {report}")
    return 0
