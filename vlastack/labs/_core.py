"""Shared pieces of the labs: the check registry, the runner, honest timers, a saved-tensor meter,
the machine description, and the text/JSON/Markdown writers.

A lab module does::

    LAB = Lab("tensor_storage", "storage, strides and views")

    @LAB.check("S0-01", "S2-31")
    def view_is_zero_copy(ctx: Ctx) -> Finding:
        ...
        return Finding(measured="same data_ptr: True", ok=same, note="why it holds / the correction")

``ok=True`` passes, ``ok=False`` fails (exit code 1), ``ok=None`` only reports (small or
host-dependent effects). ``raise Skip("reason")`` skips with a line saying why.

Timing policy (the machine is shared): thread CPU time (``time.thread_time``) with one intra-op
thread, A/B(/C) interleaved in rotating order, warm-up excluded, medians. Only large effects are
asserted, with margins; small ones are reported.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import statistics
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import torch

from vlastack.labs.claims import CLAIMS


class Skip(Exception):
    """Raised by a check that cannot run here (no CUDA, missing package...)."""


@dataclass
class Finding:
    measured: str  # one line of measured numbers
    ok: bool | None = True  # None: reported, not asserted
    note: str = ""  # the explanation: why the claim holds, or its correction
    data: dict = field(default_factory=dict)  # the numbers, for JSON
    rows: list[dict] = field(default_factory=list)  # an optional small table
    verdict: str = ""  # this run's verdict when it differs from the audit's (e.g. CPU-dependent)


@dataclass
class Ctx:
    quick: bool = False

    def n(self, full: int, quick: int) -> int:
        """A size or repeat count: ``quick`` in --quick mode, ``full`` otherwise."""
        return quick if self.quick else full


@dataclass(frozen=True)
class Check:
    lab: str
    name: str
    claims: tuple[str, ...]
    fn: Callable[[Ctx], Finding]
    requires: str | None  # None | "cuda" | "cuda>=2" | a Python package name
    slow: bool  # excluded from the default test suite (still run by `vla lab all`)
    # The verdict compares wall-clock or CPU times, so a busy machine can flip it: the default test
    # suite runs the check (it must measure without raising) but asserts its verdict only under
    # `pytest -m timing` and in `vla lab all`.
    timed: bool = False


@dataclass
class Result:
    lab: str
    check: str
    claims: tuple[str, ...]
    status: str  # ok | FAIL | skip | report
    measured: str = ""
    note: str = ""
    verdict: str = ""
    data: dict = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("check", "claims", "status", "measured", "note", "verdict")}
        d.update(claims=list(self.claims), data=self.data, rows=self.rows, seconds=round(self.seconds, 2))
        return d


class Lab:
    def __init__(self, name: str, title: str, slow: bool = False) -> None:
        self.name, self.title, self.slow = name, title, slow
        self.checks: list[Check] = []

    def check(self, *claims: str, requires: str | None = None, slow: bool = False, timed: bool = False):
        unknown = [c for c in claims if c not in CLAIMS]
        if unknown:
            raise ValueError(f"lab {self.name}: unknown claim ids {unknown}")

        def deco(fn: Callable[[Ctx], Finding]) -> Callable[[Ctx], Finding]:
            self.checks.append(Check(self.name, fn.__name__, claims, fn, requires, slow or self.slow, timed))
            return fn

        return deco

    @property
    def claims(self) -> list[str]:
        return sorted({c for ch in self.checks for c in ch.claims})


# ---------------------------------------------------------------------------------------- running


def missing_requirement(requires: str | None) -> str | None:
    """-> why ``requires`` is not met here, or None."""
    if requires is None:
        return None
    if requires.startswith("cuda"):
        need = int(requires.split(">=")[1]) if ">=" in requires else 1
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return None if have >= need else f"needs {need} CUDA device(s), found {have}"
    if importlib.util.find_spec(requires) is None:
        return f"needs `{requires}` (pip install {requires})"
    return None


def run_check(check: Check, ctx: Ctx) -> Result:
    res = Result(check.lab, check.name, check.claims, "skip")
    why = missing_requirement(check.requires)
    if why:
        res.measured = f"skipped: {why}"
        return res
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # timings are thread CPU time of this thread
    torch.manual_seed(0)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():  # checks that test a warning record it themselves
            warnings.simplefilter("ignore")
            f = check.fn(ctx)
        res.status = "report" if f.ok is None else "ok" if bool(f.ok) else "FAIL"
        res.measured, res.note, res.verdict, res.data, res.rows = (
            f.measured,
            f.note,
            f.verdict,
            f.data,
            f.rows,
        )
    except Skip as e:
        res.measured = f"skipped: {e}"
    except Exception as e:  # a crash is a failed check, reported with its cause
        res.status = "FAIL"
        res.measured = f"raised {type(e).__name__}: {e}"[:400]
        res.note = traceback.format_exc(limit=3)[-600:]
    finally:
        torch.set_num_threads(threads)
    res.seconds = time.perf_counter() - t0
    return res


# ---------------------------------------------------------------------------------------- timing


def thread_ms(fn: Callable[[], object], inner: int = 1) -> float:
    """Thread CPU milliseconds per call over ``inner`` calls."""
    t0 = time.thread_time()
    for _ in range(inner):
        fn()
    return (time.thread_time() - t0) * 1e3 / inner


def wall_ms(fn: Callable[[], object], inner: int = 1) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) * 1e3 / inner


def compare(
    fns: dict[str, Callable[[], object]],
    reps: int = 7,
    inner: int = 1,
    clock: str = "thread",
    stat: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """Median (or ``stat``) ms per call of each function, measured interleaved in rotating order
    (A B C, B C A, ...) after one warm-up round, so load changes on the shared machine hit all of
    them alike."""
    timer = thread_ms if clock == "thread" else wall_ms
    names = list(fns)
    for name in names:  # warm-up (allocator, lazy init, caches)
        fns[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(timer(fns[name], inner))
    return {n: stat(s) for n, s in samples.items()}


# ---------------------------------------------------------------------------------------- memory


class SavedTensors:
    """Counts the bytes autograd saves for backward while active (unique storages, parameters
    and ``exclude`` storages left out).

    ``total_bytes``: everything saved while active. ``alive_bytes``: what is still held by a live
    graph. The pack hook keeps a weak reference to a *detached* alias: returning the tensor itself
    would make a cycle through its ``grad_fn`` that Python's GC cannot see (graphs never freed).
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self._saved: list[tuple[weakref.ref, int, int]] = []

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        d = t.detach()
        s = t.untyped_storage()
        if s.data_ptr() not in self._exclude and not isinstance(t, torch.nn.Parameter):
            self._saved.append((weakref.ref(d), s.data_ptr(), s.nbytes()))
        return d

    def __enter__(self) -> SavedTensors:
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda d: d)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)

    def total_bytes(self) -> int:
        return sum({p: n for _, p, n in self._saved}.values())

    def alive_bytes(self) -> int:
        return sum({p: n for r, p, n in self._saved if r() is not None}.values())


def graph_nodes(t: torch.Tensor) -> int:
    """Number of autograd nodes reachable from ``t.grad_fn``."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(f for f, _ in fn.next_functions)
    return len(seen)


MiB = 2**20


# ---------------------------------------------------------------------------------------- machine

_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "avx_vnni")


def cpu_flags() -> list[str]:
    """The CPU flags that decide low-precision speed (from /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [x for x in _FLAGS if x in have]
    except OSError:
        pass
    return []


def native_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic (avx512_bf16 or AMX), i.e. oneDNN runs bf16 natively.

    ``ONEDNN_MAX_CPU_ISA`` capped below bf16 (``AVX2``, ``AVX512_CORE``: how an AVX2-only machine is
    simulated) turns it off, whatever the flags say."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    if not any(k in cap for k in ("ALL", "BF16", "FP16", "AMX", "AVX10")):
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    if importlib.util.find_spec(module) is None:
        return None
    try:
        return version(module)
    except PackageNotFoundError:
        return "unknown"


def environment() -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    env = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": model,
        "cpu_flags": cpu_flags(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "timing": "thread CPU time, 1 intra-op thread, interleaved repeats, medians (wall-clock where noted)",
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "optional": {m: _version(m) for m in ("bitsandbytes", "einops", "numpy")},
    }
    return env


def env_line(env: dict) -> str:
    flags = ",".join(env["cpu_flags"]) or "none of " + ",".join(_FLAGS[:3])
    load = "/".join(f"{x:.1f}" for x in env["load_avg"] or [])
    return (
        f"torch {env['torch']} | {env['cpu']} | flags {flags} | capability {env['cpu_capability']} | "
        f"{env['cores']} cores, load {load} | CUDA: {env['cuda'] or 'none'} | {env['date']}"
    )
