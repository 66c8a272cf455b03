"""Real-time chunking under inference delay: success and smoothness of every execution method.

    python -m bench.rtc                      # data -> two trainings -> evaluation -> JSON, plot, docs
    python -m bench.rtc --phase train        # data and the two policies only (reused afterwards)
    python -m bench.rtc --phase eval         # evaluate the policies already trained

Trains the ``tiny`` demo recipe (grounding head, EMA, bf16 autocast; action horizon 16, the scene
camera only and batch 16 to fit a shared 2-core CPU) twice on
scripted-expert demos (each going on 8 expert steps past its success, so chunks' later actions
are trained near the goal) of two dynamic families (``reach_moving``, ``reach_switch``) and one static
one (``reach``): a plain flow policy and a training-time-RTC one (``train.rtc.max_delay=8``),
with the same data, seed and step budget. Then every method runs at simulated delays d in
{0, 1, 2, 4, 8} control steps (``eval.execution``): sync, naive_async, temporal_ensemble and
rtc_inference on the plain policy, rtc_training on the RTC-trained one. Per (method, d): success
per task with Wilson intervals, and the max / mean action jump at chunk boundaries. Also the cost
of inference-time RTC's guided sampling against plain sampling (thread time, interleaved medians).
Results: bench/results/rtc.json, docs/rtc.png, the table in docs/rtc.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

import torch

OUT = Path("runs/bench_rtc")
TASKS = ("reach_moving", "reach_switch", "reach")
DYNAMIC = ("reach_moving", "reach_switch")
DELAYS = (0, 1, 2, 4, 8)
EPISODES = 600  # demonstrations, round-robin over TASKS
STEPS = 3000  # training steps per policy (a steps budget: the result does not depend on load)
MAX_DELAY = 8
CAMERAS = ("scene",)
# Demos go on for this many expert steps after the success, so a chunk's later actions are
# trained near the goal too (asynchronous execution runs actions d.. of each chunk).
SETTLE = 8
OVERRIDES = [
    "model.action_horizon=16",
    f"train.steps={STEPS}",
    f"train.save_every={STEPS}",
    "train.log_every=100",
    "train.batch_size=16",
    "data.num_workers=0",
    "model.camera_names=[scene]",
    "eval.steps_per_chunk=4",
]


def _log(msg: str, t0: float) -> None:
    print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)


def policy_dir(name: str) -> Path:
    run = OUT / name
    return run / "final" / "ema" if (run / "final" / "ema").is_dir() else run / "final"


def train(t0: float, threads: int = 2) -> dict:
    from vlastack.apps.demo import DATA_NOISE, demo_config
    from vlastack.sim.generate import generate
    from vlastack.train.trainer import Trainer

    torch.set_num_threads(threads)
    data = OUT / "data"
    info: dict = {}
    if not (data / "meta" / "vlastack_sim.json").exists():
        _log(f"generating {EPISODES} demos of {', '.join(TASKS)}", t0)
        info["generate"] = generate(
            data, suite="builtin", tasks=TASKS, episodes=EPISODES, workers=2, noise=DATA_NOISE, cameras=CAMERAS,
            seed=0, overwrite=True, video_quality="lossless", progress=False, settle=SETTLE,
        )  # fmt: skip
    for name, extra in (("plain", []), ("rtc_trained", [f"train.rtc.max_delay={MAX_DELAY}"])):
        if policy_dir(name).is_dir():
            continue
        cfg = demo_config("tiny", None, [*OVERRIDES, *extra])
        _log(f"training {name} ({cfg.train.steps} steps)", t0)
        run = OUT / name
        shutil.rmtree(run, ignore_errors=True)
        t1 = time.perf_counter()
        summary = Trainer(cfg, data_path=data, run_dir=run).fit()
        info[name] = {"train_wall_s": time.perf_counter() - t1, "final_loss": summary.get("final_loss")}
        (run / "bench_train.json").write_text(json.dumps(info[name]))
    return info


# (label, policy, method): the plain policy with every method that needs no special training,
# the RTC-trained one with its own method and, for reference, with naive async.
# Inference-time RTC also runs with a gentler guidance (beta 1) and a shorter soft region
# (overlap 6 instead of the whole leftover of 12): the first measurement showed it dragging the
# new chunk toward the old plan even at d = 0.
RUNS = (
    ("sync", "plain", "sync", {}),
    ("naive_async", "plain", "naive_async", {}),
    ("temporal_ensemble", "plain", "temporal_ensemble", {}),
    ("rtc_inference", "plain", "rtc_inference", {}),
    ("rtc_inference beta=1", "plain", "rtc_inference", {"guidance_max": 1.0}),
    ("rtc_inference overlap=6", "plain", "rtc_inference", {"overlap": 6}),
    ("rtc_training", "rtc_trained", "rtc_training", {}),
    ("naive_async (rtc-trained policy)", "rtc_trained", "naive_async", {}),
)
RTC_LABELS = ("rtc_inference", "rtc_inference beta=1", "rtc_inference overlap=6", "rtc_training")
EVAL_EPISODES = 25  # per task and (method, delay)
ENSEMBLE = 0.1
STEPS_PER_CHUNK = 4


def cpu_flags() -> list[str]:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("Flags:")), "")
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")
    return [f for f in line.split()[1:] if f in wanted]


def evaluate_all(t0: float, episodes: int, delays=DELAYS, runs=RUNS) -> list[dict]:
    from vlastack.config import EvalConfig, ExecutionConfig
    from vlastack.sim.evaluate import evaluate

    rows = []
    for d in delays:
        for label, pol, method, extra in runs:
            ex = ExecutionConfig(method=method, delay=d, **extra)
            cfg = EvalConfig(
                suite="builtin", tasks=TASKS, episodes=episodes * len(TASKS), num_workers=2,
                steps_per_chunk=STEPS_PER_CHUNK, videos=0, execution=ex,
                temporal_ensemble=ENSEMBLE if method == "temporal_ensemble" else 0.0,
            )  # fmt: skip
            res = evaluate(str(policy_dir(pol)), cfg, cameras=CAMERAS)
            eps = res["episodes"]
            dyn = [e for e in eps if e["task"] in DYNAMIC]
            jumps = [e for e in dyn if e.get("boundaries")]
            row = {
                "label": label, "policy": pol, "method": method, "delay": d, "execution": extra,
                "success": {t: v["success_rate"] for t, v in res["tasks"].items()},
                "ci95": {t: v["ci95"] for t, v in res["tasks"].items()},
                "dynamic_success": sum(e["success"] for e in dyn) / len(dyn),
                "static_success": res["tasks"]["reach"]["success_rate"],
                "dynamic_mean_jump": sum(e["mean_jump"] for e in jumps) / max(1, len(jumps)),
                "dynamic_mean_max_jump": sum(e["max_jump"] for e in jumps) / max(1, len(jumps)),
                "dynamic_max_jump": max((e["max_jump"] for e in jumps), default=0.0),
                "starved_steps": res["overall"].get("starved_steps", 0),
                "fallbacks": res["overall"].get("fallbacks", 0),
                "wall_s": res["wall_s"],
            }  # fmt: skip
            rows.append(row)
            _log(
                f"d={d} {label:>34}: dynamic {row['dynamic_success']:.0%}, reach {row['static_success']:.0%}, "
                f"mean jump {row['dynamic_mean_jump']:.3f}, max {row['dynamic_max_jump']:.3f}",
                t0,
            )
    return rows


def inference_cost(repeats: int = 15) -> dict:
    """Thread CPU time per chunk: plain sampling, guided (inference-time RTC) and clean-prefix
    (training-time RTC) sampling, interleaved so load changes hit all three alike."""
    import numpy as np

    from vlastack.infer.policy import Policy
    from vlastack.sim.env import make_env

    torch.set_num_threads(2)
    env = make_env("reach_moving", cameras=CAMERAS, seed=1_000_000)
    obs, _ = env.reset(seed=1_000_000)
    env.close()
    times: dict[str, list[float]] = {"plain": [], "rtc_inference": [], "rtc_training": []}
    policies = {"plain": Policy.from_pretrained(policy_dir("plain"))}
    policies["rtc_training"] = Policy.from_pretrained(policy_dir("rtc_trained"))
    h = policies["plain"].cfg.action_horizon
    prefix = policies["plain"].infer(obs)["actions"][STEPS_PER_CHUNK:]
    calls = {
        "plain": lambda: policies["plain"].infer(obs),
        "rtc_inference": lambda: policies["plain"].infer(
            {**obs, "action_prefix": prefix, "inference_delay": 4}
        ),
        "rtc_training": lambda: policies["rtc_training"].infer(
            {**obs, "action_prefix": prefix, "inference_delay": 4, "rtc_method": "rtc_training"}
        ),
    }
    for _ in range(3):  # warm-up
        for f in calls.values():
            f()
    for _ in range(repeats):
        for k, f in calls.items():
            t = time.thread_time()
            f()
            times[k].append((time.thread_time() - t) * 1e3)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {
        "thread_ms_median": med,
        "thread_ms_all": times,
        "rtc_inference_overhead": med["rtc_inference"] / med["plain"],
        "rtc_training_overhead": med["rtc_training"] / med["plain"],
        "action_horizon": h,
        "num_denoise_steps": policies["plain"].cfg.num_denoise_steps,
        "note": "thread CPU time of one chunk (batch 1, 2 torch threads) on the shared 2-core CPU",
    }


def goals(rows: list[dict]) -> dict:
    by = {(r["label"], r["delay"]): r for r in rows}
    out = {}
    for label in (*RTC_LABELS, "naive_async", "sync", "temporal_ensemble"):
        s0, s4 = by[(label, 0)]["dynamic_success"], by[(label, 4)]["dynamic_success"]
        out[label] = {
            "dynamic_success_d0": s0,
            "dynamic_success_d4": s4,
            "kept_at_d4": s4 / s0 if s0 else None,
        }
    naive = {d: by[("naive_async", d)]["dynamic_mean_jump"] for d in DELAYS}
    for label in RTC_LABELS:
        out[label]["mean_jump_vs_naive"] = {
            d: by[(label, d)]["dynamic_mean_jump"] / naive[d] if naive[d] else None for d in DELAYS
        }
        ok = out[label]["kept_at_d4"] is not None and out[label]["kept_at_d4"] >= 0.9
        out[label]["success_goal_met"] = ok
        out[label]["jump_goal_met_d4"] = (out[label]["mean_jump_vs_naive"][4] or 1.0) <= 1 / 3
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, *_ in RUNS:
        rs = sorted((r for r in rows if r["label"] == label), key=lambda r: r["delay"])
        ds = [r["delay"] for r in rs]
        axes[0].plot(ds, [r["dynamic_success"] for r in rs], marker="o", label=label)
        axes[1].plot(ds, [r["dynamic_mean_jump"] for r in rs], marker="o", label=label)
    axes[0].set(xlabel="inference delay d (control steps)", ylabel="success on dynamic tasks", ylim=(0, 1.05))
    axes[1].set(xlabel="inference delay d (control steps)", ylabel="mean action jump at chunk boundaries")
    axes[0].legend(fontsize=7)
    fig.suptitle("Real-time chunking on reach_moving + reach_switch (tiny policy, simulated delay)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(rows: list[dict]) -> str:
    lines = [
        "| method | d | reach_moving | reach_switch | dynamic | reach (static) | mean jump | max jump | starved |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: ([x[0] for x in RUNS].index(r["label"]), r["delay"])):
        s = r["success"]
        legacy = r["method"] == "sync" and r["delay"] == 0  # the synchronous path keeps no jump stats
        jumps = "n/a | n/a" if legacy else f"{r['dynamic_mean_jump']:.3f} | {r['dynamic_max_jump']:.3f}"
        lines.append(
            f"| {r['label']} | {r['delay']} | {s['reach_moving']:.0%} | {s['reach_switch']:.0%} | "
            f"{r['dynamic_success']:.0%} | {s['reach']:.0%} | {jumps} | {r['starved_steps']} |"
        )
    return "\n".join(lines)


def run_eval(t0: float, episodes: int = EVAL_EPISODES, load_note: str = "") -> None:
    from bench.common import write_results

    cost = inference_cost()
    _log(f"inference cost (thread ms): {cost['thread_ms_median']}", t0)
    rows = evaluate_all(t0, episodes)
    info = {}
    for name in ("plain", "rtc_trained"):
        f = OUT / name / "bench_train.json"
        info[name] = json.loads(f.read_text()) if f.exists() else None
    payload = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu_flags": cpu_flags(),
        "torch": torch.__version__,
        "load_note": load_note or "2 CPU cores; see the session's notes for other load",
        "setup": {
            "tasks": TASKS,
            "dynamic": DYNAMIC,
            "delays": DELAYS,
            "episodes_per_task": episodes,
            "demos": EPISODES,
            "train_steps": STEPS,
            "overrides": OVERRIDES,
            "rtc_max_delay": MAX_DELAY,
            "steps_per_chunk": STEPS_PER_CHUNK,
            "temporal_ensemble": ENSEMBLE,
            "cameras": CAMERAS,
        },
        "training": info,
        "inference_cost": cost,
        "rows": rows,
        "goals": goals(rows),
    }
    path = write_results("rtc", payload)
    plot(rows, Path("docs/rtc.png"))
    doc = Path("docs/rtc.md")
    if doc.exists():
        text = doc.read_text()
        a, b = "<!-- rtc-table -->", "<!-- /rtc-table -->"
        if a in text and b in text:
            doc.write_text(text[: text.index(a) + len(a)] + "\n" + table(rows) + "\n" + text[text.index(b) :])
    print(table(rows))
    print(json.dumps(payload["goals"], indent=1))
    _log(f"wrote {path}, docs/rtc.png", t0)


def resume(name: str, steps: int, t0: float) -> None:
    """Train one of the two policies on to ``steps`` (the LR schedule re-targeted at ``steps``)."""
    from vlastack.apps.demo import demo_config
    from vlastack.train.trainer import Trainer

    torch.set_num_threads(2)
    extra = [f"train.rtc.max_delay={MAX_DELAY}"] if name == "rtc_trained" else []
    over = [o for o in OVERRIDES if not o.startswith(("train.steps", "train.save_every"))]
    cfg = demo_config("tiny", None, [*over, f"train.steps={steps}", f"train.save_every={steps}", *extra])
    _log(f"resuming {name} to {steps} steps", t0)
    t1 = time.perf_counter()
    summary = Trainer(cfg, data_path=OUT / "data", run_dir=OUT / name, resume=True).fit()
    prev = json.loads((OUT / name / "bench_train.json").read_text())
    info = {
        "train_wall_s": prev["train_wall_s"] + time.perf_counter() - t1,
        "final_loss": summary.get("final_loss"),
        "note": f"{STEPS} steps, then resumed to {steps} (LR schedule re-targeted at {steps} steps)",
    }
    (OUT / name / "bench_train.json").write_text(json.dumps(info))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=["all", "train", "eval", "resume"], default="all")
    ap.add_argument("--policy", choices=["plain", "rtc_trained"], default="plain", help="--phase resume")
    ap.add_argument("--steps", type=int, default=900, help="--phase resume: train on to this step")
    ap.add_argument("--episodes", type=int, default=EVAL_EPISODES, help="per task, method and delay")
    ap.add_argument("--threads", type=int, default=2, help="--phase train: torch threads")
    ap.add_argument("--load-note", default="", help="what else ran on the machine (recorded)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.phase in ("all", "train"):
        train(t0, args.threads)
    if args.phase == "resume":
        resume(args.policy, args.steps, t0)
    if args.phase in ("all", "eval"):
        run_eval(t0, args.episodes, args.load_note)


if __name__ == "__main__":
    main()
