"""How many torch threads a server should use: the CPUs that are idle now, not all of them.

torch's intra-op threads meet at a barrier after every kernel; when another process holds one of
the cores, the thread waiting there spins and the call takes as long as the slowest thread's slice.
On two busy cores ``vla serve`` with torch's default two threads answered in 0.44 s on average
where one thread answered in 67 ms (issue #66). So the default counts the CPUs that were idle over a
short sample of ``/proc/stat`` at start-up and uses that many (at least one), and says so.
"""

from __future__ import annotations

import os
import time


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's or taskset's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _cpu_times() -> tuple[float, float] | None:
    """(free, total) jiffies over all CPUs, or None where /proc/stat is missing. Free: idle, iowait
    and niced work (a nice-19 job gets ~1.5% of a core beside a normal-priority thread)."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[1] + fields[3] + (fields[4] if len(fields) > 4 else 0.0), sum(fields[:8])


def idle_cpus(sample_s: float = 0.3) -> float | None:
    """CPUs free (idle, or running niced work) over the next ``sample_s`` seconds, or None where it
    cannot be read. The machine's count, not the affinity mask's: ``pick_threads`` caps it."""
    a = _cpu_times()
    time.sleep(sample_s)
    b = _cpu_times()
    if a is None or b is None or b[1] <= a[1]:
        return None
    return (os.cpu_count() or 1) * (b[0] - a[0]) / (b[1] - a[1])


def pick_threads(requested: int | None = None, sample_s: float = 0.3) -> tuple[int, str]:
    """``requested`` threads, or (None) the CPUs idle now, at least 1 -> (threads, why) for the log."""
    cpus = usable_cpus()
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--threads must be >= 1 (or omitted: the CPUs idle at start), got {requested}")
        return requested, f"{requested} (--threads; {cpus} CPUs usable)"
    idle = idle_cpus(sample_s)
    if idle is None:
        return cpus, f"{cpus} (all usable CPUs; their load could not be read)"
    n = max(1, min(cpus, int(idle + 0.5)))
    return n, (
        f"{n} of {cpus} usable CPUs ({idle:.1f} free, idle or niced, over {sample_s:g} s at start; a "
        "thread on a busy core stalls every kernel: --threads N to choose)"
    )
