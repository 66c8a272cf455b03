"""Subcommands of this layer (see vlastack/cli.py)."""

from __future__ import annotations


def register(sub, groups) -> None:
    pass
