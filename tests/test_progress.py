"""Live progress: a tqdm bar on a terminal, plain periodic lines in logs (vlastack/progress.py)."""

from __future__ import annotations

import io

from vlastack.progress import EpisodeProgress, Progress, track


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_non_tty_prints_a_plain_line_every_interval():
    out, clock = io.StringIO(), Clock()
    bar = Progress(100, "train", "step", file=out, interval=30.0, clock=clock)
    for i in range(100):
        clock.t += 1.0  # one step per second: a line at start, every 30 s and at the end
        bar.update(1, loss=f"{1 / (i + 1):.3f}")
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + 3 + 1
    assert "\r" not in out.getvalue()  # plain lines, no carriage-return redraws
    assert lines[1].startswith("train:  30%") and "30/100" in lines[1] and "loss=0.033" in lines[1]
    assert "1.00step/s" in lines[1] and "01:10" in lines[1]  # rate and ETA
    assert "100/100" in lines[-1]


def test_tty_shows_a_tqdm_bar_and_messages_do_not_tear_it():
    out = io.StringIO()
    with Progress(10, "eval", "episode", file=out, tty=True) as bar:
        for _ in range(10):
            bar.update(1, success="50%")
        bar.write("a message")
    text = out.getvalue()
    assert "\r" in text and "10/10" in text and "success=50%" in text and "a message\n" in text


def test_disabled_is_silent_and_track_counts():
    out = io.StringIO()
    bar = Progress(5, "x", file=out, enabled=False)
    bar.update(3)
    bar.write("hidden")
    bar.close()
    assert out.getvalue() == ""
    assert list(track(range(4), desc="convert", unit="episode", file=out)) == [0, 1, 2, 3]
    assert "4/4" in out.getvalue().splitlines()[-1]


def test_episode_progress_reports_success_so_far():
    out = io.StringIO()
    ep = EpisodeProgress(4, "eval random", file=out)
    for ok in (True, False, True, True):
        assert ep.done({"success": ok})["success"] is ok
    ep.close()
    assert "4/4" in out.getvalue() and "success=75%" in out.getvalue()
