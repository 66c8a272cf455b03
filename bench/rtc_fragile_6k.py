"""Training-time RTC on the fragile tasks with twice the budget: the rtc-trained policy at 6,000 steps
(the plain policy of ``python -m bench.rtc --tasks fragile`` has 3,000), run by training-time RTC
and naively at s = 4, d = 0..4, the same seeds. Is its weaker d = 0 a budget effect?

    python -m bench.rtc_fragile_6k      # trains the policy if missing (~10 min on 2 idle cores)

Merged into ``bench/results/rtc.json`` as
``representations.absolute.published_fragile.rtc_trained_6000_steps``; docs/research/rtc.md reads it.
"""

from __future__ import annotations

import json
import time

import bench.rtc as b
from bench.common import RESULTS, write_results

STEPS = 6000
RUNS = (
    ("rtc_training", "rtc_trained", "rtc_training", {}),
    ("naive_async (rtc-trained policy)", "rtc_trained", "naive_async", {}),
)


def main() -> None:
    b.use_task_set("fragile")
    b.STEPS = STEPS  # its own folder: runs/bench_rtc/absolute_fragile_steps6000 (the data is generated there)
    proto, t0 = b.PROTOCOLS["published"], time.perf_counter()
    b.train("absolute", proto, t0, 2, names=("rtc_trained",))
    rows = b.evaluate_all("absolute", proto, t0, b.EVAL_EPISODES, 2, runs=RUNS, goal_s_only=True)
    path = RESULTS / "rtc.json"
    old = json.loads(path.read_text())
    old.pop("environment", None)
    info = json.loads((b.run_dir("absolute", proto, "rtc_trained") / "bench_train.json").read_text())
    by_delay: dict[str, dict[int, float]] = {}
    for r in rows:
        by_delay.setdefault(r["label"], {})[r["delay"]] = r["dynamic_success"]
    old["representations"]["absolute"]["published_fragile"]["rtc_trained_6000_steps"] = {
        "note": f"the rtc-trained policy with twice the plain policy's budget ({STEPS} steps, "
        "train.rtc.max_delay=4, the same data); training-time RTC and naive execution of it at s = 4, same seeds",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu_flags": b.cpu_flags(),
        "training": info,
        "rows": rows,
        "dynamic_success_by_delay": by_delay,
    }
    write_results("rtc", old)
    for r in rows:
        print(
            f"{r['label']:>34} d={r['delay']}: dynamic {r['dynamic_success']:.0%}, spilled {r['dynamic_spilled']:.0%}"
        )


if __name__ == "__main__":
    main()
