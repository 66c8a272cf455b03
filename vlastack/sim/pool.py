"""Simulation worker pools that do not outlive their parent.

``vla eval`` and ``vla data generate`` run episodes in spawned ``ProcessPoolExecutor`` workers.
When the parent is stopped by SIGTERM (the default handler exits at once) or by kill -9, nothing
tells a worker that is inside an episode: it used to stay behind, orphaned under init, blocked on
a policy server that was gone or rendering an episode nobody would read, holding memory and (for
a GPU policy) its device. Linux's ``PR_SET_PDEATHSIG`` asks the kernel to send the worker SIGTERM
when its parent dies, whatever killed the parent. Elsewhere workers still exit when they next
read their (closed) job queue.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """In a worker: SIGTERM from the kernel when the parent process dies (Linux; a no-op
    elsewhere). ``parent_pid``: the pid the parent had when it started the pool, so a parent that
    died before this call is noticed too."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return  # not fatal: the worker still exits at its next read of the closed job queue
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _init(parent_pid: int, initializer: Callable[..., Any] | None, initargs: tuple) -> None:
    die_with_parent(parent_pid)
    if initializer is not None:
        initializer(*initargs)


def worker_pool(
    workers: int, initializer: Callable[..., Any] | None = None, initargs: tuple = ()
) -> ProcessPoolExecutor:
    """A spawned ``ProcessPoolExecutor`` of ``workers`` processes that die with this process.

    Create and use it from one long-lived thread (the pool's workers are started by the thread
    that submits, and the kernel's parent-death signal follows that thread)."""
    return ProcessPoolExecutor(
        workers, mp_context=mp.get_context("spawn"), initializer=_init,
        initargs=(os.getpid(), initializer, initargs),
    )  # fmt: skip
