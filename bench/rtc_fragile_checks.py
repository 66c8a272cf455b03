"""Follow-up checks on the fragile tasks' policies of ``python -m bench.rtc --tasks fragile``
(trained there first if missing), at s = 4; each merged into ``bench/results/rtc.json`` under
``representations.absolute.published_fragile`` (docs/research/rtc.md reads them).

``min-commit`` (block ``min_commit_d0``): training-time RTC at d = 0 with a committed first action
(``eval.execution.min_commit=1``), on a larger sample: 100 episodes per task (200 dynamic per
cell, seeds 1,000,000-1,000,099) for the plain policy run synchronously and naively and the
rtc-trained one without and with the option. At d = 0 training-time RTC has no committed prefix,
so each chunk starts afresh; told one committed action, it continues the executing chunk.

``denoise-steps`` (block ``denoise_steps_10``): inference-time RTC (identity and VJP guidance) at
d = 2..4 with 10 Euler steps instead of the recipe's 5 (the plain policy's folder copied with
``model.head_options.num_denoise_steps=10``; sampling only, the weights are the same), 25 episodes per task.
Does a finer sampler pin the committed actions closer?

``h16`` (block ``h16_plain``): a plain policy with chunk H = 16 (our protocol's; trained here on
the same data, 3,000 steps like the others) run synchronously, naively and by inference-time RTC
(VJP and identity guidance) at s = 4 and d = 0..4 and 8, 25 episodes per task. With H = 8 and
s = 4 the whole leftover is committed at d = 4; with H = 16 a soft region of 8 actions remains.

``h16-trained`` (block ``h16_rtc_trained``): the same with training-time RTC, an H = 16 policy
trained with ``train.rtc.max_delay=8`` (our protocol's), run by training-time RTC without and with
``min_commit=1`` and naively. ``h16-trained-d4`` (block ``h16_rtc_trained_d4``): the same policy
trained with ``train.rtc.max_delay=4`` (the published protocol's): fewer actions per sample are
given clean and left out of the loss.

``guidance-max`` (block ``h16_guidance_max``): inference-time RTC on the H = 16 plain policy with
a higher guidance clip beta (identity guidance at 10, 20 and 50, VJP at 20; the published 5 in
``h16_plain``), d = 0..4: does a stronger pull toward the leftover cut the boundary jumps to a
third of naive's without losing success?

    python -m bench.rtc_fragile_checks min-commit        # ~2 min on 2 idle cores
    python -m bench.rtc_fragile_checks denoise-steps     # ~1.5 min
    python -m bench.rtc_fragile_checks h16               # ~9 min training + ~5 min evaluation
    python -m bench.rtc_fragile_checks h16-trained       # ~12 min training + ~4 min evaluation
    python -m bench.rtc_fragile_checks h16-trained-d4    # the same
    python -m bench.rtc_fragile_checks guidance-max      # ~5 min evaluation
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import replace

import bench.rtc as b
from bench.common import RESULTS, write_results

MIN_COMMIT_EPISODES = 100  # per task
MIN_COMMIT_RUNS = (
    ("sync", "plain", "sync", {}),
    ("naive_async", "plain", "naive_async", {}),
    ("rtc_training", "rtc_trained", "rtc_training", {}),
    ("rtc_training min_commit=1", "rtc_trained", "rtc_training", {"min_commit": 1}),
)
DENOISE_STEPS = 10
DENOISE_RUNS = (
    ("rtc_inference identity", "plain", "rtc_inference", {"guidance_max": 5.0, "guidance": "identity"}),
    ("rtc_inference", "plain", "rtc_inference", {"guidance_max": 5.0}),
)


def _merge(key: str, block: dict) -> None:
    path = RESULTS / "rtc.json"
    old = json.loads(path.read_text())
    old.pop("environment", None)
    old["representations"]["absolute"]["published_fragile"][key] = {
        **block,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu_flags": b.cpu_flags(),
    }
    write_results("rtc", old)


def min_commit(t0: float) -> None:
    proto = replace(b.PROTOCOLS["published"], delays=(0,))
    rows = b.evaluate_all(
        "absolute", proto, t0, MIN_COMMIT_EPISODES, 2, runs=MIN_COMMIT_RUNS, goal_s_only=True
    )
    _merge("min_commit_d0", {
        "note": "d = 0, s = 4: the plain policy run synchronously and naively, the rtc-trained policy by "
        "training-time RTC without and with eval.execution.min_commit=1 (one committed action even at "
        f"d = 0); {MIN_COMMIT_EPISODES} episodes per task, the policies of the block above",
        "episodes_per_task": MIN_COMMIT_EPISODES,
        "rows": rows,
        "dynamic_success": {r["label"]: r["dynamic_success"] for r in rows},
    })  # fmt: skip
    for r in rows:
        print(f"{r['label']:>28} d=0: dynamic {r['dynamic_success']:.0%}, spilled {r['dynamic_spilled']:.0%}")


def denoise_steps(t0: float) -> None:
    proto = replace(b.PROTOCOLS["published"], delays=(2, 3, 4))
    src = b.policy_dir("absolute", proto, "plain")
    dst = src.parent.parent / f"denoise{DENOISE_STEPS}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    for name in ("config.json", "config.yaml"):  # the sampler's step count; the weights are the same
        f = dst / name
        text = f.read_text()
        old = ('"num_denoise_steps": 5', "num_denoise_steps: 5")
        new = (f'"num_denoise_steps": {DENOISE_STEPS}', f"num_denoise_steps: {DENOISE_STEPS}")
        if not any(o in text for o in old):
            raise SystemExit(f"{f}: no num_denoise_steps 5 to replace")
        for o, n in zip(old, new, strict=True):
            text = text.replace(o, n)
        f.write_text(text)
    plain = b.policy_dir
    b.policy_dir = lambda rep, pr, name: dst if name == "plain" else plain(rep, pr, name)
    try:
        rows = b.evaluate_all("absolute", proto, t0, b.EVAL_EPISODES, 2, runs=DENOISE_RUNS, goal_s_only=True)
    finally:
        b.policy_dir = plain
    _merge("denoise_steps_10", {
        "note": f"inference-time RTC with {DENOISE_STEPS} Euler steps instead of 5 (the same plain policy's "
        f"weights), d = 2..4, s = 4, {b.EVAL_EPISODES} episodes per task, the seeds of the block above",
        "num_denoise_steps": DENOISE_STEPS,
        "rows": rows,
        "dynamic_success": {f"{r['label']} d={r['delay']}": r["dynamic_success"] for r in rows},
    })  # fmt: skip
    for r in rows:
        print(
            f"{r['label']:>24} d={r['delay']}: dynamic {r['dynamic_success']:.0%}, spilled {r['dynamic_spilled']:.0%}"
        )


H16_RUNS = (
    ("sync", "plain", "sync", {}),
    ("naive_async", "plain", "naive_async", {}),
    ("rtc_inference", "plain", "rtc_inference", {"guidance_max": 5.0}),
    ("rtc_inference identity", "plain", "rtc_inference", {"guidance_max": 5.0, "guidance": "identity"}),
)
H16_TRAINED_RUNS = (
    ("rtc_training", "rtc_trained", "rtc_training", {}),
    ("rtc_training min_commit=1", "rtc_trained", "rtc_training", {"min_commit": 1}),
    ("naive_async (rtc-trained policy)", "rtc_trained", "naive_async", {}),
)


def _h16_rows(t0: float, name: str, runs: tuple) -> tuple[b.Protocol, list[dict], dict]:
    """Train the H = 16 policy ``name`` (if missing) and run ``runs`` at s = 4 and d = 0..4, 8:
    -> (protocol, rows, its training record)."""
    proto = replace(b.PROTOCOLS["ours"], delays=(0, 1, 2, 3, 4, 8))
    info = b.train("absolute", proto, t0, 2, names=(name,))
    rows = b.evaluate_all("absolute", proto, t0, b.EVAL_EPISODES, 2, runs=runs, goal_s_only=True)
    f = b.run_dir("absolute", proto, name) / "bench_train.json"
    for r in rows:
        print(f"{r['label']:>34} d={r['delay']}: dynamic {r['dynamic_success']:.0%}, "
              f"spilled {r['dynamic_spilled']:.0%}, mean jump {r['dynamic_mean_jump']:.3f}")  # fmt: skip
    return proto, rows, info.get(name) or (json.loads(f.read_text()) if f.exists() else None)


def h16(t0: float) -> None:
    proto, rows, training = _h16_rows(t0, "plain", H16_RUNS)
    _merge("h16_plain", {
        "note": "a plain policy with H = 16 (the same data and 3,000-step recipe as the H = 8 policies "
        f"above), s = 4 (s = d where d > 4), {b.EVAL_EPISODES} episodes per task, the seeds of the block above",
        "horizon": proto.horizon,
        "overrides": b.overrides(proto, "plain"),
        "training": training,
        "rows": rows,
        "goals": b.goals(rows, replace(proto, delays=(0, 1, 2, 3, 4))),
    })  # fmt: skip


def _h16_trained(t0: float, name: str, key: str) -> None:
    """The H = 16 training-time-RTC policy ``name`` (``rtc_trained[_d<max_delay>]``) -> block ``key``."""
    runs = tuple((label, name, method, extra) for label, _, method, extra in H16_TRAINED_RUNS)
    proto, rows, training = _h16_rows(t0, name, runs)
    max_delay = b.overrides(proto, name)[-1]  # "train.rtc.max_delay=N"
    _merge(key, {
        "note": f"an H = 16 policy trained with {max_delay} (the same data and 3,000-step recipe), "
        f"s = 4, {b.EVAL_EPISODES} episodes per task, the seeds of the block above",
        "horizon": proto.horizon,
        "overrides": b.overrides(proto, name),
        "training": training,
        "rows": rows,
        "dynamic_success": {f"{r['label']} d={r['delay']}": r["dynamic_success"] for r in rows},
    })  # fmt: skip


def h16_trained(t0: float) -> None:
    _h16_trained(t0, "rtc_trained", "h16_rtc_trained")


def h16_trained_d4(t0: float) -> None:
    _h16_trained(t0, "rtc_trained_d4", "h16_rtc_trained_d4")


GUIDANCE_MAX = (10.0, 20.0, 50.0)
GUIDANCE_RUNS = (
    *((f"rtc_inference identity beta={m:g}", "plain", "rtc_inference", {"guidance_max": m, "guidance": "identity"})
      for m in GUIDANCE_MAX),
    ("rtc_inference beta=20", "plain", "rtc_inference", {"guidance_max": 20.0}),
)  # fmt: skip


def guidance_max(t0: float) -> None:
    """Inference-time RTC on the H = 16 plain policy with a higher guidance clip (beta): a stronger
    pull toward the leftover chunk at the splice; naive's jumps from block ``h16_plain`` (same seeds)."""
    proto = replace(b.PROTOCOLS["ours"], delays=(0, 1, 2, 3, 4))
    b.train("absolute", proto, t0, 2, names=("plain",))  # no-op where the H = 16 policy exists
    rows = b.evaluate_all("absolute", proto, t0, b.EVAL_EPISODES, 2, runs=GUIDANCE_RUNS, goal_s_only=True)
    old = json.loads((RESULTS / "rtc.json").read_text())["representations"]["absolute"]["published_fragile"]
    naive = [
        r for r in old["h16_plain"]["rows"] if r["label"] == "naive_async" and r["delay"] in proto.delays
    ]
    _merge("h16_guidance_max", {
        "note": "inference-time RTC on the H = 16 plain policy (block h16_plain) with guidance_max (beta) "
        f"{', '.join(f'{m:g}' for m in GUIDANCE_MAX)} (identity) and 20 (VJP) instead of 5; s = 4, "
        f"{b.EVAL_EPISODES} episodes per task, the seeds of h16_plain, whose naive rows the jumps are divided by",
        "horizon": proto.horizon,
        "rows": rows,
        "goals": b.goals(rows + naive, proto, labels=tuple(r[0] for r in GUIDANCE_RUNS)),
    })  # fmt: skip
    for r in rows:
        print(f"{r['label']:>34} d={r['delay']}: dynamic {r['dynamic_success']:.0%}, "
              f"spilled {r['dynamic_spilled']:.0%}, mean jump {r['dynamic_mean_jump']:.4f}")  # fmt: skip


CHECKS = ("min-commit", "denoise-steps", "h16", "h16-trained", "h16-trained-d4", "guidance-max")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("check", choices=CHECKS)
    args = ap.parse_args()
    b.use_task_set("fragile")
    t0 = time.perf_counter()
    b.train("absolute", b.PROTOCOLS["published"], t0, 2)  # no-op where the H = 8 policies exist
    checks = {  # in the order of CHECKS
        "min-commit": min_commit,
        "denoise-steps": denoise_steps,
        "h16": h16,
        "h16-trained": h16_trained,
        "h16-trained-d4": h16_trained_d4,
        "guidance-max": guidance_max,
    }
    checks[args.check](t0)


if __name__ == "__main__":
    main()
