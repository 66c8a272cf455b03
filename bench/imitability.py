"""Imitability of the built-in demonstrations: a privileged-state oracle per DART noise level.

    .venv/bin/python bench/imitability.py [--episodes 500] [--noise 0 0.1 0.2 0.3]
        -> bench/results/imitability.json

The oracle (``vlastack.sim.imitability.oracle_bc``) is an MLP on robot state + the task's key
object positions + task id, trained on expert chunks recorded under the noise level and scored
closed-loop on 50 unseen seeds per task. It bounds what any image policy can learn from that data.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=500, help="training episodes per task")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--eval-episodes", type=int, default=50)
    ap.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    ap.add_argument("--out", default=str(RESULTS / "imitability.json"))
    args = ap.parse_args()

    import torch

    from vlastack.sim.imitability import oracle_bc

    torch.set_num_threads(2)
    rows = []
    for noise in args.noise:
        r = oracle_bc(noise=noise, episodes=args.episodes, steps=args.steps, eval_episodes=args.eval_episodes)
        rows.append(r)
        cells = " ".join(f"{t} {v:4.0%}" for t, v in r["oracle_success"].items())
        print(
            f"noise {noise:.2f}: oracle {r['oracle_mean']:4.0%} ({cells}); {r['frames']} frames; {r['seconds']:.0f}s"
        )
    out = {
        "what": "privileged-state MLP behavior cloning on the built-in suite, per DART noise level",
        "settings": vars(args) | {"horizon": 8, "steps_per_chunk": 4, "width": 256, "batch": 256},
        "machine": platform.processor() or platform.machine(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
