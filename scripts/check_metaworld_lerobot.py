"""Compare vlastack's Meta-World wrapper with LeRobot 0.6.1's ``MetaworldEnv`` (obs_type="pixels_agent_pos").

Each side runs in its own interpreter: LeRobot's in a venv with lerobot 0.6.1 + metaworld 3.0.0 (see
``scripts/make_lerobot_fixtures.py`` for the venv; add ``metaworld==3.0.0 mujoco scipy``), vlastack's in
the project venv (metaworld 3.1.1). Each writes an .npz; this script (run with either python) compares:

    python scripts/check_metaworld_lerobot.py --lerobot-python /work/lrvenv/bin/python \\
        --vlastack-python .venv/bin/python --tasks reach-v3,push-v3 --seeds 1000-1004

Per task and seed, Meta-World's scripted expert (``metaworld.policies``, fed the full 39-dim state,
action clipped to [-1, 1] as float32 on both sides) runs until the first success or 500 steps; recorded:
success, steps, the initial and per-step 39-dim state, and the first 480x480 frame. A random policy
(uniform [-1, 1], numpy seed = episode seed, the same actions on both sides) runs on the first seed of
each task. Writes ``bench/results/metaworld_lerobot_check.json`` and prints a table. Rendering is
headless (MUJOCO_GL=egl unless set); nothing is downloaded (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MAX_STEPS = 500
PACKAGES = ("lerobot", "vlastack", "metaworld", "mujoco", "gymnasium", "numpy")


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def expert_action(policy, raw: np.ndarray) -> np.ndarray:
    return np.clip(policy.get_action(raw), -1.0, 1.0).astype(np.float32)


class LeRobotSide:
    """LeRobot's MetaworldEnv as is, plus a spy on its inner Meta-World env for the raw 39-dim obs it drops."""

    def __init__(self, task: str):
        from lerobot.envs.metaworld import MetaworldEnv

        self.env = MetaworldEnv(task, obs_type="pixels_agent_pos")
        self.env._ensure_env()  # LeRobot builds the Meta-World env lazily
        inner, self.raw = self.env._env, {}
        step, reset = inner.step, inner.reset

        def spy(fn, key):
            def call(*a, **kw):
                out = fn(*a, **kw)
                self.raw[key] = np.array(out[0], np.float64)
                return out

            return call

        # LeRobot resets by itself after a success: keep the step's obs apart from the reset's
        inner.step, inner.reset = spy(step, "step"), spy(reset, "reset")

    def reset(self, seed: int):
        obs, _ = self.env.reset(seed=seed)
        return self.raw["reset"], obs["pixels"]

    def step(self, action):
        _, _, _, _, info = self.env.step(action)
        return self.raw["step"], info["is_success"]

    def expert(self, raw):
        return expert_action(self.env.expert_policy, raw)

    def close(self):
        self.env.close()


class VlastackSide:
    def __init__(self, task: str):
        sys.path.insert(0, str(ROOT))
        from vlastack.sim.metaworld import MetaWorldEnv

        self.env = MetaWorldEnv(task)  # render_quality="lerobot", 480x480, 500 steps

    def reset(self, seed: int):
        obs, _ = self.env.reset(seed=seed)
        return np.asarray(self.env._raw, np.float64), obs["images"]["image"]  # float64, as Meta-World gives

    def step(self, action):
        _, _, ok, _, _ = self.env.step(action)
        return np.asarray(self.env._raw, np.float64), ok

    def expert(self, raw):
        return self.env.expert_action()

    def close(self):
        self.env.close()


def rollout(side, seed: int, actions: np.ndarray | None = None) -> dict:
    raw, frame = side.reset(seed)
    states, success = [raw], False
    for t in range(MAX_STEPS):
        a = side.expert(raw) if actions is None else actions[t]
        raw, success = side.step(a)
        states.append(raw)
        if success:
            break
    return {"success": success, "steps": t + 1, "states": np.stack(states), "frame": frame}


def run_side(name: str, tasks: list[str], seeds: list[int], out: str) -> None:
    cls = {"lerobot": LeRobotSide, "vlastack": VlastackSide}[name]
    arrays = {"versions": np.array(json.dumps(versions()))}
    for task in tasks:
        side = cls(task)
        runs = [("expert", s, None) for s in seeds]
        runs.append(("random", seeds[0], np.random.default_rng(seeds[0]).uniform(-1, 1, (MAX_STEPS, 4))))
        for kind, seed, actions in runs:
            ep = rollout(side, seed, None if actions is None else actions.astype(np.float32))
            key = f"{task}/{kind}/{seed}"
            arrays.update(
                {f"{key}/{k}": np.asarray(v) for k, v in ep.items() if k != "frame" or kind == "expert"}
            )
            if actions is not None:
                arrays[f"{key}/actions"] = actions.astype(np.float32)
            print(f"[{name}] {key}: success={ep['success']} steps={ep['steps']}", flush=True)
        side.close()
    np.savez_compressed(out, **arrays)


def resize64(img: np.ndarray) -> np.ndarray:
    from PIL import Image  # bilinear with a support scaled to the reduction: antialiased

    return np.asarray(Image.fromarray(img).resize((64, 64), Image.BILINEAR), np.float64)


def compare(lr: dict, vl: dict, tasks: list[str], seeds: list[int]) -> tuple[list, dict]:
    rows = []
    for task in tasks:
        for kind, ss in (("expert", seeds), ("random", seeds[:1])):
            for seed in ss:
                k = f"{task}/{kind}/{seed}"
                a, b = lr[f"{k}/states"], vl[f"{k}/states"]
                n = min(len(a), len(b))
                diff = np.abs(a[:n] - b[:n]).max(axis=1)
                row = {"task": task, "kind": kind, "seed": seed}
                for side, d in (("lerobot", lr), ("vlastack", vl)):
                    row[f"{side}_success"], row[f"{side}_steps"] = (
                        bool(d[f"{k}/success"]),
                        int(d[f"{k}/steps"]),
                    )
                row["agree"] = row["lerobot_success"] == row["vlastack_success"] and (
                    row["lerobot_steps"] == row["vlastack_steps"]
                )
                row["init_state_maxdiff"] = float(diff[0])
                row["first_step_state_diff_gt_1e-6"] = (
                    int(np.argmax(diff > 1e-6)) if (diff > 1e-6).any() else None
                )
                row["final_state_maxdiff"] = float(np.abs(a[-1] - b[-1]).max())
                if kind == "expert":
                    fa, fb = lr[f"{k}/frame"], vl[f"{k}/frame"]
                    row["frame_shape"] = [list(fa.shape), list(fb.shape)]
                    row["pixel_mad_480"] = float(np.abs(fa.astype(np.float64) - fb).mean())
                    row["pixel_mad_64"] = float(np.abs(resize64(fa) - resize64(fb)).mean())
                    row["pixel_max_480"] = int(np.abs(fa.astype(np.int16) - fb).max())
                else:
                    assert np.array_equal(lr[f"{k}/actions"], vl[f"{k}/actions"]), "random actions differ"
                rows.append(row)
    ex = [r for r in rows if r["kind"] == "expert"]
    rnd = [r for r in rows if r["kind"] == "random"]
    summary = {
        "expert_episodes": len(ex),
        "expert_agree": sum(r["agree"] for r in ex),
        "expert_success": {s: sum(r[f"{s}_success"] for r in ex) for s in ("lerobot", "vlastack")},
        "expert_disagree": [f"{r['task']}/{r['seed']}" for r in ex if not r["agree"]],
        "max_init_state_diff": max(r["init_state_maxdiff"] for r in rows),
        "mean_pixel_mad_480": float(np.mean([r["pixel_mad_480"] for r in ex])),
        "max_pixel_mad_480": max(r["pixel_mad_480"] for r in ex),
        "mean_pixel_mad_64": float(np.mean([r["pixel_mad_64"] for r in ex])),
        "max_pixel_mad_64": max(r["pixel_mad_64"] for r in ex),
        "random_episodes": len(rnd),
        "random_success_agree": sum(r["lerobot_success"] == r["vlastack_success"] for r in rnd),
        "random_max_final_state_diff": max(r["final_state_maxdiff"] for r in rnd),
        "pixel_units": "mean |difference| on the 0-255 scale",
    }
    return rows, summary


def parse_seeds(spec: str) -> list[int]:
    if "-" in spec:
        lo, hi = map(int, spec.split("-"))
        return list(range(lo, hi + 1))
    return [int(s) for s in spec.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lerobot-python", default="/work/lrvenv/bin/python")
    p.add_argument("--vlastack-python", default=str(ROOT / ".venv/bin/python"))
    p.add_argument("--tasks", default="reach-v3,push-v3")
    p.add_argument("--seeds", default="1000-1004", help="'1000-1004' or '1000,1003'")
    p.add_argument("--out", default=str(ROOT / "bench/results/metaworld_lerobot_check.json"))
    p.add_argument("--workdir", help="keep the per-side .npz here (default: a temporary folder)")
    p.add_argument("--reuse", action="store_true", help="reuse <workdir>/<side>.npz if present")
    p.add_argument("--side", choices=["lerobot", "vlastack"], help=argparse.SUPPRESS)
    p.add_argument("--npz", help=argparse.SUPPRESS)
    args = p.parse_args()
    tasks, seeds = args.tasks.split(","), parse_seeds(args.seeds)
    if args.side:
        return run_side(args.side, tasks, seeds, args.npz)

    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.setdefault("MUJOCO_GL", "egl")
    env.setdefault("PYOPENGL_PLATFORM", env["MUJOCO_GL"])
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mw_lerobot_check_"))
    work.mkdir(parents=True, exist_ok=True)
    data = {}
    for side, py in (("lerobot", args.lerobot_python), ("vlastack", args.vlastack_python)):
        npz = work / f"{side}.npz"
        if not (args.reuse and npz.exists()):  # one side at a time
            cmd = [
                py,
                __file__,
                "--side",
                side,
                "--npz",
                str(npz),
                "--tasks",
                args.tasks,
                "--seeds",
                args.seeds,
            ]
            subprocess.run(cmd, env=env, cwd=ROOT, check=True)
        data[side] = dict(np.load(npz))
    rows, summary = compare(data["lerobot"], data["vlastack"], tasks, seeds)
    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": {s: json.loads(str(d["versions"])) for s, d in data.items()},
        "tasks": tasks,
        "seeds": seeds,
        "max_steps": MAX_STEPS,
        "mujoco_gl": env["MUJOCO_GL"],
        "summary": summary,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"\n{'task':26s} {'kind':6s} {'seed':>5s} {'LR ok/steps':>12s} {'VLA ok/steps':>12s} "
        f"{'init diff':>9s} {'1st div':>7s} {'px480':>6s} {'px64':>6s}"
    )
    for r in rows:
        lr, vl = (
            f"{r['lerobot_success']:d}/{r['lerobot_steps']}",
            f"{r['vlastack_success']:d}/{r['vlastack_steps']}",
        )
        div = r["first_step_state_diff_gt_1e-6"]
        px = f"{r['pixel_mad_480']:6.3f} {r['pixel_mad_64']:6.3f}" if r["kind"] == "expert" else ""
        print(
            f"{r['task']:26s} {r['kind']:6s} {r['seed']:5d} {lr:>12s} {vl:>12s} {r['init_state_maxdiff']:9.1e} "
            f"{'-' if div is None else div:>7} {px}"
        )
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
