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

import errno
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from types import FrameType

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


class RunLock:
    """Exclusive lock on a run folder for one process (``acquire`` / ``release``)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock (no-op while held) or raise ``ValueError`` naming the folder and the
        process that holds it."""
        if self._fd is not None:
            return
        try:
            import fcntl
        except ImportError:  # no flock (Windows): run unlocked
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)  # a filesystem without flock (some network mounts): run unlocked
                warnings.warn(f"cannot lock {self.path} ({e.strerror}): a second run into this folder "
                              "would not be refused", stacklevel=2)  # fmt: skip
                return
            owner = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ValueError(
                f"run folder {self.path.parent} is in use by {owner}; wait for that run to finish, "
                "stop it, or train into another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"vla train pid {os.getpid()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __del__(self) -> None:
        self.release()
