"""``vla demo``: demonstrations -> tiny policy -> closed-loop evaluation -> report folder.

    vla demo [--out runs/demo] [--minutes N] [overrides]     # ~15 minutes on 2 CPU cores

Steps: (1) the scripted expert writes a LeRobot v3 dataset of the built-in suite (seeds from 0);
(2) the ``tiny`` preset with the demo recipe trains on it: vlastack/configs/demo.yaml (bf16
autocast) where a start-up micro-benchmark finds bf16 matmuls clearly faster than fp32 (CPUs with
avx512_bf16/AMX, GPUs), else with demo_fp32.yaml on top; ``train.precision=...`` overrides. It
says how long the run will take from a measured step, and compiles the step only where that pays
for the first, compiling step (``compile_pays``); with ``--minutes N``, a CPU too slow for the
recipe's steps to end within N minutes trains fewer (``fit_steps``); (3) the final policy is evaluated on
``eval.episodes`` episodes with seeds from ``eval.seed`` (1,000,000: never used for data), beside
the random policy and the scripted expert, and twice more with its camera images blanked and
with its instruction replaced, to show that it uses vision and language; (4) the report folder
gets the config, loss curve, per-task success table (Markdown + JSON) and rollout videos.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vlastack.config import (
    Config,
    apply_overrides,
    from_dict,
    load_config,
    load_yaml,
    packaged_yaml,
    parse_override,
    save_yaml,
)
from vlastack.train.precision import choose_precision, matmul_shapes

DEMO_EPISODES = 2000
# DART-style noise on executed expert actions, so demos include small recoveries. Not more: with
# perfect perception an MLP imitates these experts 100% at 0.1 but 26% at 0.3, where the noise
# scatters the gripper and phase switches (sim/imitability.py, bench/results/imitability.json).
DATA_NOISE = 0.1
VIDEO_QUALITY = "lossless"  # training frames equal the raw frames the policy sees in evaluation
REPLACED_PROMPT = "do the task"
# The controls (random, expert, blanked images, replaced instruction) are there to show ~0% and
# 100%: 40 episodes (10 per task) bound a 0-2% control under ~9% (95%), and the two ablations,
# whose failing episodes run to the step limit, took half of the evaluation time at 100 each.
CONTROL_EPISODES = 40
QUICK = ["train.steps=60", "train.log_every=10", "train.save_every=60", "eval.episodes=20"]


def recipe(precision: str = "bf16") -> dict[str, Any]:
    """The demo recipe as a dict: vlastack/configs/demo.yaml, with demo_fp32.yaml on top for fp32."""
    data = yaml.safe_load(packaged_yaml("demo"))
    if precision != "bf16":
        for section, values in yaml.safe_load(packaged_yaml(f"demo_{precision}") or "{}").items():
            data.setdefault(section, {}).update(values)
    return data


def demo_config(
    preset: str = "tiny",
    config: str | None = None,
    overrides: list[str] | tuple = (),
    precision: str = "bf16",
) -> Config:
    """``preset`` + the demo recipe for ``precision`` + the user's YAML + dotted overrides."""
    base = from_dict(recipe(precision), base=load_config(preset))
    if config:
        base = load_yaml(config, base=base)
    return apply_overrides(base, list(overrides))


def explicit_precision(config: str | None, overrides: list[str] | tuple) -> str | None:
    """The ``train.precision`` the user set (the last override, else their YAML), or None."""
    for o in reversed(list(overrides)):
        key, value = parse_override(o)
        if key == ["train", "precision"]:
            return str(value)
    if config:
        p = Path(config)
        text = p.read_text() if p.exists() else (packaged_yaml(config) or "")
        return ((yaml.safe_load(text) or {}).get("train") or {}).get("precision")
    return None


# Steps of each recipe when torch.compile is unavailable (the recipes' own counts assume compiled
# steps, ~1.1-1.25x faster: bench/results/train_cpu.json).
EAGER_STEPS = {"bf16": 3400, "fp32": 2000}


def cxx_compiler() -> str | None:
    """The C++ compiler torch.compile's CPU backend would build its kernels with, or None."""
    for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


# The recipes' step counts fit 15 minutes on the 2-core CPUs they were tuned on. On a slower CPU
# `vla demo` says up front how long the recipe will take, from its own measured eager step, and
# `--minutes N` trains fewer steps to end within N minutes instead. Measured on two 2-core machines
# (docs/first-run.md): an Intel Xeon (Sapphire Rapids; 0.19-0.21 s per eager step) and an AVX2-only
# AMD EPYC VM (0.38 s at 48 px, 0.57 s at 64 px, and every other phase ~2.5-3x slower). Cutting
# steps costs success (there, 45% at 1463 steps against 77-80% at 2200): the default keeps them.
BUDGET_MIN = 15.0
MARGIN_S = 20.0
# After training starts: preloading the frames, the evaluations and the report. They run the
# simulator as generation does, so they are sized from the measured generation time. On the AVX2
# EPYC (2026-11-27), episodes side by side (eval.batch_episodes) and the controls on
# CONTROL_EPISODES: preload 31 s + evaluations 60 s + report 1 s after 91 s of generation, 1.0x
# (with the controls on 100 episodes it was 30 + 104 + 2 s after 100 s, 1.36x); without the
# blank-image and replaced-instruction evaluations ~0.7x.
AFTER_PER_GENERATE = {"ablations": 1.0, "no_ablations": 0.7}
# Training steps, in units of the measured probe (three eager steps on a synthetic batch), per
# recipe precision, i.e. per CPU kind (bf16 runs where bf16 is native, fp32 on AVX2-only CPUs):
# ``first``, the first compiled step with a cold Inductor cache (a first run; less from the cache);
# ``compiled`` and ``eager``, a training step on real batches. fp32 on the AVX2 EPYC (2026-11-27,
# 48 px): probe 0.28 s, first compiled step 123 s, compiled steps 0.28-0.29 s, eager 0.325 s (that
# probe was optimistic). bf16 on the Xeon (2026-11-25): probe ~0.21 s, first step 48 s, compiled
# steps ~0.17 s. Three more demos on the EPYC (later that day) read probes of 0.35, 0.34 and 0.26 s
# for eager steps of 0.29, 0.31 and 0.30 s: the VM's noise, so ``eager`` is the mean ratio, ~1.0,
# and ``compiled`` keeps the measured compiled/eager ratio (0.28-0.29 against 0.325 s), ~0.9.
STEP_OVER_PROBE = {
    "fp32": {"first": 440, "compiled": 0.9, "eager": 1.0},
    "bf16": {"first": 230, "compiled": 0.83, "eager": 1.0},
}
# Compiling pays where its cheaper steps repay the first one (``compile_pays``): the fp32 recipe's
# 2200 steps on the EPYC took 770 s compiled with a cold cache against ~715 s eager.


def time_training_step(cfg: Config, steps: int = 3) -> float:
    """Median wall seconds of one eager training step of ``cfg`` (its model, batch size and
    precision) on a synthetic batch, after one warm-up step. A few seconds on a 2-core CPU."""
    import statistics

    import torch

    from vlastack.batch import dummy_batch
    from vlastack.models import build_model
    from vlastack.train.optim import build_optimizer
    from vlastack.train.step import train_step

    rng = torch.get_rng_state()
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = build_optimizer(model, cfg.train)
    batch = dummy_batch(cfg.model, cfg.train.batch_size)
    times = []
    for i in range(steps + 1):
        t = time.perf_counter()
        train_step(model, opt, [batch], device_type="cpu", precision=cfg.train.precision)
        if i:
            times.append(time.perf_counter() - t)
    torch.set_rng_state(rng)  # the real run starts from the same generator state as without this
    return statistics.median(times)


def training_and_after_s(
    steps: int, step_s: float, compile: bool, after_s: float, precision: str = "fp32"
) -> float:
    """Predicted wall seconds from the first training step to the report, from the probe ``step_s``."""
    k = STEP_OVER_PROBE.get(precision, STEP_OVER_PROBE["fp32"])
    if compile:
        return (k["first"] + steps * k["compiled"]) * step_s + after_s
    return steps * k["eager"] * step_s + after_s


def compile_pays(steps: int, precision: str) -> bool:
    """Whether ``steps`` compiled steps, the cold first one included, end before eager ones."""
    k = STEP_OVER_PROBE.get(precision, STEP_OVER_PROBE["fp32"])
    return k["first"] + steps * k["compiled"] < steps * k["eager"]


def fit_steps(
    steps: int, seconds_left: float, step_s: float, compile: bool, after_s: float, precision: str = "fp32"
) -> tuple[int, bool, str]:
    """(steps, compile, why): the recipe's ``steps`` where they end within ``seconds_left`` with
    ``after_s`` still to come (preload, evaluations, report), judged from ``step_s`` (the eager
    probe, measured); else as many as do, compiled or eagerly, whichever trains more (compiling
    pays for itself only over enough steps)."""
    k = STEP_OVER_PROBE.get(precision, STEP_OVER_PROBE["fp32"])
    avail = seconds_left - MARGIN_S - after_s
    eager = int(avail / (k["eager"] * step_s))
    compiled = int((avail - k["first"] * step_s) / (k["compiled"] * step_s)) if compile else -1
    budget = f"{seconds_left / 60:.0f} minutes"
    if max(eager, compiled) >= steps:
        use_compile = compile and compiled >= steps and compile_pays(steps, precision)
        return steps, use_compile, f"{steps} steps fit in the {budget} left ({step_s:.2f} s per eager step)"
    use_compile = compile and compiled >= eager
    fit = min(steps, max(compiled, eager, 100))  # never a run too short to mean anything
    how = "compiled" if use_compile else "eager (too few steps here for compiling to pay for itself)"
    why = (
        f"{fit} {how} steps instead of the recipe's {steps}: an eager step takes {step_s:.2f} s on this "
        f"CPU, and {steps} would not end in the {budget} left of --minutes"
    )
    return fit, use_compile, why


def _user_set(overrides: list[str] | tuple, key: str) -> bool:
    return any(parse_override(o)[0] == ["train", key] for o in overrides)


def pick_precision(
    preset: str, config: str | None, overrides: list[str] | tuple, device_type: str, timer=None
) -> tuple[str, str]:
    """(precision, one-line reason): the user's ``train.precision`` when given, else measured."""
    given = explicit_precision(config, overrides)
    if given is not None:
        return given, f"{given}: train.precision={given} was given"
    cfg = demo_config(preset, config, overrides)
    shapes = matmul_shapes(cfg.model, cfg.train.batch_size)
    choice = choose_precision(shapes, device_type, timer=timer)
    return choice.precision, choice.reason


class AblatedPolicy:
    """A trained policy whose observations are altered: ``blank_images`` or ``replace_prompt``."""

    def __init__(self, path: str, mode: str) -> None:
        from vlastack.infer.policy import Policy

        self.inner, self.mode = Policy.from_pretrained(path), mode

    def reset(self) -> None:
        self.inner.reset()

    @property
    def batchable(self) -> bool:
        return self.inner.batchable

    def _alter(self, obs: dict) -> dict:
        if self.mode == "blank_images":
            return {**obs, "images": {k: np.zeros_like(v) for k, v in obs["images"].items()}}
        return {**obs, "prompt": REPLACED_PROMPT}

    def infer(self, obs: dict) -> dict[str, np.ndarray]:
        return self.inner.infer(self._alter(obs))

    def infer_batch(self, obs_list: list[dict], streams: list | None = None) -> list[dict[str, np.ndarray]]:
        return self.inner.infer_batch([self._alter(o) for o in obs_list], streams)


def ablated(path: str, mode: str) -> AblatedPolicy:
    """Module-level factory (picklable through ``functools.partial``) for evaluation workers."""
    return AblatedPolicy(path, mode)


def _log(msg: str, t0: float) -> None:
    print(f"[demo {time.perf_counter() - t0:6.0f}s] {msg}", flush=True)


def run_demo(
    out: str | Path = "runs/demo",
    preset: str = "tiny",
    config: str | None = None,
    overrides: list[str] | tuple = (),
    episodes: int | None = None,
    eval_episodes: int | None = None,
    quick: bool = False,
    ablations: bool = True,
    minutes: float = 0.0,
) -> Path:
    """Run the whole demo; returns the report folder. ``minutes``: a wall-time budget that sizes
    the step count on CPUs slower than the recipe's (0: the recipe's steps, with the time they
    will take said at the start)."""
    import torch

    from vlastack.sim.evaluate import evaluate
    from vlastack.sim.generate import generate
    from vlastack.train.trainer import Trainer

    if minutes < 0:
        raise ValueError(f"--minutes must be 0 (no budget) or a positive number of minutes, not {minutes}")
    t0 = time.perf_counter()
    out = Path(out)
    overrides = [*(QUICK if quick else []), *overrides]
    if eval_episodes:
        overrides.append(f"eval.episodes={eval_episodes}")
    torch.set_num_threads(2)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    precision, why = pick_precision(preset, config, overrides, device_type)
    cfg = demo_config(preset, config, overrides, precision=precision)
    if cfg.train.compile and not _user_set(overrides, "compile") and not cxx_compiler():
        # The recipe's step count assumes compiled steps; eager ones get the eager budget.
        steps = EAGER_STEPS[precision] if not _user_set(overrides, "steps") else cfg.train.steps
        cfg = apply_overrides(cfg, ["train.compile=false", f"train.steps={steps}"])
        why += "; no C++ compiler found (c++, g++ or clang++), so no torch.compile and the eager step budget"
    elif cfg.train.compile:
        why += "; torch.compile of the training step (~40-130 s at the first step, less from the cache, then ~1.1-1.4x faster steps)"
    timings: dict[str, float] = {"choose_precision_s": time.perf_counter() - t0}
    _log(f"precision {cfg.train.precision}, {cfg.train.steps} steps: {why}", t0)
    episodes = episodes or (40 if quick else DEMO_EPISODES)

    _log(f"1/4 generating {episodes} expert demonstrations of the {cfg.eval.suite} suite", t0)
    data = out / "data"
    # The data is rendered at the evaluation's size, whatever the model's: it stays the same for
    # every recipe (the fp32 one trains 48 px), and the model resizes what it is given in training
    # and in evaluation alike.
    gen = generate(
        data, suite=cfg.eval.suite, episodes=episodes, workers=2, image_size=cfg.eval.image_size,
        cameras=cfg.model.camera_names, noise=DATA_NOISE, seed=0, overwrite=True,
        video_quality=VIDEO_QUALITY,
    )  # fmt: skip
    timings["generate_s"] = time.perf_counter() - t0 - timings["choose_precision_s"]

    if not quick and not _user_set(overrides, "steps") and device_type == "cpu":
        t_cal = time.perf_counter()
        step_s = time_training_step(cfg)
        timings["time_step_s"] = time.perf_counter() - t_cal
        elapsed = time.perf_counter() - t0
        after_s = timings["generate_s"] * DEMO_EPISODES / episodes * cfg.eval.episodes / 100
        after_s *= AFTER_PER_GENERATE["ablations" if ablations else "no_ablations"]
        prec = cfg.train.precision
        if minutes:
            steps, use_compile, why_steps = fit_steps(
                cfg.train.steps, minutes * 60 - elapsed, step_s, cfg.train.compile, after_s, prec
            )
        else:
            steps = cfg.train.steps
            use_compile = cfg.train.compile and compile_pays(steps, prec)
            if _user_set(overrides, "compile"):
                use_compile = cfg.train.compile  # the user's choice stands
            total = elapsed + training_and_after_s(steps, step_s, use_compile, after_s, prec)
            why_steps = f"about {total / 60:.0f} min in all on this CPU ({step_s:.2f} s per eager step)"
            if cfg.train.compile and not use_compile:
                why_steps += "; eager steps: here compiling would cost more than its faster steps save"
            if total > BUDGET_MIN * 60:
                why_steps += (
                    f"; `--minutes {BUDGET_MIN:.0f}` trains fewer steps to end sooner, at lower success "
                    "(docs/first-run.md)"
                )
        if (steps, use_compile) != (cfg.train.steps, cfg.train.compile):
            cfg = apply_overrides(cfg, [f"train.steps={steps}", f"train.compile={str(use_compile).lower()}"])
        why += f"; {why_steps}"
        _log(f"   {why_steps}", t0)
    _log(f"2/4 training tiny for {cfg.train.steps} steps ({gen['frames']} frames)", t0)
    t1 = time.perf_counter()
    run = out / "run"
    shutil.rmtree(run, ignore_errors=True)
    summary = Trainer(cfg, data_path=data, run_dir=run).fit()
    timings["train_s"] = time.perf_counter() - t1
    policy = str(run / "final" / "ema") if (run / "final" / "ema").is_dir() else str(run / "final")

    _log(
        f"3/4 closed-loop evaluation on {cfg.eval.episodes} episodes per policy (seeds from {cfg.eval.seed})",
        t0,
    )
    t2 = time.perf_counter()
    e = cfg.eval
    kw = dict(
        suite=e.suite, tasks=e.tasks, episodes=e.episodes, seed=e.seed, num_workers=e.num_workers,
        steps_per_chunk=e.steps_per_chunk, temporal_ensemble=e.temporal_ensemble,
        image_size=e.image_size, cameras=cfg.model.camera_names, batch_episodes=e.batch_episodes,
    )  # fmt: skip
    report = out / "report"
    shutil.rmtree(report, ignore_errors=True)
    results = {"trained": evaluate(policy, out_dir=report / "eval", videos=e.videos, **kw)}
    kw["episodes"] = min(e.episodes, CONTROL_EPISODES)
    _log(f"   trained policy: {results['trained']['mean_task_success']:.0%} mean task success", t0)
    specs: dict[str, Any] = {"random": "random", "expert": "expert"}
    if ablations:
        specs["blank_images"] = functools.partial(ablated, policy, "blank_images")
        specs["replaced_instruction"] = functools.partial(ablated, policy, "replace_prompt")
    for name, spec in specs.items():
        results[name] = evaluate(spec, out_dir=None, videos=0, **kw)
        _log(f"   {name}: {results[name]['mean_task_success']:.0%}", t0)
    timings["eval_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0

    _log("4/4 writing the report", t0)
    write_report(report, cfg, run, results, timings, gen, summary)
    write_html(report, cfg, run, results, timings, gen, summary, why)
    _log(f"done in {timings['total_s'] / 60:.1f} min", t0)
    return report


def write_report(
    report: Path, cfg: Config, run: Path, results: dict, timings: dict, gen: dict, summary: dict
) -> None:
    report.mkdir(parents=True, exist_ok=True)
    save_yaml(cfg, report / "config.yaml")
    if (run / "loss_curve.png").exists():
        shutil.copy(run / "loss_curve.png", report / "loss_curve.png")
    cols = list(results)
    tasks = list(results["trained"]["tasks"])
    lines = [
        "# vlastack demo report",
        "",
        f"Policy: `tiny` preset + demo recipe, {summary['steps']} steps on {gen['episodes']} expert episodes "
        f"({gen['frames']} frames). Evaluation: {_episodes_line(results)}, seeds from {cfg.eval.seed} "
        "(disjoint from the training seeds).",
        "",
        "Success rate per task (95% Wilson interval for the trained policy):",
        "",
        "| task | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for t in tasks:
        cells = []
        for c in cols:
            s = results[c]["tasks"][t]
            cell = f"{s['success_rate']:.0%}"
            if c == "trained":
                cell += f" [{s['ci95'][0]:.0%}, {s['ci95'][1]:.0%}]"
            cells.append(cell)
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines.append(
        "| **mean** | " + " | ".join(f"**{results[c]['mean_task_success']:.0%}**" for c in cols) + " |"
    )
    lines += [
        "",
        "`blank_images`: the same trained policy with every camera image replaced by black; "
        f"`replaced_instruction`: with the instruction replaced by {REPLACED_PROMPT!r}.",
        "",
        "Wall time: " + ", ".join(f"{k[:-2]} {v:.0f}s" for k, v in timings.items()),
        "",
        "Files: `report.html` (all of this in one page), `config.yaml`, `loss_curve.png`, `eval/eval.json`, "
        "`eval/eval.png`, `eval/videos/*.mp4`.",
    ]
    (report / "report.md").write_text("\n".join(lines) + "\n")
    compact = {
        name: {"mean_task_success": r["mean_task_success"], "overall": r["overall"],
               "tasks": {t: v["success_rate"] for t, v in r["tasks"].items()}}
        for name, r in results.items()
    }  # fmt: skip
    (report / "results.json").write_text(
        json.dumps(
            {"results": compact, "timings_s": timings, "data": gen, "train": summary_no_losses(summary)},
            indent=2,
        )
    )


def write_html(
    report: Path, cfg: Config, run: Path, results: dict, timings: dict, gen: dict, summary: dict, why: str
) -> Path:
    """report.html: loss and LR curves, success per task for every evaluated policy, rollouts of
    the trained policy (successes and failures), the timings and the resolved config."""
    from vlastack.diagnostics.run_report import html_report
    from vlastack.train.logs import read_metrics

    trained = results["trained"]
    cards = {
        "trained policy: mean task success": f"{trained['mean_task_success']:.0%}",
        "random policy": f"{results['random']['mean_task_success']:.0%}" if "random" in results else "-",
        "training steps": f"{summary['steps']} ({cfg.train.precision})",
        "total wall time": f"{timings['total_s'] / 60:.1f} min",
    }
    intro = (
        f"tiny preset + demo recipe on {gen['episodes']} expert episodes ({gen['frames']} frames); "
        f"evaluation on unseen seeds: {_episodes_line(results)}. Precision {why}"
    )
    return html_report(
        report / "report.html", "vlastack demo", intro=intro, cards=cards,
        metrics=read_metrics(run / "metrics.jsonl"), evals=results, videos=trained.get("videos", []),
        config=cfg, timings=timings,
    )  # fmt: skip


def _episodes_line(results: dict) -> str:
    """'100 episodes for the trained policy, 40 for each control' (or one count for all)."""
    n = results["trained"]["overall"]["n"]
    others = {r["overall"]["n"] for k, r in results.items() if k != "trained"}
    if not others or others == {n}:
        return f"{n} episodes per policy"
    return f"{n} episodes for the trained policy, {'/'.join(map(str, sorted(others)))} for each control"


def summary_no_losses(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "losses"}
