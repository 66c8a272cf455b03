"""Subcommands of this layer: ``vla doctor`` and ``vla plan`` (see vlastack/cli.py)."""

from __future__ import annotations

import argparse
import json


def register(sub, groups) -> None:
    from vlastack.commands.common import add_config_args

    d = sub.add_parser(
        "doctor",
        help="profile a short real training run: where the time and memory go, and what to change "
        "(--run: read a vla rl run instead)",
        description="Runs a few real training steps of the config under torch.profiler and writes "
        "report.json, report.html and trace.json (Perfetto). With --run, reads a vla rl run folder "
        "instead. See docs/doctor.md.",
    )
    d.add_argument(
        "--data", default=None, help="dataset folder (default: data.path; none: synthetic batches)"
    )
    d.add_argument("--steps", type=int, default=8, help="timed steps (default 8)")
    d.add_argument(
        "--warmup", type=int, default=2, help="warm-up steps, under the memory tracker (default 2)"
    )
    d.add_argument("--profile-steps", type=int, default=3, help="steps under the profiler (default 3)")
    d.add_argument("--infer", action="store_true", help="also time and profile sample_actions")
    d.add_argument("--numerics", action="store_true", help="per-module activation/gradient stats, bf16 drift")
    d.add_argument("--try", dest="try_recs", action="store_true", help="re-run with each applicable fix")
    d.add_argument("--out", default="runs/doctor", help="report folder (default runs/doctor)")
    d.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    d.add_argument(
        "--run",
        default=None,
        help="read a vla rl run folder instead: is it learning, is there a signal, do the updates move "
        "the policy, where the time goes, what to change (writes RUN/doctor.json)",
    )
    add_config_args(d)
    d.set_defaults(func=_doctor)

    p = sub.add_parser(
        "plan",
        help="predict peak training/inference memory without allocating; what fits a memory budget",
        description="Runs the real training step on fake tensors (no memory allocated) for the config "
        "and single changes (bf16, 8-bit AdamW, checkpointing, LoRA, FSDP). See docs/doctor.md. "
        "With --nodes/--gpus-per-node it plans a cluster instead: the per-rank peak (train.batch_size "
        "per rank) under DDP (a full replica plus its gradient buckets), FSDP2 over all N*G ranks and "
        "HSDP (sharded over the G GPUs of a node, replicated across nodes), each as configured, with "
        "8-bit AdamW, activation checkpointing, LoRA and all of them; which fit --gpu-memory, and the "
        "cheapest that does (DDP before HSDP before FSDP). Derived from one fake-tensor simulation per "
        "model variant (the full pi0/pi0.5 shapes take minutes on a small CPU); checked within 10% "
        "of measured per-rank peaks on CPU/gloo (bench/plan_dist.py).",
    )
    p.add_argument(
        "--memory", "--gpu-memory", dest="memory", default=None,
        help="budget per device (per GPU), e.g. 80GiB, 24GB, 512MiB",
    )  # fmt: skip
    p.add_argument(
        "--nodes", type=int, default=None, help="plan a cluster of this many nodes (default 1; see above)"
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="GPUs (ranks) per node of the cluster plan (default 1)",
    )
    p.add_argument("--batch-sizes", default="", help="also predict these batch sizes, e.g. 1,8,32")
    p.add_argument("--no-infer", action="store_true", help="skip the inference prediction")
    p.add_argument(
        "--no-rss", action="store_true", help="skip the CPU process RSS prediction (it starts an interpreter)"
    )
    p.add_argument(
        "--data", default=None, help="dataset: sizes a preloaded dataset (train.preload) in the RSS"
    )
    p.add_argument("--json", default=None, help="also write the plan as JSON here")
    p.add_argument(
        "--target",
        choices=("cpu", "cuda"),
        default=None,
        help="the device the training will run on: its optimizer kernels (fused AdamW on cuda, foreach "
        "on cpu) differ in temporaries (default: cuda when this machine has one, else cpu)",
    )
    add_config_args(p)
    p.set_defaults(func=_plan)


def _doctor(args: argparse.Namespace) -> int:
    if args.run:
        from pathlib import Path

        from vlastack.diagnostics.rl_doctor import diagnose, format_report

        report = diagnose(args.run)
        print(format_report(report))
        Path(args.run, "doctor.json").write_text(json.dumps(report, indent=1) + "\n")
        return 0
    from vlastack.commands.common import config_from_args
    from vlastack.diagnostics.doctor import DoctorOptions, run_doctor

    cfg = config_from_args(args)
    if min(args.steps, args.warmup, args.profile_steps) < 1:
        raise ValueError("--steps, --warmup and --profile-steps must be >= 1")
    opts = DoctorOptions(
        steps=args.steps,
        warmup=args.warmup,
        profile_steps=args.profile_steps,
        infer=args.infer,
        numerics=args.numerics,
        try_recs=args.try_recs,
        device=args.device,
    )
    run_doctor(cfg, args.out, opts, data=args.data or cfg.data.path or None)
    print(f"report: {args.out}/report.html, {args.out}/report.json, trace: {args.out}/trace.json")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from vlastack.commands.common import config_from_args
    from vlastack.diagnostics.memory import parse_bytes
    from vlastack.diagnostics.plan import format_plan, plan

    cfg = config_from_args(args)
    budget = parse_bytes(args.memory) if args.memory else None
    try:
        sizes = tuple(int(x) for x in args.batch_sizes.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--batch-sizes: expected integers like 1,8,32, got {args.batch_sizes!r}") from None
    data = args.data or cfg.data.path or None
    import torch

    if args.nodes is not None or args.gpus_per_node is not None:
        from vlastack.diagnostics.plan_dist import check_cluster, format_cluster, plan_cluster

        nodes = 1 if args.nodes is None else args.nodes
        gpus = 1 if args.gpus_per_node is None else args.gpus_per_node
        check_cluster(nodes, gpus)  # a clear error before any simulation
        result = plan_cluster(cfg, nodes, gpus, budget, target=args.target or "cuda")  # a GPU cluster
        print(format_cluster(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        return 0 if budget is None or result["cheapest"] else 1
    target = args.target or ("cuda" if torch.cuda.is_available() else "cpu")
    rss = not args.no_rss and target == "cpu"  # the RSS prediction is for CPU training
    result = plan(cfg, budget, sizes, infer=not args.no_infer, rss=rss, data=data, target=target)
    print(format_plan(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if budget is None or result["fits"] or result.get("fix") else 1
