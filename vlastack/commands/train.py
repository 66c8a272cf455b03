"""Subcommands of the training layer: ``vla train`` (see vlastack/cli.py; ``vla demo`` is in vlastack/apps)."""

from __future__ import annotations

import argparse


def register(sub, groups) -> None:
    from vlastack.commands.common import add_config_args

    t = sub.add_parser(
        "train",
        help="train a policy (single process, or DDP/FSDP2 under torchrun)",
        description="Train on a LeRobot v3 dataset. Under torchrun set train.parallel=ddp|fsdp.",
    )
    t.add_argument("--data", default=None, help="dataset folder (default: data.path)")
    t.add_argument("--out", default=None, help="run folder (default: train.out_dir)")
    t.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the run already in --out (its checkpoints) and start over",
    )
    t.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    add_config_args(t)
    t.set_defaults(func=_train)


def sim_evaluator(policy_dir, cfg, out_dir) -> dict:
    """In-training evaluation for ``train.eval_every``: the simulator's closed loop on ``cfg.eval``."""
    from vlastack.sim.evaluate import evaluate

    return evaluate(str(policy_dir), cfg.eval, out_dir=out_dir, cameras=cfg.model.camera_names)


def _train(args: argparse.Namespace) -> int:
    from vlastack.commands.common import config_from_args
    from vlastack.diagnostics.numerics import anomaly_stop
    from vlastack.train.trainer import Trainer

    cfg = config_from_args(args)
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite deletes it: pass one of them")
    trainer = Trainer(
        cfg,
        data_path=args.data,
        run_dir=args.out,
        resume=args.resume,
        device=args.device,
        overwrite=args.overwrite,
        evaluator=sim_evaluator if cfg.train.eval_every > 0 else None,
        on_anomaly=anomaly_stop if cfg.train.anomaly_guard else None,
    )
    summary = trainer.fit()
    if trainer.is_main:
        from vlastack.diagnostics.run_report import run_report

        report = run_report(trainer.run_dir)
        print(f"done: {summary['steps']} steps in {summary['train_s']:.0f}s; policy at {summary['final']}")
        print(f"report: {report}")
    from vlastack.train.parallel import shutdown_distributed

    shutdown_distributed()
    return 0
