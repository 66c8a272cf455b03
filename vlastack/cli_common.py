"""Arguments shared by the config-taking subcommands (``vla train``, ``vla info``, ``vla eval`` ...).

Kept apart from ``vlastack/cli.py`` so that the layers' ``*/cli.py`` modules, which ``cli.py``
imports, do not import ``cli.py`` back.
"""

from __future__ import annotations

import argparse

from vlastack.config import Config, load_config


def add_config_args(p: argparse.ArgumentParser) -> None:
    """The config arguments every config-taking command shares: preset, YAML, dotted overrides."""
    p.add_argument("--preset", default="tiny", help="tiny | small | pi0 | pi05 (default: tiny)")
    p.add_argument(
        "--config",
        default=None,
        help="YAML file (or a packaged one by name, e.g. demo) applied on top of the preset",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.expert.depth=6 train.lr=1e-4")


def config_from_args(args: argparse.Namespace) -> Config:
    return load_config(args.preset, args.config, args.overrides)
