"""``vla``: the one command-line entry point.

Each layer owns its subcommands in its own ``cli.py`` with ``register(sub, groups)``; this file only
wires them together. ``groups["data"]`` is the ``vla data ...`` sub-parser, shared by the data and
simulation layers.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that add subcommands. Imported lazily so `vla --help` stays fast.
MODULES = (
    "vlastack.models.cli",
    "vlastack.data.cli",
    "vlastack.sim.cli",
    "vlastack.train.cli",
    "vlastack.infer.cli",
    "vlastack.diagnostics.cli",
    "vlastack.apps.cli",
)


def add_config_args(p: argparse.ArgumentParser) -> None:
    """The config arguments every config-taking command shares: preset, YAML, dotted overrides."""
    p.add_argument("--preset", default="tiny", help="tiny | small | pi0 (default: tiny)")
    p.add_argument(
        "--config",
        default=None,
        help="YAML file (or a packaged one by name, e.g. demo) applied on top of the preset",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.expert.depth=6 train.lr=1e-4")


def config_from_args(args: argparse.Namespace):
    from vlastack.config import load_config

    return load_config(args.preset, args.config, args.overrides)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vla", description="vlastack: train, evaluate, serve and deploy VLAs"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    data = sub.add_parser("data", help="datasets: info, view, convert, generate")
    groups = {"data": data.add_subparsers(dest="data_command", metavar="DATA_COMMAND")}
    data.set_defaults(func=lambda a: data.print_help() or 2)
    for name in MODULES:
        importlib.import_module(name).register(sub, groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except ValueError as e:  # user mistakes: print the message, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
