"""``vla``: the one command-line entry point.

Each area's subcommands live in the commands layer (``vlastack/commands/<area>.py``, each with
``register(sub, groups)``); this file only wires them together. ``groups["data"]`` is the ``vla data ...`` sub-parser, shared by the data and
simulation layers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Modules that add subcommands. Imported lazily so `vla --help` stays fast.
MODULES = (
    "vlastack.commands.models",
    "vlastack.commands.data",
    "vlastack.commands.sim",
    "vlastack.commands.train",
    "vlastack.commands.rl",
    "vlastack.commands.infer",
    "vlastack.commands.imports",
    "vlastack.commands.diagnostics",
    "vlastack.commands.labs",
    "vlastack.commands.apps",
)


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
    if sys.version_info < (3, 11):  # noqa: UP036 - a checkout run by another python skips pip's check
        v = sys.version_info
        print(f"error: vlastack needs Python 3.11 or newer; this is {v[0]}.{v[1]} ({sys.executable})",
              file=sys.stderr)  # fmt: skip
        return 2
    parser = build_parser()
    parser.add_argument(
        "--traceback", action="store_true", help="show the full traceback of an error (or VLA_DEBUG=1)"
    )
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except (Exception, KeyboardInterrupt) as e:
        # Known errors (bad or missing files, invalid values, a full disk, ...) become one line;
        # anything else is a bug and keeps its traceback.
        from vlastack.errors import explain

        known = explain(e)
        if known is None or args.traceback or os.environ.get("VLA_DEBUG", "") not in ("", "0"):
            raise
        print(f"error: {known[0]}", file=sys.stderr)
        if argv is None:  # the process is about to exit (not a caller of main())
            # Objects half-built by the failed command (a MuJoCo renderer without a GL context)
            # complain while collected at exit: the line above already said what went wrong.
            sys.unraisablehook = lambda unraisable: None
        return known[1]
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
