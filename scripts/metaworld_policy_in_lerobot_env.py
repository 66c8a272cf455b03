"""Run a trained vlastack policy in LeRobot 0.6.1's own ``MetaworldEnv`` and compare with ``vla eval``.

The check that our environment wrapping (camera pose, flips, image pipeline, state, prompts, action
scaling, episode length, success flag) matches LeRobot's for a *trained* policy, not only for the
scripted expert: the same checkpoint, the same (task, seed) episodes, scored once by ``vla eval``
(its ``eval.json``) and once here, in LeRobot's environment with LeRobot's exact renderer. Run in the
LeRobot venv (``scripts/check_metaworld_lerobot.py``) with the repo on the path; the policy runs
in-process through ``vlastack.infer.policy.Policy``, the object ``vla serve`` wraps:

    MUJOCO_GL=egl HF_HUB_OFFLINE=1 PYTHONPATH=. /work/lrvenv/bin/python \\
        scripts/metaworld_policy_in_lerobot_env.py --policy runs/mt10/final --eval-json runs/mt10/eval/eval.json \\
        --tasks reach-v3,push-v3 --seeds 1000-1002

Writes ``bench/results/metaworld_policy_lerobot_env.json``: per episode both outcomes and step counts.
The flow head samples from zeros (``model.head_options.noise_scale=0``), so the policy is deterministic and the
two runs differ only through the environments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def run_lerobot_episode(policy, task: str, seed: int, max_steps: int) -> dict:
    from lerobot.envs.metaworld import MetaworldEnv

    env = MetaworldEnv(task, obs_type="pixels_agent_pos")
    obs, _ = env.reset(seed=seed)
    policy.reset()
    success, steps = False, 0
    while steps < max_steps:
        steps += 1
        o = {"images": {"image": np.ascontiguousarray(obs["pixels"])},
             "state": np.asarray(obs["agent_pos"], np.float32), "prompt": env.task_description}  # fmt: skip
        obs, _, terminated, truncated, info = env.step(policy.select_action(o))
        if terminated or truncated:
            success = bool(info["is_success"])
            break
    env.close()
    return {"task": task, "seed": seed, "success": success, "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--eval-json", required=True, help="vla eval's eval.json for the same policy and seeds")
    ap.add_argument("--tasks", required=True)
    ap.add_argument("--seeds", default="1000-1002", help="first-last (inclusive)")
    ap.add_argument("--max-steps", type=int, default=500)
    ap.add_argument("--out", default=str(ROOT / "bench/results/metaworld_policy_lerobot_env.json"))
    args = ap.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    from vlastack.infer.policy import Policy

    policy = Policy.from_pretrained(args.policy)
    lo, hi = (int(x) for x in args.seeds.split("-"))
    ours = {(e["task"], e["seed"]): e for e in json.loads(Path(args.eval_json).read_text())["episodes"]}
    rows = []
    for task in args.tasks.split(","):
        for seed in range(lo, hi + 1):
            r = run_lerobot_episode(policy, task, seed, args.max_steps)
            v = ours.get((task, seed))
            r.update(vlastack_success=v and v["success"], vlastack_steps=v and v["steps"])
            rows.append(r)
            print(f"{task:>24} {seed}: lerobot env {r['success']!s:5} {r['steps']:3d} steps | "
                  f"vla eval {r['vlastack_success']!s:5} {r['vlastack_steps']}", flush=True)  # fmt: skip
    both = [r for r in rows if r["vlastack_success"] is not None]
    summary = {
        "episodes": len(rows),
        "compared": len(both),
        "same_outcome": sum(r["success"] == r["vlastack_success"] for r in both),
        "same_outcome_and_steps": sum(
            r["success"] == r["vlastack_success"] and r["steps"] == r["vlastack_steps"] for r in both
        ),
        "success_lerobot_env": float(np.mean([r["success"] for r in rows])) if rows else None,
        "success_vla_eval": float(np.mean([r["vlastack_success"] for r in both])) if both else None,
    }
    versions = {p: metadata.version(p) for p in ("lerobot", "metaworld", "mujoco", "torch")}
    out = {"date": datetime.date.today().isoformat(), "policy": args.policy, "versions": versions,
           "summary": summary, "episodes": rows}  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary), f"-> {args.out}")


if __name__ == "__main__":
    main()
