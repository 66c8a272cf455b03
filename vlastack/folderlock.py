"""One writer per output: an exclusive ``flock`` on a lock file, refused with the owner's pid.

Two processes writing the same run folder or dataset silently destroy each other's work (the
second run's checkpoints replace the first's; two generations interleave parts). ``FolderLock``
takes ``flock(LOCK_EX | LOCK_NB)`` on ``path`` for as long as it is held, and writes who holds it
into the file, so the second process is refused at once with a ``ValueError`` naming the holder.
The kernel releases the lock when the process dies, even by ``kill -9``: a crash never leaves a
stale lock to clear by hand. Used by ``train.runctl.RunLock`` (``vla train``), ``vla data generate``
and ``vla eval`` (``sim.eval_journal``).
"""

from __future__ import annotations

import errno
import os
import time
import warnings
from pathlib import Path


class FolderLock:
    """Exclusive lock on ``path`` (a lock file) for one process (``acquire`` / ``release``).

    ``owner``: how the holder describes itself in the file ("vla train"); ``what``: the thing
    guarded, for the refusal ("run folder runs/x"); ``hint``: what the refused user can do."""

    def __init__(self, path: str | Path, owner: str, what: str, hint: str) -> None:
        self.path = Path(path)
        self.owner, self.what, self.hint = owner, what, hint
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock (no-op while held) or raise ``ValueError`` naming what is guarded and the
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
                warnings.warn(f"cannot lock {self.path} ({e.strerror}): a second writer to {self.what} "
                              "would not be refused", stacklevel=2)  # fmt: skip
                return
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ValueError(f"{self.what} is in use by {holder}; {self.hint}") from None
        os.ftruncate(fd, 0)
        os.write(
            fd, f"{self.owner} pid {os.getpid()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})\n".encode()
        )
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()
