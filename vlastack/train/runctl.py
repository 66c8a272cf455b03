"""Run control: stop signals that save first, and one training run per folder.

``StopSignals``: SIGTERM is how SLURM, Kubernetes and spot instances preempt a job, and Ctrl-C is
how a person stops one. Either finishes the step in flight, saves a checkpoint and ends training
with ``TrainingStopped`` (``vla train`` exits 128 + the signal number: 143, 130), so ``--resume``
continues bit-exactly from that step. A second Ctrl-C, or a Ctrl-C while a checkpoint is being
written, stops at once (``KeyboardInterrupt``): the save is atomic, so the previous checkpoint
stays intact and the half-written one is swept at the next start.

``RunLock``: an exclusive ``flock`` on ``<run>/.lock`` held for the whole run, so a second
``vla train`` into the same folder is refused with the owner's pid instead of both writing
checkpoints (the first run's model would be silently lost). The kernel releases it when the
process dies, even by ``kill -9``, so a crashed run never leaves a stale lock.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from vlastack.folderlock import FolderLock

LOCK_NAME = ".lock"


class TrainingStopped(RuntimeError):
    """Training ended early on a stop signal, after saving ``checkpoint`` at ``step``."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None = None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        where = f"checkpoint {checkpoint} saved" if checkpoint else "checkpoint saved"
        super().__init__(
            f"stopped by {signal.Signals(signum).name} at step {step}: {where}; "
            "continue with the same command and --resume"
        )


class StopSignals:
    """Context manager: while active, SIGTERM and SIGINT request a stop (``requested``) instead of
    killing the process. Handlers are installed only in the main thread (Python's rule); elsewhere
    this is inert. ``saving``: set while a checkpoint is written (a Ctrl-C then stops at once)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, announce=None) -> None:
        self.requested: int | None = None
        self.saving = False
        self._old: dict[int, object] = {}
        self._announce = announce or (lambda msg: print(msg, file=sys.stderr, flush=True))

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and (self.saving or self.requested is not None):
            raise KeyboardInterrupt  # the second Ctrl-C, or one during a save: stop now
        if self.requested is None:
            self._announce(
                f"{signal.Signals(signum).name} received: finishing this step and saving a checkpoint "
                "(Ctrl-C again to stop at once)"
            )
        self.requested = signum

    def __enter__(self) -> StopSignals:
        self.requested, self.saving = None, False  # a new fit starts with no stop pending
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                if s == signal.SIGINT and signal.getsignal(s) is signal.SIG_IGN:
                    continue  # started with Ctrl-C ignored (nohup, a background job): keep it so
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


class RunLock(FolderLock):
    """Exclusive lock on a run folder (``<run>/.lock``) for one training process."""

    def __init__(self, run_dir: str | Path) -> None:
        run_dir = Path(run_dir)
        super().__init__(run_dir / LOCK_NAME, "vla train", f"run folder {run_dir}",
                         "wait for that run to finish, stop it, or train into another --out")  # fmt: skip
