"""Subcommands of the simulation layer: ``vla data generate`` and ``vla eval``."""

from __future__ import annotations

import argparse


def register(sub, groups) -> None:
    from vlastack.commands.common import add_config_args, float_at_least, int_at_least

    g = groups["data"].add_parser("generate", help="scripted-expert demos -> LeRobot v3 dataset")
    g.add_argument("--suite", default="builtin", help="builtin | dynamic | fragile | metaworld")
    g.add_argument(
        "--tasks", default="", help="comma-separated task names; Meta-World also MT10, MT50, easy..very_hard"
    )
    n = g.add_mutually_exclusive_group(required=True)
    n.add_argument(
        "--episodes", type=int_at_least(1), help="successful episodes in all, round-robin over tasks"
    )
    n.add_argument(
        "--episodes-per-task",
        type=int_at_least(1),
        help="successful episodes of every task, task by task, seeds SEED+j per task (LeRobot's layout)",
    )
    g.add_argument("--out", required=True, help="dataset folder to create")
    g.add_argument("--workers", type=int, default=2, help="rollout processes (0 = in-process)")
    g.add_argument(
        "--ray-address",
        default="",
        help="roll out on a Ray cluster instead: auto | HOST:PORT | ray://HOST:10001 | local "
        "(needs pip install 'vlastack[ray]'; the same dataset as local workers)",
    )
    g.add_argument(
        "--image-size",
        type=int_at_least(8),
        default=None,
        help="rendered size (default: builtin 64, Meta-World 480)",
    )
    g.add_argument("--cameras", default=None, help="default: builtin scene,wrist; Meta-World image (corner2)")
    g.add_argument("--noise", type=float, default=0.0, help="std of Gaussian noise on executed dx,dy,dz")
    g.add_argument(
        "--seed", type=int_at_least(0), default=0, help="first env seed (attempt k: SEED+k; per task: SEED+j)"
    )
    g.add_argument("--overwrite", action="store_true")
    g.add_argument(
        "--render-quality",
        choices=["lerobot", "fast"],
        default="lerobot",
        help="Meta-World: lerobot = its exact renderer; fast = ~2.8x faster, 0.16/255 apart at 64 px",
    )
    g.add_argument(
        "--settle", type=int, default=0, help="expert steps recorded after each success (async execution)"
    )
    g.add_argument(
        "--action-representation",
        choices=["delta", "absolute"],
        default="delta",
        help="builtin/dynamic/fragile suites: delta = (dx, dy, dz, grip); absolute = the gripper's target (x, y, z, grip)",
    )
    g.add_argument(
        "--video-quality",
        choices=["standard", "lossless"],
        default="standard",
        help="standard: yuv420p H.264 (LeRobot's default); lossless: yuv444p, frames decode to the rendered pixels",
    )
    g.set_defaults(func=_generate)

    u = groups["data"].add_parser(
        "add-uv",
        help="Meta-World: add where the camera images the object and goal (grounding supervision)",
    )
    u.add_argument(
        "path", help="a Meta-World LeRobot v3 dataset (e.g. lerobot/metaworld_mt50), changed in place"
    )
    u.add_argument("--cameras", default=None, help="comma-separated (default: every world-fixed camera)")
    u.add_argument("--overwrite", action="store_true", help="recompute a feature already there")
    u.set_defaults(func=_add_uv)

    h = groups["data"].add_parser(
        "hindsight",
        help="Meta-World: a copy whose grounding labels come from the demonstrations' state and action "
        "columns instead of the simulator (no privileged labels; vlastack/sim/hindsight.py)",
    )
    h.add_argument("path", help="a Meta-World LeRobot v3 dataset (read only)")
    h.add_argument("--out", required=True, help="the new dataset folder (must not exist)")
    h.set_defaults(func=_hindsight)

    e = sub.add_parser("eval", help="closed-loop evaluation of a policy on a simulated suite")
    e.add_argument(
        "--policy", required=True, help="checkpoint folder | random | expert | ws://HOST:PORT (a `vla serve`)"
    )
    e.add_argument(
        "--suite",
        default=None,
        help="builtin | dynamic | fragile | metaworld | libero_spatial | libero_object | libero_goal | libero_10 "
        "| libero_90 (default: eval.suite)",
    )
    e.add_argument("--tasks", default=None, help="comma-separated subset (default: eval.tasks)")
    n = e.add_mutually_exclusive_group()
    n.add_argument(
        "--episodes",
        type=int_at_least(1),
        default=None,
        help="episodes (eval.seed_scheme decides how they spread)",
    )
    n.add_argument(
        "--episodes-per-task",
        type=int_at_least(1),
        default=None,
        help="N episodes of every task, seeds SEED+j (lerobot-eval's scheme: eval.seed_scheme=per_task)",
    )
    e.add_argument("--out", default="runs/eval", help="folder for eval.json, eval.png, videos/")
    e.add_argument(
        "--lerobot-batch-size",
        type=int_at_least(1),
        default=None,
        help="LIBERO: place episodes as lerobot-eval with this eval.batch_size (envs per task) does",
    )
    e.add_argument("--workers", type=int_at_least(0), default=None, help="worker processes (0 = in-process)")
    e.add_argument(
        "--ray-address",
        default=None,
        help="spread the episodes over a Ray cluster, one CPU each: auto | HOST:PORT | ray://HOST:10001 | "
        "local (eval.ray_address; needs pip install 'vlastack[ray]'; same eval.json as local workers)",
    )
    e.add_argument(
        "--steps-per-chunk",
        type=int_at_least(1),
        default=None,
        help="actions run per chunk (<= the chunk length)",
    )
    e.add_argument(
        "--temporal-ensemble", type=float_at_least(0.0), default=None, help="0 = off, else exp weight m"
    )
    e.add_argument(
        "--seed", type=int_at_least(0, 2**32 - 1), default=None, help="first episode seed (default 1000000)"
    )
    e.add_argument("--videos", type=int_at_least(0), default=None, help="mp4 rollouts to save")
    e.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted evaluation into the same --out (same policy and settings): "
        "only the episodes its journal (eval.partial.jsonl) lacks are run",
    )
    e.add_argument("--image-size", type=int_at_least(8), default=None)
    e.add_argument("--cameras", default=None, help="default: the checkpoint's cameras, else the suite's")
    e.add_argument(
        "--camera-map",
        default=None,
        metavar="CAM=SOURCE,...",
        help="LIBERO: which camera feeds each policy camera (agentview | wrist | none) where the "
        "names do not say (default: derived from the names, e.g. image=agentview, image2=wrist)",
    )
    e.add_argument(
        "--decode",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="decoding options of token heads (temperature, ...) and flow heads (step_noise, ...), "
        "as `vla serve --decode` (docs/model.md)",
    )
    add_config_args(e)
    e.set_defaults(func=_eval)


def _split(text: str | None) -> tuple[str, ...]:
    return tuple(t.strip() for t in (text or "").split(",") if t.strip())


def _generate(args: argparse.Namespace) -> int:
    from vlastack.sim.generate import generate

    rep = generate(
        args.out,
        suite=args.suite,
        tasks=_split(args.tasks),
        episodes=args.episodes,
        episodes_per_task=args.episodes_per_task,
        workers=args.workers,
        ray_address=args.ray_address,
        image_size=args.image_size,
        cameras=_split(args.cameras) or None,
        noise=args.noise,
        seed=args.seed,
        overwrite=args.overwrite,
        video_quality=args.video_quality,
        settle=args.settle,
        render_quality=args.render_quality,
        action_representation=args.action_representation,
    )
    rates = ", ".join(f"{t} {r:.0%}" for t, r in rep["expert_success"].items() if r is not None)
    print(
        f"wrote {rep['episodes']} episodes ({rep['frames']} frames) to {args.out} in {rep['wall_s']:.1f}s; "
        f"expert success: {rates}"
    )
    return 0


def _add_uv(args: argparse.Namespace) -> int:
    from vlastack.sim.generate import add_metaworld_uv

    keys = add_metaworld_uv(args.path, _split(args.cameras) or None, args.overwrite)
    print(f"{args.path}: added {', '.join(keys) or 'nothing (no world-fixed camera)'}")
    return 0


def _hindsight(args: argparse.Namespace) -> int:
    from vlastack.sim.hindsight import hindsight_dataset

    hindsight_dataset(args.path, args.out)
    print(f"{args.out}: {args.path} with hindsight grounding labels (observation.environment_state, 6-d)")
    return 0


def _camera_map(text: str | None) -> dict[str, str | None] | None:
    """``"cam_high=agentview,cam_low=wrist,cam_right=none"`` -> {name: source or None}."""
    if not text:
        return None
    out: dict[str, str | None] = {}
    for item in _split(text):
        name, sep, src = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--camera-map items are CAMERA=agentview|wrist|none, got {item!r}")
        src = src.strip().lower()
        out[name.strip()] = None if src in ("none", "") else src
    return out


def _lerobot_steps(policy: str) -> int | None:
    """A LeRobot pi0/pi05/pi0-FAST folder's ``n_action_steps`` (what lerobot-eval runs per chunk)."""
    from pathlib import Path

    cfg_file = Path(policy) / "config.json"
    if not cfg_file.is_file():
        return None
    from vlastack.fileio import read_json
    from vlastack.infer.readers import lerobot_steps_per_chunk

    return lerobot_steps_per_chunk(read_json(cfg_file))


def _chunk_length(policy: str) -> int | None:
    """The action horizon of a vlastack checkpoint folder (None for baselines and other formats)."""
    from pathlib import Path

    cfg_file = Path(policy) / "config.json"
    if not cfg_file.is_file():
        return None
    from vlastack.fileio import read_json

    model = read_json(cfg_file).get("model")
    return int(model["action_horizon"]) if isinstance(model, dict) and "action_horizon" in model else None


def _eval(args: argparse.Namespace) -> int:
    from vlastack.commands.common import config_from_args
    from vlastack.config import EvalConfig
    from vlastack.sim.evaluate import evaluate

    ec = config_from_args(args).eval

    def pick(v, default):
        return default if v is None else v

    spec = args.policy
    saved = None
    if spec.startswith("ws://"):
        from vlastack.sim.policies import server_metadata

        saved = server_metadata(spec).get("replan_steps")  # the server's own chunk execution
    elif spec not in ("random", "expert"):
        from vlastack.infer.readers.vlastack_folder import saved_steps_per_chunk

        # One source: a checkpoint runs with the steps per chunk it was trained for (its config.yaml),
        # as Policy.from_pretrained and `vla serve` do; --steps-per-chunk overrides.
        saved = saved_steps_per_chunk(spec) or _lerobot_steps(spec)
    steps_per_chunk = pick(args.steps_per_chunk, pick(saved, ec.steps_per_chunk))
    horizon = _chunk_length(spec)
    if horizon is not None and steps_per_chunk > horizon:
        if args.steps_per_chunk is not None:  # the user's value; a preset default is clamped instead
            raise ValueError(
                f"--steps-per-chunk {steps_per_chunk} is more than the policy's chunk length ({horizon} "
                f"actions, {spec}/config.json): pass 1..{horizon}"
            )
        steps_per_chunk = horizon
    if args.decode:
        from vlastack.models.heads.serving import parse_decoding
        from vlastack.sim.policies import Checkpoint

        decoding = tuple(parse_decoding(args.decode).items())
        if spec in ("random", "expert"):
            raise ValueError("--decode applies to a checkpoint's head, not a baseline policy")
        spec = Checkpoint(spec, decoding)
    suite = pick(args.suite, ec.suite)
    image_size = pick(args.image_size, ec.image_size)
    if suite.startswith("libero") and args.image_size is None and ec.image_size == EvalConfig.image_size:
        from vlastack.sim.libero import LEROBOT_IMAGE_SIZE

        image_size = LEROBOT_IMAGE_SIZE  # LeRobot's LIBERO frames, not the built-in suite's 64 px
    res = evaluate(
        spec,
        ec,  # every eval.* setting of the config; the flags below override theirs
        suite=suite,
        tasks=_split(args.tasks) if args.tasks is not None else ec.tasks,
        episodes=pick(args.episodes_per_task, pick(args.episodes, ec.episodes)),
        seed_scheme="per_task" if args.episodes_per_task else ec.seed_scheme,
        seed=pick(args.seed, ec.seed),
        num_workers=pick(args.workers, ec.num_workers),
        ray_address=pick(args.ray_address, ec.ray_address),
        steps_per_chunk=steps_per_chunk,
        temporal_ensemble=pick(args.temporal_ensemble, ec.temporal_ensemble),
        out_dir=args.out,
        videos=pick(args.videos, ec.videos),
        image_size=image_size,
        cameras=_split(args.cameras) or None,
        camera_map=_camera_map(args.camera_map),
        resume=args.resume,
        lerobot_batch_size=pick(args.lerobot_batch_size, ec.lerobot_batch_size),
    )
    for t, s in res["tasks"].items():
        lo, hi = s["ci95"]
        print(f"{t:>16}: {s['success_rate']:6.1%}  [{lo:.2f}, {hi:.2f}]  n={s['n']}")
    for g, s in res.get("groups", {}).items():
        print(f"{g:>16}: {s['success_rate']:6.1%}  [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]  n={s['n']}")
    o = res["overall"]
    print(f"{'overall':>16}: {o['success_rate']:6.1%}  [{o['ci95'][0]:.2f}, {o['ci95'][1]:.2f}]  n={o['n']}")
    if "group_average" in res:
        print(f"{'group average':>16}: {res['group_average']:6.1%}")
    from vlastack.diagnostics.run_report import eval_report

    report = eval_report(args.out, res, {"eval": res["config"], "policy": args.policy})
    print(f"wrote {args.out}/eval.json ({res['wall_s']:.1f}s); report: {report}")
    return 0
