"""report.html: one self-contained page that a real browser renders (charts and videos)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from vlastack.diagnostics.run_report import html_report, pick_videos
from vlastack.sim.evaluate import wilson


def _eval_result(name: str, rates: dict[str, float], n: int = 10) -> dict:
    tasks = {
        t: {"n": n, "successes": round(r * n), "success_rate": r, "ci95": list(wilson(round(r * n), n))}
        for t, r in rates.items()
    }
    k = sum(s["successes"] for s in tasks.values())
    overall = {"n": n * len(tasks), "successes": k, "success_rate": k / (n * len(tasks)), "ci95": [0, 1]}
    return {"policy": name, "suite": "builtin", "tasks": tasks, "overall": overall,
            "mean_task_success": float(np.mean(list(rates.values()))), "wall_s": 1.0}  # fmt: skip


def _video(path, color: int) -> str:
    from vlastack.data.video import VideoEncoder

    frames = np.zeros((12, 64, 64, 3), np.uint8)
    for i in range(12):
        frames[i, :, : 4 * (i + 1)] = (color, 255 - color, 80)
    enc = VideoEncoder(path, fps=10, height=64, width=64, gop=10)
    enc.write(frames)
    enc.close()
    return str(path)


@pytest.fixture
def report(tmp_path):
    metrics = [
        {"step": s, "train/loss": 1.0 / s, "train/flow_loss": 0.8 / s, "train/lr": 1e-3 * min(1, s / 20)}
        for s in range(10, 210, 10)
    ]
    evals = {
        "trained": _eval_result("trained", {"reach": 0.9, "push": 0.6, "pick_place": 0.8}),
        "random": _eval_result("random", {"reach": 0.1, "push": 0.0, "pick_place": 0.0}),
    }
    videos = [
        _video(tmp_path / "ep0001_reach_success.mp4", 200),
        _video(tmp_path / "ep0002_push_failure.mp4", 40),
    ]
    return html_report(
        tmp_path / "report.html", "test report", intro="a synthetic run", cards={"success": "77%"},
        metrics=metrics, evals=evals, videos=videos, config={"train": {"steps": 200}},
        timings={"train_s": 12.5},
    )  # fmt: skip


def test_report_is_one_self_contained_page(report):
    text = report.read_text()
    assert text.count("<svg") == 3  # loss, learning rate, success per task
    assert text.count('src="data:video/mp4;base64,') == 2
    assert not re.search(r"(src|href)=\"https?:|url\(https?:|<link ", text)  # nothing fetched
    assert "steps: 200" in text and "train" in text and "12.5 s" in text
    assert report.stat().st_size < 1_000_000


def test_pick_videos_alternates_success_and_failure_and_caps(tmp_path):
    paths = []
    for i, tag in enumerate(["success", "success", "success", "failure", "failure"]):
        p = tmp_path / f"ep{i}_{tag}.mp4"
        p.write_bytes(b"x" * (10 if i != 1 else 100))
        paths.append(p)
    got = pick_videos(paths, count=3, max_bytes=50)
    assert [p.name for p in got] == ["ep0_success.mp4", "ep3_failure.mp4", "ep2_success.mp4"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def render(page, out_png=None, width=1200, height=1600) -> str:
    """Headless Chromium: the DOM after load (scripts run, ~4 s of virtual time), optionally a screenshot."""
    exe = chromium()
    common = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
              "--autoplay-policy=no-user-gesture-required", "--virtual-time-budget=4000"]  # fmt: skip
    if out_png is not None:
        subprocess.run(
            [*common, f"--screenshot={out_png}", f"--window-size={width},{height}", page.as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    res = subprocess.run(
        [*common, "--dump-dom", page.as_uri()], check=True, capture_output=True, text=True, timeout=120
    )
    return res.stdout


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    png = tmp_path / "shot.png"
    dom = render(report, png)
    status = re.search(r'data-videos="([^"]*)"', dom)
    assert status is not None, "the page script did not run"
    assert status.group(1) == "2/2 loaded", status.group(1)  # both videos decoded their metadata
    assert dom.count("<svg") == 3 and "<rect" in dom and "<path" in dom  # the charts are in the DOM
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB")).astype(np.int16)
    assert img.shape[0] > 500 and img.std() > 10  # not blank
    colors = {tuple(c) for c in img.reshape(-1, 3)[::97]}
    assert len(colors) > 20  # charts, text and video frames, not one background color


def test_run_report_and_eval_report_read_their_folders(tmp_path, report):
    """`vla train` -> run_report(run folder); `vla eval` -> eval_report(out folder, result)."""
    import json

    from vlastack.diagnostics.run_report import eval_report, run_report

    run = tmp_path / "run"
    (run / "eval" / "step_0000200").mkdir(parents=True)
    recs = [
        {"step": s, "train/loss": 1 / s, "train/lr": 1e-3, "train/samples_per_s": 150.0} for s in (10, 20)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (run / "train_summary.json").write_text(json.dumps({"steps": 20, "train_s": 3.0}))
    (run / "config.yaml").write_text("train:\n  steps: 20\n")
    res = {**_eval_result("ema", {"reach": 0.5}), "videos": [str(tmp_path / "ep0001_reach_success.mp4")]}
    (run / "eval" / "step_0000200" / "eval.json").write_text(json.dumps(res))
    text = run_report(run).read_text()
    assert text.count("<svg") == 3 and text.count("data:video/mp4") == 1
    assert "final loss" in text and "0.0500" in text and "steps: 20" in text
    text = eval_report(tmp_path / "eval", res, {"policy": "x"}).read_text()
    assert text.count("<svg") == 1 and "mean task success" in text and "50%" in text
