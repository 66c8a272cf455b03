"""Real-time chunking under inference delay: success and smoothness of every execution method, in
both action representations, by our protocol and by the published one.

    python -m bench.rtc --representation absolute --protocol published   # data, training, eval, JSON
    python -m bench.rtc --representation absolute --protocol ours --phase train   # policies only
    python -m bench.rtc --representation delta --protocol ours --phase eval       # reuse them

Data: scripted-expert demos (each going on 8 expert steps past its success, so chunks' later
actions are trained near the goal) of two dynamic families (``reach_moving``, ``reach_switch``) and
one static one (``reach``), recorded as position deltas or as absolute gripper targets
(``--representation``; the same trajectories, sim/env.py). Policies: the ``tiny`` demo recipe
(grounding head, EMA, bf16 autocast; the scene camera only and batch 16 to fit a shared 2-core
CPU), trained twice per action horizon with the same data, seed and step budget: a plain flow
policy and a training-time-RTC one (``train.rtc.max_delay``).

Protocols (``--protocol``):
- ``ours``: chunk H = 16, delays d in {0, 1, 2, 4, 8}, execution horizon s = max(4, d); every method
  (sync, naive_async, temporal_ensemble, rtc_inference with beta 5 / beta 1 / overlap 6,
  rtc_training).
- ``published`` (Black et al. 2025, arXiv 2506.07339, Kinetix): H = 8, d in {0, .., 4}, every s in
  [max(1, d), H - d], beta = 5 with the exponential soft mask (models/heads/flow/rtc.py); sync,
  naive_async, rtc_inference, rtc_training. Its goals (``goals_by_representation``) are read at
  s = 4, the one horizon every d in 0..4 allows, so d alone changes between the cells compared.
  Bidirectional decoding (BID, Liu et al., arXiv 2408.17355) runs apart, with ``--phase bid``:
  its backward coherence (``eval.execution.method=bid``: K = 8 plain chunks per request, the one
  closest to the leftover runs) beside naive execution on the same plain policy, at s = 4, into
  ``bench/results/rtc_bid.json``. Its forward contrast needs a second, weaker checkpoint and is not
  used.

Per (method, d, s): success per task with Wilson intervals, the max / mean action jump at chunk
boundaries, starved and fallback counts; the cost of inference-time RTC's guided sampling against
plain sampling (thread time, interleaved medians). Results: ``bench/results/rtc.json``
(``representations.<rep>.<protocol>`` and ``goals_by_representation``; the first measurement,
delta actions by our protocol, stays in ``rows`` / ``goals``), ``docs/rtc_<rep>_<protocol>.png``,
and the table between ``<!-- rtc-table-<rep>-<protocol> -->`` markers in docs/research/rtc.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

OUT = Path("runs/bench_rtc")


@dataclass(frozen=True)
class TaskSet:
    """The tasks a run trains and scores on: ``dynamic`` ones (their success is the goals') and
    a static ``reach`` as a check; ``noise``: the demos' DART noise (None: the demo's)."""

    name: str
    tasks: tuple[str, ...]
    dynamic: tuple[str, ...]
    noise: float | None = None
    static: str = "reach"  # the static control task


TASK_SETS = {
    "dynamic": TaskSet(
        "dynamic", ("reach_moving", "reach_switch", "reach"), ("reach_moving", "reach_switch")
    ),
    # sim/fragile.py: the same reaches carrying a cup that spills above an acceleration of 1.8 cm
    # per step^2, with the velocity in the state (the experts with the demo's DART noise peak at
    # 1.5-1.7 cm and spill none of 120 episodes)
    "fragile": TaskSet(
        "fragile", ("carry_moving", "carry_switch", "carry"), ("carry_moving", "carry_switch"), None, "carry"
    ),
}
TASK_SET = TASK_SETS["dynamic"]
TASKS, DYNAMIC = TASK_SET.tasks, TASK_SET.dynamic


def use_task_set(name: str) -> None:
    """Run on another task set (``--tasks``): every function here reads these globals."""
    global TASK_SET, TASKS, DYNAMIC
    TASK_SET = TASK_SETS[name]
    TASKS, DYNAMIC = TASK_SET.tasks, TASK_SET.dynamic


def _suffix() -> str:
    """What sets a run apart from the first one: the task set and a step budget other than 3000."""
    return ("" if TASK_SET.name == "dynamic" else f"_{TASK_SET.name}") + (
        "" if STEPS == 3000 else f"_steps{STEPS}"
    )


def rep_dir(rep: str) -> Path:
    return OUT / f"{rep}{_suffix()}"


def block_key(proto_name: str) -> str:
    """Where a run's block goes under ``representations.<rep>``: the protocol, plus the task set
    when it is not the dynamic one and the step budget when it is not 3000."""
    return f"{proto_name}{_suffix()}"


EPISODES = 600  # demonstrations, round-robin over TASKS
STEPS = 3000  # training steps per policy (a steps budget: the result does not depend on load)
CAMERAS = ("scene",)
# Demos go on for this many expert steps after the success, so a chunk's later actions are
# trained near the goal too (asynchronous execution runs actions d.. of each chunk).
SETTLE = 8
COMMON = [
    "train.log_every=100",
    "train.batch_size=16",
    "data.num_workers=0",
    "model.camera_names=[scene]",
]
EVAL_EPISODES = 25  # per task and (method, delay, s)
ENSEMBLE = 0.1

# (label, policy, method, execution extras)
RUNS_OURS = (
    ("sync", "plain", "sync", {}),
    ("naive_async", "plain", "naive_async", {}),
    ("temporal_ensemble", "plain", "temporal_ensemble", {}),
    ("rtc_inference", "plain", "rtc_inference", {}),
    ("rtc_inference beta=1", "plain", "rtc_inference", {"guidance_max": 1.0}),
    ("rtc_inference overlap=6", "plain", "rtc_inference", {"overlap": 6}),
    ("rtc_training", "rtc_trained", "rtc_training", {}),
    ("naive_async (rtc-trained policy)", "rtc_trained", "naive_async", {}),
)
RUNS_BID = (  # --phase bid: the same plain policy, s = the goal horizon
    ("naive_async", "plain", "naive_async", {}),
    ("bid K=8", "plain", "bid", {"bid_samples": 8, "bid_noise_scale": 1.0}),
)
RUNS_PUBLISHED = (
    ("sync", "plain", "sync", {}),
    ("naive_async", "plain", "naive_async", {}),
    ("rtc_inference", "plain", "rtc_inference", {"guidance_max": 5.0}),
    # LeRobot's form of the guidance (the weighted error, no VJP through the network), our sampler
    ("rtc_inference identity", "plain", "rtc_inference", {"guidance_max": 5.0, "guidance": "identity"}),
    ("rtc_training", "rtc_trained", "rtc_training", {}),
    # the policy is told at least one committed action, even at d = 0: the new chunk continues the
    # executing one (ExecutionConfig.min_commit)
    ("rtc_training min_commit=1", "rtc_trained", "rtc_training", {"min_commit": 1}),
)


@dataclass(frozen=True)
class Protocol:
    name: str
    horizon: int  # chunk length H
    delays: tuple[int, ...]
    max_delay: int  # training-time RTC: d ~ U[0, max_delay] in training
    runs: tuple
    goal_s: int  # the execution horizon the goals are read at

    def horizons(self, d: int) -> list[int]:
        """Execution horizons s run at delay d."""
        if self.name == "ours":
            return [max(4, d)]
        return list(range(max(1, d), self.horizon - d + 1))


PROTOCOLS = {
    "ours": Protocol("ours", 16, (0, 1, 2, 4, 8), 8, RUNS_OURS, 4),
    "published": Protocol("published", 8, (0, 1, 2, 3, 4), 4, RUNS_PUBLISHED, 4),
}


def _log(msg: str, t0: float) -> None:
    print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)


def run_dir(rep: str, proto: Protocol, name: str) -> Path:
    return rep_dir(rep) / f"h{proto.horizon}_{name}"


def policy_dir(rep: str, proto: Protocol, name: str) -> Path:
    run = run_dir(rep, proto, name)
    return run / "final" / "ema" if (run / "final" / "ema").is_dir() else run / "final"


def overrides(proto: Protocol, name: str) -> list[str]:
    extra = []
    if name.startswith("rtc_trained"):  # "rtc_trained", or "rtc_trained_d<N>" for max_delay N
        tail = name.removeprefix("rtc_trained")
        extra = [f"train.rtc.max_delay={int(tail.removeprefix('_d')) if tail else proto.max_delay}"]
    return [f"model.action_horizon={proto.horizon}", f"train.steps={STEPS}", f"train.save_every={STEPS}",
            *COMMON, *extra]  # fmt: skip


def train(
    rep: str, proto: Protocol, t0: float, threads: int = 2, names: tuple[str, ...] = ("plain", "rtc_trained")
) -> dict:
    from vlastack.apps.demo import DATA_NOISE, demo_config, pick_precision
    from vlastack.sim.generate import generate
    from vlastack.train.trainer import Trainer

    torch.set_num_threads(threads)
    data = rep_dir(rep) / "data"
    info: dict = {}
    if not (data / "meta" / "vlastack_sim.json").exists():
        _log(f"generating {EPISODES} {rep} demos of {', '.join(TASKS)}", t0)
        info["generate"] = generate(
            data, suite="builtin", tasks=TASKS, episodes=EPISODES, workers=2, cameras=CAMERAS,
            noise=DATA_NOISE if TASK_SET.noise is None else TASK_SET.noise,
            seed=0, overwrite=True, video_quality="lossless", progress=False, settle=SETTLE,
            action_representation=rep,
        )  # fmt: skip
    for name in names:
        if policy_dir(rep, proto, name).is_dir():
            continue
        # the demo's own choice: bf16 only where it measures faster (an AVX2-only CPU runs bf16
        # ~10x slower: 1.26 s/step here against fp32's 0.13 s on a 2-core AMD EPYC)
        precision, why = pick_precision("tiny", None, overrides(proto, name), "cpu")
        cfg = demo_config("tiny", None, [*overrides(proto, name), f"train.precision={precision}"])
        _log(f"training {rep} h{proto.horizon} {name} ({cfg.train.steps} steps; {why})", t0)
        run = run_dir(rep, proto, name)
        shutil.rmtree(run, ignore_errors=True)
        t1, c1 = time.perf_counter(), time.process_time()
        summary = Trainer(cfg, data_path=data, run_dir=run).fit()
        info[name] = {"train_wall_s": time.perf_counter() - t1, "train_cpu_s": time.process_time() - c1,
                      "final_loss": summary.get("final_loss"), "precision": precision}  # fmt: skip
        (run / "bench_train.json").write_text(json.dumps(info[name]))
    return info


def evaluate_all(
    rep: str, proto: Protocol, t0: float, episodes: int, workers: int = 2, runs: tuple | None = None,
    goal_s_only: bool = False,
) -> list[dict]:  # fmt: skip
    """Every (d, s, run) cell of the protocol (``runs``: other runs instead of its own;
    ``goal_s_only``: only s = its goal horizon)."""
    from vlastack.config import EvalConfig, ExecutionConfig
    from vlastack.sim.evaluate import evaluate

    rows = []
    for d in proto.delays:
        for s in [proto.goal_s] if goal_s_only else proto.horizons(d):
            for label, pol, method, extra in runs or proto.runs:
                ex = ExecutionConfig(method=method, delay=d, **extra)
                cfg = EvalConfig(
                    suite="builtin", tasks=TASKS, episodes=episodes * len(TASKS), num_workers=workers,
                    steps_per_chunk=s, videos=0, execution=ex,
                    temporal_ensemble=ENSEMBLE if method == "temporal_ensemble" else 0.0,
                )  # fmt: skip
                res = evaluate(str(policy_dir(rep, proto, pol)), cfg, cameras=CAMERAS)
                assert res["config"]["action_representation"] == rep, res["config"]
                row = result_row(res, cfg, label=label, policy=pol, method=method, delay=d, s=s,
                                 horizon=proto.horizon, representation=rep, execution=extra)  # fmt: skip
                rows.append(row)
                _log(
                    f"{rep} {proto.name} d={d} s={s} {label:>34}: dynamic {row['dynamic_success']:.0%}, "
                    f"reach {row['static_success']:.0%}, mean jump {row['dynamic_mean_jump']:.3f}"
                    + (f", spilled {row['dynamic_spilled']:.0%}" if "dynamic_spilled" in row else ""),
                    t0,
                )
    return rows


def result_row(res: dict, cfg, **labels) -> dict:
    """One cell of the grid from ``evaluate``'s result: per-task success, the dynamic tasks'
    success with its 95% interval, boundary jumps, starved/fallback steps and the eval seeds."""
    from vlastack.sim.evaluate import wilson

    dyn = [e for e in res["episodes"] if e["task"] in DYNAMIC]
    jumps = [e for e in dyn if e.get("boundaries")]
    won = sum(e["success"] for e in dyn)
    return {
        **labels,
        "success": {t: v["success_rate"] for t, v in res["tasks"].items()},
        "ci95": {t: v["ci95"] for t, v in res["tasks"].items()},
        "dynamic_success": won / len(dyn),
        "dynamic_ci95": list(wilson(won, len(dyn))),
        "dynamic_episodes": len(dyn),
        "static_success": res["tasks"][TASK_SET.static]["success_rate"],
        "dynamic_mean_jump": sum(e["mean_jump"] for e in jumps) / max(1, len(jumps)),
        "dynamic_mean_max_jump": sum(e["max_jump"] for e in jumps) / max(1, len(jumps)),
        "dynamic_max_jump": max((e["max_jump"] for e in jumps), default=0.0),
        # the jump less the motion in progress (second difference of the executed actions)
        "dynamic_mean_jump2": sum(e.get("mean_jump2", 0.0) for e in jumps) / max(1, len(jumps)),
        **spill_stats(dyn),
        "starved_steps": res["overall"].get("starved_steps", 0),
        "fallbacks": res["overall"].get("fallbacks", 0),
        "eval_seeds": [cfg.seed, cfg.seed + cfg.episodes - 1],
        "wall_s": res["wall_s"],
    }


def spill_stats(dyn: list[dict]) -> dict:
    """Fragile tasks: the fraction of episodes whose cup spilled, and the mean of each episode's
    largest velocity change (m / step^2); nothing for tasks without a cup."""
    if not dyn or not all("spilled" in e for e in dyn):
        return {}
    return {
        "dynamic_spilled": sum(e["spilled"] for e in dyn) / len(dyn),
        "dynamic_mean_peak_accel": sum(e["peak_accel"] for e in dyn) / len(dyn),
    }


def interleaved_ms(calls: dict, clocks: dict, repeats: int) -> dict[str, dict[str, float]]:
    """Median ms per call and clock, after 3 warm-up rounds, the calls in rotating order: each runs
    right after every other as often (in a fixed order training-time RTC always ran after the
    guided call, whose autograd buffers had just been freed, and read 1.07x, not 1.02x)."""
    import numpy as np

    times = {c: {k: [] for k in calls} for c in clocks}
    for _ in range(3):
        for f in calls.values():
            f()
    names = list(calls)
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t0 = {c: clock() for c, clock in clocks.items()}
            calls[k]()
            for c, clock in clocks.items():
                times[c][k].append((clock() - t0[c]) * 1e3)
    return {c: {k: float(np.median(v)) for k, v in by.items()} for c, by in times.items()}


def inference_cost(rep: str, proto: Protocol, repeats: int = 40) -> dict:
    """Cost per chunk (batch 1, 2 torch threads) of plain sampling, guided (inference-time RTC) and
    clean-prefix (training-time RTC) sampling, interleaved so load changes hit all three alike, by
    three clocks: wall (the latency a robot waits; meaningful on an idle machine), process CPU
    (every thread's compute) and the calling thread's CPU. The overheads are wall-clock ratios.

    Earlier runs read the calling thread's CPU only, in a fixed order (plain, guided,
    training-time): 1.08x for training-time RTC, which never ran after anything but the guided call."""

    from vlastack.infer.policy import Policy
    from vlastack.sim.env import make_env

    torch.set_num_threads(2)
    env = make_env(DYNAMIC[0], cameras=CAMERAS, seed=1_000_000, action_representation=rep)
    obs, _ = env.reset(seed=1_000_000)
    env.close()
    plain = Policy.from_pretrained(policy_dir(rep, proto, "plain"))
    ident = Policy.from_pretrained(policy_dir(rep, proto, "plain"), guidance="identity")
    trained = Policy.from_pretrained(policy_dir(rep, proto, "rtc_trained"))
    d = min(4, proto.horizon // 2)
    prefix = plain.infer(obs)["actions"][d:]
    calls = {
        "plain": lambda: plain.infer(obs),
        "rtc_inference": lambda: plain.infer({**obs, "action_prefix": prefix, "inference_delay": d}),
        "rtc_inference_identity": lambda: ident.infer({**obs, "action_prefix": prefix, "inference_delay": d}),
        "rtc_training": lambda: trained.infer(
            {**obs, "action_prefix": prefix, "inference_delay": d, "rtc_method": "rtc_training"}
        ),
    }
    clocks = {"wall": time.perf_counter, "process": time.process_time, "thread": time.thread_time}
    med = interleaved_ms(calls, clocks, repeats)
    return {
        "ms_median": med,
        "thread_ms_median": med["thread"],
        "rtc_inference_overhead": med["wall"]["rtc_inference"] / med["wall"]["plain"],
        "rtc_training_overhead": med["wall"]["rtc_training"] / med["wall"]["plain"],
        "rtc_inference_identity_overhead": med["wall"]["rtc_inference_identity"] / med["wall"]["plain"],
        "overhead_by_clock": {
            c: {
                k: round(m[k] / m["plain"], 4)
                for k in ("rtc_inference", "rtc_inference_identity", "rtc_training")
            }
            for c, m in med.items()
        },
        "repeats": repeats,
        "action_horizon": proto.horizon,
        "num_denoise_steps": plain.cfg.head_options.num_denoise_steps,
        "note": "one chunk at batch 1, 2 torch threads; overheads are wall-clock ratios (measure alone: "
        "--phase cost); process = CPU of every thread, thread = the calling thread's CPU only",
    }


def goals(rows: list[dict], proto: Protocol, labels: tuple[str, ...] | None = None) -> dict:
    """Per method: dynamic success at d = 0 and d = 4 (at s = ``proto.goal_s``), the fraction kept,
    and the mean boundary jump against naive async's at every d >= 1."""
    by = {(r["label"], r["delay"], r.get("s", 4)): r for r in rows}
    s = proto.goal_s
    labels = labels or tuple(dict.fromkeys(r["label"] for r in rows))
    naive = {
        d: by[("naive_async", d, s)]["dynamic_mean_jump"] for d in proto.delays if ("naive_async", d, s) in by
    }
    out = {}
    naive2 = {
        d: by[("naive_async", d, s)].get("dynamic_mean_jump2")
        for d in proto.delays
        if ("naive_async", d, s) in by and by[("naive_async", d, s)].get("dynamic_mean_jump2")
    }
    for label in labels:
        if (label, 0, s) not in by or (label, 4, s) not in by:
            continue
        s0, s4 = by[(label, 0, s)]["dynamic_success"], by[(label, 4, s)]["dynamic_success"]
        g = {"dynamic_success_d0": s0, "dynamic_success_d4": s4, "kept_at_d4": s4 / s0 if s0 else None,
             "s": s, "episodes": by[(label, 4, s)].get("dynamic_episodes"), "protocol": proto.name,
             "eval_seeds": by[(label, 4, s)].get("eval_seeds")}  # fmt: skip
        if label != "naive_async":
            g["mean_jump_vs_naive"] = {
                d: by[(label, d, s)]["dynamic_mean_jump"] / naive[d] if naive.get(d) else None
                for d in proto.delays
                if d >= 1 and (label, d, s) in by
            }
            if naive2:  # the jump less the motion in progress (rows measured since 2026-11-27)
                g["mean_jump2_vs_naive"] = {
                    d: by[(label, d, s)].get("dynamic_mean_jump2", 0.0) / naive2[d] if naive2.get(d) else None
                    for d in proto.delays
                    if d >= 1 and (label, d, s) in by
                }
        if "dynamic_spilled" in by[(label, 4, s)]:
            g["spilled_d0"] = by[(label, 0, s)]["dynamic_spilled"]
            g["spilled_d4"] = by[(label, 4, s)]["dynamic_spilled"]
        out[label] = g
    naive_d4 = by[("naive_async", 4, s)]["dynamic_success"] if ("naive_async", 4, s) in by else None
    for label, g in out.items():
        if label not in ("sync", "temporal_ensemble") and not label.startswith("naive_async"):
            g["kept_goal_met"] = g["kept_at_d4"] is not None and g["kept_at_d4"] >= 0.9
            g["beats_naive_by_30_at_d4"] = naive_d4 is not None and g["dynamic_success_d4"] - naive_d4 >= 0.30
            jumps = [v for v in g.get("mean_jump_vs_naive", {}).values() if v is not None]
            g["jump_goal_met"] = bool(jumps) and max(jumps) <= 1 / 3
    return out


def _plotted_s(proto: Protocol, d: int) -> int:
    """The execution horizon drawn at delay d: ours runs one per d; the published sweep is drawn at
    the goals' s."""
    return proto.horizons(d)[0] if proto.name == "ours" else proto.goal_s


def plot(rows: list[dict], proto: Protocol, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, *_ in proto.runs:
        rs = sorted((r for r in rows if r["label"] == label and r["s"] == _plotted_s(proto, r["delay"])),
                    key=lambda r: r["delay"])  # fmt: skip
        ds = [r["delay"] for r in rs]
        axes[0].plot(ds, [r["dynamic_success"] for r in rs], marker="o", label=label)
        axes[1].plot(ds, [r["dynamic_mean_jump"] for r in rs], marker="o", label=label)
    axes[0].set(xlabel="inference delay d (control steps)", ylabel="success on dynamic tasks", ylim=(0, 1.05))
    axes[1].set(xlabel="inference delay d (control steps)", ylabel="mean action jump at chunk boundaries")
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(rows: list[dict], proto: Protocol) -> str:
    spill = all("dynamic_spilled" in r for r in rows)
    a, b = DYNAMIC
    lines = [
        f"| method | d | s | {a} | {b} | dynamic [95% CI] | {TASK_SET.static} (static) | mean jump | max jump | starved |"
        + (" spilled | mean peak accel |" if spill else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if spill else ""),
    ]
    order = [x[0] for x in proto.runs]
    for r in sorted(rows, key=lambda r: (order.index(r["label"]), r["delay"], r.get("s", 4))):
        sr = r["success"]
        legacy = r["method"] == "sync" and r["delay"] == 0  # the synchronous path keeps no jump stats
        jumps = "n/a | n/a" if legacy else f"{r['dynamic_mean_jump']:.3f} | {r['dynamic_max_jump']:.3f}"
        ci = f" [{r['dynamic_ci95'][0]:.0%}, {r['dynamic_ci95'][1]:.0%}]" if "dynamic_ci95" in r else ""
        lines.append(
            f"| {r['label']} | {r['delay']} | {r.get('s', max(4, r['delay']))} | {sr[a]:.0%} | "
            f"{sr[b]:.0%} | {r['dynamic_success']:.0%}{ci} | {sr[TASK_SET.static]:.0%} | {jumps} | {r['starved_steps']} |"
            + (
                f" {r['dynamic_spilled']:.0%} | {r['dynamic_mean_peak_accel'] * 100:.2f} cm |"
                if spill
                else ""
            )
        )
    return "\n".join(lines)


def cpu_flags() -> list[str]:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("Flags:")), "")
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma")
    return [f for f in line.split()[1:] if f in wanted]


def run_eval(
    rep: str, proto: Protocol, t0: float, episodes: int, load_note: str = "", workers: int = 2,
    goal_s_only: bool = False, only: tuple[str, ...] = (),
) -> None:  # fmt: skip
    """Every cell of the protocol, or (``only``) the runs with these labels, merged into the
    results already written for it (their old rows replaced, the cost kept)."""
    from bench.common import RESULTS, write_results

    path = RESULTS / "rtc.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    if only:
        prev = old["representations"][rep][block_key(proto.name)]
        cost = prev["inference_cost"]
        runs = tuple(r for r in proto.runs if r[0] in only)
        if len(runs) != len(only):
            raise SystemExit(f"--only: unknown labels {set(only) - {r[0] for r in runs}}")
        rows = [r for r in prev["rows"] if r["label"] not in only]
        rows += evaluate_all(rep, proto, t0, episodes, workers, runs=runs, goal_s_only=goal_s_only)
    else:
        cost = inference_cost(rep, proto)
        _log(f"inference cost (wall ms): {cost['ms_median']['wall']}", t0)
        rows = evaluate_all(rep, proto, t0, episodes, workers, goal_s_only=goal_s_only)
    info = {}
    for name in ("plain", "rtc_trained"):
        f = run_dir(rep, proto, name) / "bench_train.json"
        info[name] = json.loads(f.read_text()) if f.exists() else None
    block = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu_flags": cpu_flags(),
        "torch": torch.__version__,
        "load_note": load_note or "2 CPU cores; see the session's notes for other load",
        "setup": {
            "representation": rep,
            "protocol": proto.name,
            "task_set": TASK_SET.name,
            "tasks": TASKS,
            "dynamic": DYNAMIC,
            "delays": proto.delays,
            "horizons": {d: proto.horizons(d) for d in proto.delays},
            "episodes_per_task": episodes,
            "demos": EPISODES,
            "demo_noise": TASK_SET.noise,
            "settle": SETTLE,
            "train_steps": STEPS,
            "overrides": {n: overrides(proto, n) for n in ("plain", "rtc_trained")},
            "goal_s": proto.goal_s,
            "temporal_ensemble": ENSEMBLE,
            "cameras": CAMERAS,
        },
        "training": info,
        "inference_cost": cost,
        "rows": rows,
        "goals": goals(rows, proto),
    }
    old.pop("environment", None)
    key = block_key(proto.name)
    prev = old.setdefault("representations", {}).setdefault(rep, {}).get(key, {})
    # What other benches merged into the block (bench/lerobot_rtc.py's rows, bench/rtc_fragile_6k.py's
    # and bench/rtc_fragile_checks.py's checks) stays; an --only rerun keeps the block's own notes too.
    block.update({k: v for k, v in prev.items() if k not in block})
    if only and prev.get("load_note"):
        block["load_note"] = (
            f"{prev['load_note']}; {', '.join(only)} rerun {block['date']}: {block['load_note']}"
        )
    old["representations"][rep][key] = block
    reps = old["representations"][rep]
    if not _suffix():
        # The goals of record: the published protocol where it ran, else ours.
        by_rep = old.setdefault("goals_by_representation", {})
        lerobot = {
            k: v for k, v in by_rep.get(rep, {}).items() if k.startswith("lerobot_rtc")
        }  # its own bench
        by_rep[rep] = {**(reps.get("published") or reps["ours"])["goals"], **lerobot}
    else:  # another task set or step budget keeps its own goals beside them
        by_rep = old.setdefault(f"goals_by_representation{_suffix()}", {})
        lerobot = {k: v for k, v in by_rep.get(rep, {}).items() if k.startswith("lerobot_rtc")}
        by_rep[rep] = {**block["goals"], **lerobot}
    write_results("rtc", old)
    png = Path(f"docs/rtc_{rep}_{key}.png")
    plot(rows, proto, png,
         f"RTC on {' + '.join(DYNAMIC)}: {rep} actions, {proto.name} protocol (H={proto.horizon})")  # fmt: skip
    doc = Path("docs/research/rtc.md")
    if doc.exists():
        text = doc.read_text()
        a, b = f"<!-- rtc-table-{rep}-{key} -->", f"<!-- /rtc-table-{rep}-{key} -->"
        if a in text and b in text:
            doc.write_text(
                text[: text.index(a) + len(a)] + "\n" + table(rows, proto) + "\n" + text[text.index(b) :]
            )
    print(table(rows, proto))
    print(json.dumps(block["goals"], indent=1))
    _log(f"wrote {path}, {png}", t0)


def main() -> None:
    global STEPS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=["all", "train", "eval", "cost", "bid"], default="all",
                    help="cost: re-measure only the inference cost of the trained policies (on an idle CPU); "
                         "bid: bidirectional decoding beside naive execution (trains the plain policy if missing)")  # fmt: skip
    ap.add_argument("--representation", choices=["delta", "absolute"], default="absolute")
    ap.add_argument("--protocol", choices=sorted(PROTOCOLS), default="published")
    ap.add_argument("--tasks", choices=sorted(TASK_SETS), default="dynamic",
                    help="dynamic: reach_moving, reach_switch; fragile: the same carrying a cup that "
                         "spills on an abrupt velocity change (sim/fragile.py)")  # fmt: skip
    ap.add_argument("--goal-s-only", action="store_true", help="evaluate only s = the goal horizon")
    ap.add_argument("--steps", type=int, default=STEPS, help="training steps per policy (results apart)")
    ap.add_argument("--only", default="", help="--phase eval: only these run labels (comma-separated), "
                    "merged into the results already written")  # fmt: skip
    ap.add_argument("--episodes", type=int, default=EVAL_EPISODES, help="per task, method, delay and s")
    ap.add_argument("--threads", type=int, default=2, help="--phase train: torch threads")
    ap.add_argument("--workers", type=int, default=2, help="evaluation worker processes")
    ap.add_argument("--load-note", default="", help="what else ran on the machine (recorded)")
    ap.add_argument(
        "--delays", default="", help="evaluate only these delays, e.g. 0,2,4 (default: the protocol's)"
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    use_task_set(args.tasks)
    STEPS = args.steps
    proto = PROTOCOLS[args.protocol]
    if args.delays:
        proto = replace(proto, delays=tuple(int(d) for d in args.delays.split(",")))
    if args.phase in ("all", "train"):
        train(args.representation, proto, t0, args.threads)
    if args.phase in ("all", "eval"):
        only = tuple(x for x in args.only.split(",") if x)
        run_eval(
            args.representation,
            proto,
            t0,
            args.episodes,
            args.load_note,
            args.workers,
            args.goal_s_only,
            only,
        )
    if args.phase == "cost":
        remeasure_cost(args.representation, proto, args.load_note)
    if args.phase == "bid":
        train(args.representation, proto, t0, args.threads, names=("plain",))
        run_bid(args.representation, proto, t0, args.episodes, args.workers, args.load_note)


def run_bid(rep: str, proto: Protocol, t0: float, episodes: int, workers: int, load_note: str) -> None:
    """BID (backward coherence, K = 8) and naive execution on the same plain policy, at every
    delay of the protocol and s = its goal horizon: success, boundary jumps and the cost per chunk
    (wall clock, batch 1, interleaved medians) -> bench/results/rtc_bid.json."""
    from bench.common import write_results
    from vlastack.infer.policy import Policy

    s = proto.goal_s
    rows = evaluate_all(rep, proto, t0, episodes, workers, runs=RUNS_BID, goal_s_only=True)
    # cost per chunk at batch 1: plain sampling vs BID's K candidates
    from vlastack.sim.env import make_env

    torch.set_num_threads(2)
    env = make_env(DYNAMIC[0], cameras=CAMERAS, seed=1_000_000, action_representation=rep)
    obs, _ = env.reset(seed=1_000_000)
    env.close()
    policy = Policy.from_pretrained(policy_dir(rep, proto, "plain"))
    d = min(4, proto.horizon // 2)
    prefix = policy.infer(obs)["actions"][d:]
    bid = {**obs, "action_prefix": prefix, "inference_delay": d, "rtc_method": "bid"}
    calls = {"plain": lambda: policy.infer(obs), "bid": lambda: policy.infer(bid)}
    med = interleaved_ms(calls, {"wall": time.perf_counter}, 30)["wall"]
    naive = {r["delay"]: r for r in rows if r["method"] == "naive_async"}
    summary = [
        {
            "delay": r["delay"],
            "bid_dynamic_success": r["dynamic_success"],
            "naive_dynamic_success": naive[r["delay"]]["dynamic_success"],
            "bid_mean_jump_vs_naive": (
                r["dynamic_mean_jump"] / naive[r["delay"]]["dynamic_mean_jump"]
                if naive[r["delay"]]["dynamic_mean_jump"] > 0 else None
            ),
        }
        for r in rows
        if r["method"] == "bid"
    ]  # fmt: skip
    write_results("rtc_bid", {
        "representation": rep, "protocol": proto.name, "horizon": proto.horizon, "s": s,
        "episodes_per_task": episodes, "tasks": list(TASKS), "bid_samples": 8,
        "cost_ms_median": {k: round(v, 2) for k, v in med.items()},
        "bid_cost_vs_plain": round(med["bid"] / med["plain"], 2),
        "summary": summary, "rows": rows, "load_note": load_note,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    })  # fmt: skip


def remeasure_cost(rep: str, proto: Protocol, load_note: str) -> None:
    """Wall-clock cost needs an idle machine (and thread time is robust to load only up to cache
    and memory-bandwidth sharing): measure the cost again with nothing else running and record
    that it was."""
    from bench.common import RESULTS, write_results

    path = RESULTS / "rtc.json"
    old = json.loads(path.read_text())
    block = old["representations"][rep][block_key(proto.name)]
    cost = inference_cost(rep, proto)
    cost["load_note"] = load_note or "re-measured alone (--phase cost)"
    cost["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    block["inference_cost_during_eval"] = block.get("inference_cost_during_eval", block["inference_cost"])
    block["inference_cost"] = cost
    old.pop("environment", None)
    write_results("rtc", old)
    print(
        json.dumps(
            {
                k: cost[k]
                for k in ("ms_median", "overhead_by_clock", "rtc_inference_overhead", "rtc_training_overhead")
            }
        )
    )


if __name__ == "__main__":
    main()
