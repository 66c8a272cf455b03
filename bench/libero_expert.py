"""The scripted LIBERO expert (``vlastack/sim/libero_expert.py``): success per task on LIBERO's 50
fixed initial states (lerobot-eval's episodes: seed 1000 + j -> initial state j) and on random
placements (``init_states=False``, the layouts ``vla data generate`` records, seeds 0..N-1).

    PYTHONPATH=. python bench/libero_expert.py [--suite libero_object|libero_spatial] [--states 50] [--random 10]

Physics only (no rendering: the expert reads the simulator's state). Writes
bench/results/libero_expert.json (per task: successes, episodes, mean steps; the suite's total with
a Wilson 95% interval; machine, versions and date).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run by path, bench/ is first on sys.path, where bench/libero.py would shadow the libero package.
sys.path[:] = [str(HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != HERE)]

from bench.libero import machine, versions  # noqa: E402 - after the path fix above
from vlastack.progress import Progress  # noqa: E402

OUT = Path(__file__).parent / "results" / "libero_expert.json"


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return [round(mid - half, 4), round(mid + half, 4)]


def episode(env, seed: int) -> tuple[bool, int]:
    env.reset(seed=seed)
    for t in range(env.max_steps):
        _, _, term, trunc, info = env.step(env.expert_action())
        if info["success"]:
            return True, t + 1
        if term or trunc:
            break
    return False, t + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="libero_object")
    ap.add_argument("--states", type=int, default=50, help="fixed initial states per task (0..N-1)")
    ap.add_argument("--random", type=int, default=10, help="random placements per task (seeds 0..N-1)")
    ap.add_argument("--tasks", default="0,1,2,3,4,5,6,7,8,9")
    ap.add_argument("--merge", action="store_true", help="keep the other tasks already recorded")
    args = ap.parse_args()
    from vlastack.sim.env import make_env

    tasks = [int(t) for t in args.tasks.split(",")]
    rows, t0 = {}, time.time()
    bar = Progress(len(tasks) * (args.states + args.random), "expert", "episode")
    with bar:
        for task in tasks:
            row = {}
            for mode, n, seeds in (("fixed", args.states, [1000 + j for j in range(args.states)]),
                                   ("random", args.random, list(range(args.random)))):  # fmt: skip
                if n == 0:
                    continue
                env = make_env(
                    f"{args.suite}/{task}", suite=args.suite, cameras=(), init_states=mode == "fixed"
                )
                res = []
                for s in seeds:
                    res.append(episode(env, s))
                    bar.update(1, ok=f"{sum(r[0] for r in res)}/{len(res)}")
                env.close()
                ok = sum(r[0] for r in res)
                row[mode] = {"successes": ok, "episodes": n, "mean_steps": round(sum(r[1] for r in res) / n, 1),
                             "failed_seeds": [s for s, r in zip(seeds, res) if not r[0]]}  # fmt: skip
            rows[f"{args.suite}/{task}"] = row
            print(f"{args.suite}/{task}: " + ", ".join(f"{m} {v['successes']}/{v['episodes']}" for m, v in row.items()),
                  flush=True)  # fmt: skip
    # Tasks run apart (--tasks, e.g. two processes on two cores) are merged into one record.
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    rows = {**data.get(args.suite, {}).get("tasks", {}), **rows} if args.merge else rows
    total = {}
    for mode in ("fixed", "random"):
        k = sum(r[mode]["successes"] for r in rows.values() if mode in r)
        n = sum(r[mode]["episodes"] for r in rows.values() if mode in r)
        if n:
            total[mode] = {"successes": k, "episodes": n, "rate": round(k / n, 4), "wilson95": wilson(k, n)}
    print(json.dumps(total))
    data[args.suite] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "command": "bench/libero_expert.py " + " ".join(sys.argv[1:]),
        "what": "scripted expert (sim/libero_expert.py), physics only; fixed = LIBERO's initial states "
        "(seed 1000 + j -> state j), random = the task's own seeded placement (vla data generate's layouts)",
        "wall_s": round(time.time() - t0, 1),
        "total": total,
        "tasks": rows,
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
