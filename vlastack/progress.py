"""Live progress for every long job: a tqdm bar on a terminal, plain periodic lines otherwise.

    with Progress(total=3400, desc="train", unit="step") as bar:
        for ...:
            bar.update(1, loss=f"{loss:.4f}")
        bar.write("a message that must not tear the bar")

On a terminal the bar shows the count, ETA, rate (``unit``/s) and the postfix (the current loss or
success). When the stream is not a terminal (CI, ``| tee``, a log file) tqdm's carriage-return
redraws would pile up in the log, so the same line, formatted by tqdm, is printed as a plain line
at most every ``interval`` seconds (15 s by default: a log never goes 30 s without news while the
job advances) plus once at the start and once at the end.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

PLAIN_INTERVAL_S = 15.0


class Progress:
    """A progress reporter over ``total`` units of work (``None``: unknown).

    ``file``: the stream (default stdout); ``tty``: force the bar (True) or plain lines (False),
    default ``file.isatty()``; ``clock``: injectable for tests; ``enabled=False`` makes every call a
    no-op (non-zero ranks, quiet library calls).
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "it",
        *,
        initial: int = 0,
        file: TextIO | None = None,
        tty: bool | None = None,
        interval: float = PLAIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
    ) -> None:
        self.file = file if file is not None else sys.stdout
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.enabled, self.interval, self.clock = enabled, interval, clock
        self.postfix: dict[str, Any] = {}
        self.tty = (self._isatty() if tty is None else tty) and enabled
        self.bar: tqdm | None = None
        self.t0 = self.last = clock()
        self.initial = initial
        if self.tty:
            self.bar = tqdm(
                total=total, desc=desc, unit=unit, initial=initial, file=self.file, dynamic_ncols=True,
                mininterval=0.5, smoothing=0.1,
            )  # fmt: skip
        elif enabled:
            self._line()

    def _isatty(self) -> bool:
        try:
            return bool(self.file.isatty())
        except (AttributeError, ValueError):
            return False

    def _line(self) -> None:
        elapsed = self.clock() - self.t0
        rate = (self.n - self.initial) / elapsed if elapsed > 0 and self.n > self.initial else None
        post = ", ".join(f"{k}={v}" for k, v in self.postfix.items())
        line = tqdm.format_meter(
            self.n, self.total, elapsed, ncols=0, prefix=self.desc, unit=self.unit, rate=rate,
            postfix=post or None, initial=self.initial,
        )  # fmt: skip
        print(line, file=self.file, flush=True)
        self.last = self.clock()

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by ``n``; keyword arguments replace the shown postfix (e.g. ``loss="0.0412"``)."""
        if not self.enabled:
            return
        self.n += n
        if postfix:
            self.postfix.update(postfix)
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(self.postfix, refresh=False)
            self.bar.update(n)
        elif self.clock() - self.last >= self.interval:
            self._line()

    def write(self, text: str) -> None:
        """Print a message line without tearing the bar."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.file)
        else:
            print(text, file=self.file, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.enabled:
            self._line()
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def track(iterable, total: int | None = None, desc: str = "", unit: str = "it", **kw: Any):
    """``for x in track(items, desc="convert", unit="episode")``: a ``Progress`` over an iterable."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    with Progress(total, desc, unit, **kw) as bar:
        for x in iterable:
            yield x
            bar.update(1)


class EpisodeProgress:
    """Closed-loop evaluation progress: episodes/s, ETA and the success rate so far.

    ``done(result)`` per finished episode (returns the result); worker episodes call it from the
    pool's thread, hence the lock."""

    def __init__(self, total: int, desc: str, **kw: Any) -> None:
        self.bar = Progress(total, desc, "episode", **kw)
        self.ok = self.n = 0
        self.lock = threading.Lock()

    def done(self, result: dict) -> dict:
        with self.lock:
            self.n += 1
            self.ok += bool(result.get("success"))
            self.bar.update(1, success=f"{self.ok / self.n:.0%}")
        return result

    def close(self) -> None:
        self.bar.close()
