"""The README's picture and docs/report.png, from the report folder of a real `vla demo` run.

    .venv/bin/python scripts/readme_figure.py runs/demo/report --caption "avx512_bf16, 2026-11-25"

Writes docs/demo.png (success per task for the trained policy beside the random policy and the
scripted expert, and frames of the recorded rollouts) and, where Debian's `chromium` is installed,
docs/report.png (a screenshot of the run's report.html).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

DOCS = Path(__file__).resolve().parents[1] / "docs"


def frames(video: Path, n: int = 4) -> list[np.ndarray]:
    """``n`` frames spread over a rollout video (first and last included)."""
    from vlastack.data.video import read_all_frames

    all_frames = read_all_frames(video)
    idx = np.linspace(0, len(all_frames) - 1, n).round().astype(int)
    return [all_frames[i] for i in idx]


def figure(report: Path, caption: str, out: Path) -> None:
    res = json.loads((report / "results.json").read_text())["results"]
    ev = json.loads((report / "eval" / "eval.json").read_text())
    tasks = list(res["trained"]["tasks"])
    videos = [report / "eval" / "videos" / Path(v).name for v in ev.get("videos", [])][:4]
    fig = plt.figure(figsize=(12, 4.6), dpi=110)
    grid = fig.add_gridspec(len(videos) or 1, 2, width_ratios=[1, 1.25], wspace=0.08, hspace=0.12)
    ax = fig.add_subplot(grid[:, 0])
    names = [("trained", "trained tiny policy", "#1f77b4"), ("random", "random policy", "#ff7f0e"),
             ("expert", "scripted expert", "#2ca02c")]  # fmt: skip
    x = np.arange(len(tasks) + 1)
    for i, (key, label, color) in enumerate(names):
        vals = [res[key]["tasks"][t] for t in tasks] + [res[key]["mean_task_success"]]
        ax.bar(x + (i - 1) * 0.27, vals, 0.27, label=label, color=color)
        if key == "trained":
            for xi, v in zip(x, vals, strict=True):
                ax.text(xi - 0.27, v + 0.02, f"{v:.0%}", ha="center", fontsize=8)
    ax.set_xticks(x, [*tasks, "mean"])
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("closed-loop success (100 unseen-seed episodes)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), fontsize=8, ncols=3, frameon=False)
    ax.set_title(f"vla demo: {caption}", fontsize=10)
    for r, v in enumerate(videos):
        strip = np.concatenate(frames(v), axis=1)
        a = fig.add_subplot(grid[r, 1])
        a.imshow(strip)
        a.set_axis_off()
        task, outcome = v.stem.split("_", 1)[1].rsplit("_", 1)  # ep0003_pick_place_success
        a.set_title(f"{task}: {outcome} (frames over the episode)", fontsize=8, loc="left", pad=2)
    fig.savefig(out, bbox_inches="tight")
    print("wrote", out)


def screenshot(report: Path, out: Path) -> None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        print("chromium not installed: docs/report.png not rewritten (apt-get install -y chromium)")
        return
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
           "--virtual-time-budget=4000", f"--screenshot={out}", "--window-size=1200,1750",
           (report / "report.html").resolve().as_uri()]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=180)
    print("wrote", out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("report", type=Path, help="the demo's report folder (runs/demo/report)")
    ap.add_argument("--caption", required=True, help="CPU kind, date and success, shown in the title")
    args = ap.parse_args()
    figure(args.report, args.caption, DOCS / "demo.png")
    screenshot(args.report, DOCS / "report.png")


if __name__ == "__main__":
    main()
