"""Arguments shared by the config-taking subcommands (``vla train``, ``vla info``, ``vla eval`` ...).

Kept apart from ``vlastack/cli.py`` so that the command modules, which ``cli.py`` imports, do not
import ``cli.py`` back.
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


def int_at_least(low: int, high: int | None = None):
    """An argparse ``type`` for an integer in [low, high]: a value outside is refused where it is
    parsed, with the allowed range in the message (exit 2)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < low or (high is not None and v > high):
            rng = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be {rng}, got {v}")
        return v

    parse.__name__ = "integer"
    return parse


def float_at_least(low: float):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not v >= low:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return v

    parse.__name__ = "number"
    return parse


def config_from_args(args: argparse.Namespace) -> Config:
    return load_config(args.preset, args.config, args.overrides)
