"""How long one ``vla rl`` iteration's rollouts take with the envs in this process and in worker
processes (``rl.env_workers``; rl/envs.py). The update is left out: only where the envs run changes.

    python bench/rl_envs.py --policy runs/heads/fast_nobpe_h4_sigma2_s2/final/ema --workers 0,2

Prints seconds per rollout round and appends them to bench/results/rl_envs.json with the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path.pop(0)  # bench/ holds no package; keep `vlastack` the installed one
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.common import environment  # noqa: E402
from vlastack.infer.policy import Policy  # noqa: E402
from vlastack.labs._core import cpu_flags  # noqa: E402
from vlastack.rl.envs import make_pool, rollout_env_kw  # noqa: E402
from vlastack.rl.rollout import collect  # noqa: E402
from vlastack.rl.runner import iteration_jobs, rl_config  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "rl_envs.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", required=True)
    ap.add_argument("--workers", default="0,2", help="comma-separated rl.env_workers values")
    ap.add_argument(
        "--rounds", type=int, default=2, help="rollout rounds per setting (the first builds the envs)"
    )
    ap.add_argument("overrides", nargs="*", help="rl.* / eval.* overrides (rl.groups, rl.tasks, ...)")
    args = ap.parse_args()
    cfg = rl_config(args.policy, list(args.overrides))
    rl, ev = cfg.rl, cfg.eval
    torch.set_num_threads(max(rl.num_threads, 1))
    policy = Policy.from_pretrained(args.policy)
    from vlastack.sim.env import suite_tasks

    tasks = suite_tasks(ev.suite, rl.tasks or tuple(ev.tasks))
    env_kw = rollout_env_kw(cfg)
    rows = []
    for n in (int(x) for x in args.workers.split(",")):
        pool = make_pool(env_kw, n)
        times, steps = [], 0
        try:
            for it in range(args.rounds):
                gen = torch.Generator().manual_seed(it)
                t0 = time.perf_counter()
                ro = collect(policy, pool, iteration_jobs(rl, tasks, it), ev.steps_per_chunk,
                             lambda b, g=gen: policy.serving.rl_sample(b, rl, g))  # fmt: skip
                times.append(round(time.perf_counter() - t0, 2))
                steps += sum(e["steps"] for e in ro.episodes)
        finally:
            pool.close()
        rows.append({"env_workers": n, "seconds_per_round": times, "env_steps": steps})
        print(f"env_workers={n}: {times} s per round ({steps} env steps over {args.rounds} rounds)")
    record = {"date": datetime.date.today().isoformat(), "environment": environment(), "cpu_flags": cpu_flags(),
              "policy": args.policy, "suite": ev.suite, "tasks": list(tasks), "groups": rl.groups,
              "group_size": rl.group_size, "torch_threads": torch.get_num_threads(), "rows": rows}  # fmt: skip
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"records": []}
    data["records"].append(record)
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
