"""Demo recipe ablations and seed spreads: train the demo model on the demo's own data (generated
once, bit-identical to ``vla demo``'s) with a recipe variant and a training seed, evaluate the EMA
policy closed loop on the demo's 100 unseen-seed episodes, and record per-task success, step time
and the machine. Resumable: finished (variant, seed) pairs are skipped, each result is written
as soon as it exists.

    # the demo's dataset, once (same call as vla demo)
    .venv/bin/python bench/demo_seeds.py data
    # jobs VARIANT:SEED; --worker i/n takes every n-th job, so two processes share the list
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 .venv/bin/python bench/demo_seeds.py run \
        --jobs fp32_b16:0,fp32_b16:1,fp32_b16:2 --threads 1 --worker 0/2 --kind avx2
    .venv/bin/python bench/demo_seeds.py report

Variants are named recipes: overrides on top of the demo recipe for a precision (``VARIANTS``).
Results: ``bench/results/demo_ablations.json`` under ``runs[kind][variant][seed]``. CPU kind
``avx2`` means the ISA capped with ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` on an
avx512_bf16 machine (the runner refuses a kind that disagrees with what torch reports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.train import machine
from vlastack.apps.demo import DATA_NOISE, DEMO_EPISODES, VIDEO_QUALITY, demo_config

DATA = Path("runs/demo_seeds/data")
# Long runs execute from a snapshot of the tree (a git worktree) so that editing the code under
# them cannot break a run halfway; VLA_RESULTS points them at the checkout's results file.
RESULTS = Path(os.environ.get("VLA_RESULTS", Path(__file__).parent / "results" / "demo_ablations.json"))

# name -> (precision, overrides on the demo recipe for that precision)
# Each pins its step count and compile setting, so its meaning survives recipe changes.
EAGER2000 = ["train.steps=2000", "train.compile=false"]
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "fp32_2000": ("fp32", EAGER2000),  # the AVX2 recipe before compile (demo_fp32.yaml at 029ba49)
    "fp32_b16": (
        "fp32",
        ["train.compile=false", "train.batch_size=16", "train.steps=4000", "train.warmup_steps=200"],
    ),
    "fp32_floor01": ("fp32", [*EAGER2000, "train.min_lr_ratio=0.1"]),
    "fp32_ema99": ("fp32", [*EAGER2000, "train.ema_decay=0.99"]),
    "fp32_lr2": ("fp32", [*EAGER2000, "train.lr=2e-3"]),
    "fp32_crop": ("fp32", [*EAGER2000, "data.random_crop_scale=0.9"]),
    "fp32_2200c": ("fp32", ["train.steps=2200", "train.compile=true", "model.vision.image_size=64"]),  # 64 px
    # The 48 px AVX2 recipe (demo_fp32.yaml since 2026-11-26) at the step count `vla demo`'s
    # 15-minute budget chose on a 2-core AVX2-only EPYC VM (eager step 0.38 s).
    "fp32_48_1463c": ("fp32", ["train.steps=1463", "train.compile=true", "model.vision.image_size=48"]),
    "fp32_48_2200c": ("fp32", ["train.steps=2200", "train.compile=true", "model.vision.image_size=48"]),
    "bf16_3400": ("bf16", ["train.steps=3400", "train.compile=false"]),  # the bf16 recipe before compile
    "bf16_3700c": ("bf16", ["train.steps=3700", "train.compile=true"]),  # today's bf16 recipe
}


def cpu_kind() -> str:
    return "avx2" if torch.backends.cpu.get_cpu_capability() == "AVX2" else "avx512_bf16"


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": {}}


def save_result(kind: str, variant: str, seed: int, row: dict) -> None:
    """Merge one result into the file (re-read first: another worker may have written since)."""
    data = load()
    data.setdefault("runs", {}).setdefault(kind, {}).setdefault(variant, {})[str(seed)] = row
    data["variants"] = {k: {"precision": p, "overrides": o} for k, (p, o) in VARIANTS.items()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(RESULTS)


def make_data() -> None:
    from vlastack.sim.generate import generate

    cfg = demo_config("tiny", None, [])
    generate(
        DATA, suite=cfg.eval.suite, episodes=DEMO_EPISODES, workers=2, image_size=cfg.eval.image_size,
        cameras=cfg.model.camera_names, noise=DATA_NOISE, seed=0, overwrite=True, video_quality=VIDEO_QUALITY,
    )  # fmt: skip


def run_one(variant: str, seed: int, threads: int, kind: str, out_root: Path) -> dict:
    from vlastack.sim.evaluate import evaluate
    from vlastack.train.trainer import Trainer

    precision, overrides = VARIANTS[variant]
    extra = [f"train.precision={precision}", f"train.seed={seed}", f"train.num_threads={threads}"]
    cfg = demo_config("tiny", None, [*extra, *overrides], precision)
    run = out_root / kind / f"{variant}_s{seed}"
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    summary = Trainer(cfg, data_path=DATA, run_dir=run, resume=(run / "checkpoints").exists()).fit()
    train_s = time.perf_counter() - t0
    policy = str(run / "final" / "ema") if (run / "final" / "ema").is_dir() else str(run / "final")
    e = cfg.eval
    t1 = time.perf_counter()
    res = evaluate(
        policy, suite=e.suite, tasks=e.tasks, episodes=e.episodes, seed=e.seed, num_workers=0,
        steps_per_chunk=e.steps_per_chunk, image_size=e.image_size, cameras=cfg.model.camera_names,
    )  # fmt: skip
    return {
        "success": res["mean_task_success"],
        "tasks": {t: v["success_rate"] for t, v in res["tasks"].items()},
        "episodes": res["overall"]["n"],
        "eval_seed_start": e.seed,
        "steps": cfg.train.steps,
        "batch_size": cfg.train.batch_size,
        "train_s": round(train_s, 1),
        "eval_s": round(time.perf_counter() - t1, 1),
        "threads": threads,
        "final_loss": summary.get("final_loss"),
        "machine": machine(),
    }


def report() -> None:
    data = load()
    for kind, variants in data.get("runs", {}).items():
        for variant, seeds in variants.items():
            s = {int(k): v["success"] for k, v in seeds.items()}
            push = [v["tasks"].get("push", 0) for v in seeds.values()]
            print(
                f"{kind:12s} {variant:18s} seeds {sorted(s)}: "
                + ", ".join(f"{s[k]:.0%}" for k in sorted(s))
                + f"  mean {statistics.mean(s.values()):.1%} min {min(s.values()):.0%}"
                + f"  push mean {statistics.mean(push):.0%}"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["data", "run", "report"])
    ap.add_argument("--jobs", default="", help="VARIANT:SEED,...")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", default="0/1", help="i/n: take every n-th job starting at i")
    ap.add_argument("--kind", default="", help="expected CPU kind (avx2 | avx512_bf16); checked")
    ap.add_argument("--out", default="runs/demo_seeds")
    args = ap.parse_args()
    if args.cmd == "data":
        return make_data()
    if args.cmd == "report":
        return report()
    kind = cpu_kind()
    if args.kind and args.kind != kind:
        raise SystemExit(
            f"--kind {args.kind} but torch runs {torch.backends.cpu.get_cpu_capability()} kernels"
        )
    i, n = (int(x) for x in args.worker.split("/"))
    jobs = [(j.split(":")[0], int(j.split(":")[1])) for j in args.jobs.split(",") if j][i::n]
    for variant, seed in jobs:
        if str(seed) in load().get("runs", {}).get(kind, {}).get(variant, {}):
            print(f"skip {variant} seed {seed}: done")
            continue
        print(f"== {kind} {variant} seed {seed} (pid {os.getpid()})", flush=True)
        row = run_one(variant, seed, args.threads, kind, Path(args.out))
        save_result(kind, variant, seed, row)
        print(f"== {kind} {variant} seed {seed}: {row['success']:.0%} {row['tasks']}", flush=True)


if __name__ == "__main__":
    main()
