"""``vla lab list | run NAME... | all``: run the labs (see vlastack/labs/__init__.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _list(args: argparse.Namespace) -> int:
    from vlastack.labs import LAB_NAMES, load_lab
    from vlastack.labs.report import claim_line, claims_map

    if args.claims:
        for cid, row in claims_map().items():
            target = ", ".join(row["checks"]) or f"no lab, because {row.get('no_lab', '(missing!)')}"
            print(f"{claim_line(cid)}\n    -> {target}")
        return 0
    for name in LAB_NAMES:
        lab = load_lab(name)
        gpu = sum(c.requires is not None and c.requires.startswith("cuda") for c in lab.checks)
        slow = " (slow)" if lab.slow or any(c.slow for c in lab.checks) else ""
        print(f"{name:<18} {len(lab.checks):>2} checks{slow}, {gpu} need CUDA | {lab.title}")
        print(f"{'':<18} claims: {' '.join(lab.claims)}")
    return 0


def _run(names: list[str], args: argparse.Namespace) -> int:
    from vlastack.labs._core import Ctx
    from vlastack.labs.report import run_labs, to_markdown

    payload = run_labs(names, Ctx(quick=args.quick))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(to_markdown(payload))
        print(f"wrote {args.markdown}")
    return 1 if payload["totals"]["FAIL"] else 0


def _outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    p.add_argument("--json", default=None, help="write the results as JSON (e.g. bench/results/labs.json)")
    p.add_argument(
        "--markdown", default=None, help="write the results as Markdown (e.g. docs/research/labs.md)"
    )


def register(sub, groups) -> None:
    lab = sub.add_parser("lab", help="labs: check the notes' PyTorch claims on this machine")
    lsub = lab.add_subparsers(dest="lab_command", metavar="LAB_COMMAND")
    lab.set_defaults(func=lambda a: lab.print_help() or 2)
    p = lsub.add_parser("list", help="the labs and the claims they check")
    p.add_argument("--claims", action="store_true", help="every claim row -> its checks (or why none)")
    p.set_defaults(func=_list)
    p = lsub.add_parser("run", help="run some labs (exit code 1 if a check fails)")
    p.add_argument("names", nargs="+", help="lab names (`vla lab list`)")
    _outputs(p)
    p.set_defaults(func=lambda a: _run(a.names, a))
    p = lsub.add_parser("all", help="run every lab (exit code 1 if a check fails)")
    _outputs(p)

    def _all(a: argparse.Namespace) -> int:
        from vlastack.labs import LAB_NAMES

        return _run(list(LAB_NAMES), a)

    p.set_defaults(func=_all)
