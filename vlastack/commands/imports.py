"""``vla import`` (a LeRobot / openpi pi0 or pi05, or a LeRobot pi0_fast checkpoint -> a vlastack
policy folder) and ``vla export-lerobot`` (a vlastack pi0 / pi05 or imported pi0_fast policy folder
-> a LeRobot ``pretrained_model`` folder)."""

from __future__ import annotations

import argparse

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "keep": None}


def _import(args: argparse.Namespace) -> int:
    import torch

    from vlastack.infer.importer import import_checkpoint

    dtype = _DTYPES[args.dtype]
    out = import_checkpoint(
        args.path,
        args.out,
        overrides=args.set,
        strict=not args.no_strict,
        dtype=None if dtype is None else getattr(torch, dtype),
        asset_id=args.asset_id,
    )
    print(f"wrote {out} (serve it: vla serve --policy {out})")
    return 0


def _export(args: argparse.Namespace) -> int:
    from vlastack.infer.export_lerobot import export_lerobot

    out = export_lerobot(args.policy, args.out)
    print(
        f"wrote {out} (LeRobot: PI0Policy/PI05Policy/PI0FastPolicy.from_pretrained, make_pre_post_processors)"
    )
    return 0


def register(sub, groups) -> None:
    p = sub.add_parser(
        "import",
        help="convert a LeRobot/openpi pi0 or pi05, or a LeRobot pi0_fast checkpoint (folder or Hub id in the local cache)",
    )
    p.add_argument(
        "path",
        help="checkpoint folder, its parent with pretrained_model/, or a Hub id already in the local "
        "Hugging Face cache (e.g. lerobot/pi05_base; nothing is downloaded)",
    )
    p.add_argument("--out", required=True, help="output vlastack policy folder")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="what the tensors cannot tell, e.g. --set model.vision.heads=16 (repeatable)",
    )
    p.add_argument("--dtype", default="fp32", choices=sorted(_DTYPES), help="weights dtype (default fp32)")
    p.add_argument("--asset-id", default=None, help="openpi: which assets/<id>/norm_stats.json")
    p.add_argument(
        "--no-strict",
        action="store_true",
        help="load what matches and print what was left out (default: any mismatch is an error)",
    )
    p.set_defaults(func=_import)

    p = sub.add_parser(
        "export-lerobot",
        help="write a vlastack pi0/pi05 (or imported pi0_fast) policy folder as a LeRobot folder",
    )
    p.add_argument("policy", help="vlastack policy folder (e.g. from vla import, or a training run's final/)")
    p.add_argument("--out", required=True, help="output LeRobot pretrained_model folder")
    p.set_defaults(func=_export)
