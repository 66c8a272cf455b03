"""Real-time chunking under inference delay: success and smoothness of every execution method.

    python -m bench.rtc                      # data -> two trainings -> evaluation -> JSON, plot, docs
    python -m bench.rtc --phase train        # data and the two policies only (reused afterwards)
    python -m bench.rtc --phase eval         # evaluate the policies already trained

Trains the ``tiny`` demo recipe (grounding head, EMA, bf16 autocast; action horizon 16, the scene
camera only and batch 16 to fit a shared 2-core CPU) twice on
scripted-expert demos of two dynamic families (``reach_moving``, ``reach_switch``) and one static
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
import time
from pathlib import Path

import torch

OUT = Path("runs/bench_rtc")
TASKS = ("reach_moving", "reach_switch", "reach")
DYNAMIC = ("reach_moving", "reach_switch")
DELAYS = (0, 1, 2, 4, 8)
EPISODES = 600  # demonstrations, round-robin over TASKS
STEPS = 1200  # training steps per policy (a steps budget: the result does not depend on load)
MAX_DELAY = 8
CAMERAS = ("scene",)
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


def train(t0: float) -> dict:
    from vlastack.apps.demo import DATA_NOISE, demo_config
    from vlastack.sim.generate import generate
    from vlastack.train.trainer import Trainer

    torch.set_num_threads(2)
    data = OUT / "data"
    info: dict = {}
    if not (data / "meta" / "vlastack_sim.json").exists():
        _log(f"generating {EPISODES} demos of {', '.join(TASKS)}", t0)
        info["generate"] = generate(
            data, suite="builtin", tasks=TASKS, episodes=EPISODES, workers=2, noise=DATA_NOISE, cameras=CAMERAS,
            seed=0, overwrite=True, video_quality="lossless", progress=False,
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=["all", "train", "eval"], default="all")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.phase in ("all", "train"):
        train(t0)
    if args.phase in ("all", "eval"):
        from bench.rtc_eval import run_eval

        run_eval(t0)


if __name__ == "__main__":
    main()
