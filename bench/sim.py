"""Simulation benchmark: env steps/s (one process) and scripted-expert success per task.

    .venv/bin/python bench/sim.py [--episodes 50]        -> bench/results/sim.json
    <metaworld venv>/bin/python bench/sim.py --metaworld  -> bench/results/metaworld_expert.json

Steps/s counts full env steps (physics substeps + rendering every camera + the expert's action),
including resets, cycling over the suite's tasks.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def steps_per_second(suite: str, tasks, image_size: int, cameras, steps: int) -> float:
    from vlastack.sim.env import make_env

    envs = [make_env(t, image_size=image_size, cameras=cameras, suite=suite) for t in tasks]
    for e in envs:  # warm up: GL context, shader compilation
        e.reset(seed=0)
        e.step(e.expert_action())
    n, t0, k = 0, time.perf_counter(), 0
    while n < steps:
        env = envs[k % len(envs)]
        env.reset(seed=k)
        k += 1
        while n < steps:
            _, _, term, trunc, _ = env.step(env.expert_action())
            n += 1
            if term or trunc:
                break
    rate = n / (time.perf_counter() - t0)
    for e in envs:
        e.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--episodes", type=int, default=50, help="expert episodes per task")
    ap.add_argument("--steps", type=int, default=1500, help="env steps per speed measurement")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--metaworld", action="store_true", help="benchmark the Meta-World MT10 adapter")
    args = ap.parse_args()

    from vlastack.sim.env import suite_tasks
    from vlastack.sim.evaluate import evaluate
    from vlastack.sim.render import ensure_gl_backend

    backend = ensure_gl_backend()
    suite = "metaworld" if args.metaworld else "builtin"
    tasks = suite_tasks(suite)
    speed_steps = args.steps // 5 if args.metaworld else args.steps
    speeds = {
        "64px_scene": steps_per_second(suite, tasks, 64, ("scene",), speed_steps),
        "64px_scene_wrist": steps_per_second(suite, tasks, 64, ("scene", "wrist"), speed_steps),
        "224px_scene": steps_per_second(suite, tasks, 224, ("scene",), speed_steps // 2),
        "224px_scene_wrist": steps_per_second(suite, tasks, 224, ("scene", "wrist"), speed_steps // 2),
    }
    res = evaluate(
        "expert",
        suite=suite,
        episodes=args.episodes * len(tasks),
        num_workers=args.workers,
        videos=0,
        cameras=("scene",),
        seed=1_000_000,
    )
    out = {
        "suite": suite,
        "gl_backend": backend,
        "machine": f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores",
        "env_steps_per_s_one_process": {k: round(v, 1) for k, v in speeds.items()},
        "expert_success": {
            t: {
                "rate": s["success_rate"],
                "ci95": [round(c, 3) for c in s["ci95"]],
                "n": s["n"],
                "mean_steps": round(s["mean_steps"], 1),
            }
            for t, s in res["tasks"].items()
        },
        "expert_overall": res["overall"]["success_rate"],
        "eval_wall_s": round(res["wall_s"], 1),
        "eval_workers": args.workers,
    }
    print(f"{'setting':>20} | env steps/s")
    for k, v in speeds.items():
        print(f"{k:>20} | {v:8.1f}")
    print(f"\n{'task':>24} | expert success (n)   | mean steps")
    for t, s in out["expert_success"].items():
        print(f"{t:>24} | {s['rate']:6.1%} ({s['n']:3d})        | {s['mean_steps']:5.1f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / ("metaworld_expert.json" if args.metaworld else "sim.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
