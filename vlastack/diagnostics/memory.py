"""Memory measurement: peak readings for logs, a live-tensor tracker with a breakdown at the peak,
and the CPU allocator's peak as recorded by the profiler.

``LiveTensorTracker`` is a ``TorchDispatchMode`` that follows every tensor storage created under it
(and the ones registered with ``track``) until Python frees it, so it reads the same on real tensors
and under ``FakeTensorMode``: that is how ``vla plan`` predicts a peak without allocating it. At the
peak it keeps a snapshot of the live storages and sorts them into parameters, gradients, optimizer
state, activations saved for backward, inputs and temporaries (everything else: outputs not saved,
backward scratch, the loss), with the saved activations attributed to the module that saved them.

What it cannot see: buffers a kernel allocates inside itself (oneDNN/cuBLAS workspaces) and the
allocator's own rounding/caching. ``cpu_allocator_peak`` measures those on CPU (torch's profiler
reports every CPU allocation when ``profile_memory=True``); on CUDA, ``torch.cuda`` memory stats do.
"""

from __future__ import annotations

import gc
import re
import time
import weakref
from collections.abc import Callable, Iterable
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from vlastack.train.logs import peak_memory_mb, reset_peak_memory  # noqa: F401 - lives below, re-exported

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "inputs", "temporaries")
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20}
_UNITS.update({"g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40})


def parse_bytes(text: str | int | float) -> int:
    """``"80GiB"``, ``"512MiB"``, ``"1.5e9"``, ``"24GB"`` -> bytes (binary units for G/M/K alone)."""
    if isinstance(text, int | float):
        return int(text)
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"cannot read memory size {text!r}: use e.g. 80GiB, 512MiB, 24GB")
    return int(float(m.group(1)) * _UNITS[unit])


def fmt_bytes(n: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= f:
            return f"{n / f:.2f} {unit}"
    return f"{int(n)} B"


def _storage(t: Tensor):
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse / nested / functional wrappers
        return None


def storage_keys(tensors: Iterable[Tensor]) -> set[int]:
    """Identities (the C++ StorageImpl address) of the storages behind ``tensors``."""
    out = set()
    for t in tensors:
        st = _storage(t) if isinstance(t, Tensor) else None
        if st is not None:
            out.add(st._cdata)
    return out


def _scalar_for(t: Tensor, falsy: WeakIdKeyDictionary):
    # Fake tensors have no values: assume well-formed data. Checks read "if bad.any(): raise" or
    # "if not torch.isfinite(loss)": an ``any`` reads False, every other boolean True, numbers 1.
    if t.dtype == torch.bool:
        return t not in falsy
    return 1 if not (t.is_floating_point() or t.is_complex()) else 1.0


class LiveTensorTracker(TorchDispatchMode):
    """Bytes of live tensor storages, their peak, and a categorised snapshot at the peak.

    ``roles``: called at each new peak with no argument; returns ``{category: storage keys}`` for
    parameters, gradients, optimizer_state and inputs (see ``training_roles``). ``fake_scalars``:
    answer ``.item()``-style reads (which fake tensors cannot) with a plausible constant (see
    ``_scalar_for``), so that a training step with host syncs runs unchanged under ``FakeTensorMode``.
    ``fused_optimizer``: count only what survives each optimizer step (its state), as a fused
    AdamW kernel allocates nothing else; the foreach step that actually runs holds full-size
    temporaries. Fused AdamW itself does not run under ``FakeTensorMode`` with this tracker
    (torch 2.13: a segfault reading a parameter's storage after the fused step).
    """

    def __init__(
        self,
        roles: Callable[[], dict[str, set[int]]] | None = None,
        fake_scalars: bool = False,
        timeline_every: int = 1,
        fused_optimizer: bool = False,
    ) -> None:
        super().__init__()
        self.fused_optimizer = fused_optimizer
        self._defer = False  # inside a step whose temporaries a fused kernel would not make
        self.pending: dict[int, int] = {}  # storages made in that step, counted if they outlive it
        self.roles = roles or dict
        self.fake_scalars = fake_scalars
        self.live: dict[int, int] = {}
        self.total = self.peak = 0
        self.peak_snapshot: dict[int, int] = {}
        self.peak_roles: dict[str, set[int]] = {}
        self.peak_phase = ""
        # the peak of each phase (forward, backward, optimizer, ...) with its own snapshot, taken
        # like the global one: when memory is about to fall, or when the phase ends
        self.phase_peaks: dict[str, int] = {}
        self.phase_snapshots: dict[str, tuple] = {}
        self._phase_dirty: str | None = None
        self._phase = "setup"
        self.saved: dict[int, str] = {}  # storage key -> module that saved it for backward
        self.module_stack: list[str] = []
        self.timeline: list[tuple[float, int, str]] = []  # (perf_counter s, live bytes, phase)
        self.timeline_every = timeline_every
        self._ops = 0
        self._dirty = False
        self._falsy = WeakIdKeyDictionary()

    # --------------------------------------------------------------- bookkeeping
    def track(self, tensors: Iterable[Tensor]) -> None:
        """Count tensors made before the tracker started (parameters, a batch)."""
        for t in tensors:
            if isinstance(t, Tensor):
                self._add(t)

    def _add(self, t: Tensor) -> None:
        st = _storage(t)
        if st is None:
            return
        key = st._cdata
        n = st.nbytes()
        old = self.live.get(key)
        if old is None and self._defer:
            if key not in self.pending:
                weakref.finalize(st, self._free, key)
            self.pending[key] = n
            return
        if old is None:
            weakref.finalize(st, self._free, key)
        elif old == n:
            return
        self.live[key] = n
        self.total += n - (old or 0)
        if self.total > self.peak:
            self.peak = self.total
            self._dirty = True
        if self.total > self.phase_peaks.get(self._phase, 0):
            self.phase_peaks[self._phase] = self.total
            self._phase_dirty = self._phase

    def _free(self, key: int) -> None:
        if self.pending.pop(key, None) is not None:  # a temporary of a deferred step
            return
        if self._dirty:  # memory is about to fall: the moment before was a new peak
            self._take_snapshot()
        if self._phase_dirty:
            self._take_phase_snapshot()
        self.total -= self.live.pop(key, 0)
        self.saved.pop(key, None)

    def _end_defer(self) -> None:
        """The step is over: what it made and still holds (the optimizer state) now counts."""
        self._defer = False
        for key, n in self.pending.items():
            self.live[key] = n
            self.total += n
        self.pending.clear()
        if self.total > self.phase_peaks.get(self._phase, 0):
            self.phase_peaks[self._phase] = self.total
            self._take_phase_snapshot(self._phase)
        if self.total > self.peak:
            self.peak = self.total
            # Now, not at the next free: that is ``zero_grad`` dropping a gradient, and reading
            # the parameters' storages from inside that finalizer crashes torch (seen: segfault).
            self._take_snapshot()

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        if value != self._phase and self._phase_dirty:  # the ending phase's peak is now final
            self._take_phase_snapshot()
        self._phase = value

    def _take_phase_snapshot(self, phase: str | None = None) -> None:
        phase = phase or self._phase_dirty
        self._phase_dirty = None
        self.phase_snapshots[phase] = (dict(self.live), self.roles(), dict(self.saved))

    def _take_snapshot(self) -> None:
        self._dirty = False
        self.peak_snapshot = dict(self.live)
        self.peak_roles = self.roles()
        self.peak_saved = dict(self.saved)
        self.peak_phase = self.phase

    def finish(self) -> None:
        if self._dirty:
            self._take_snapshot()
        if self._phase_dirty:
            self._take_phase_snapshot()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.fake_scalars and func in (
            torch.ops.aten._local_scalar_dense.default,
            torch.ops.aten.item.default,
        ):
            return _scalar_for(args[0], self._falsy)
        out = func(*args, **(kwargs or {}))
        if self.fake_scalars and func.overloadpacket is torch.ops.aten.any and isinstance(out, Tensor):
            self._falsy[out] = True
        for t in tree_leaves(out):
            if isinstance(t, Tensor):
                self._add(t)
        self._ops += 1
        if self._ops % self.timeline_every == 0:
            self.timeline.append((time.perf_counter(), self.total, self.phase))
        return out

    # --------------------------------------------------------------- hooks
    @contextmanager
    def watch(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None):
        """Phase (forward / backward / optimizer) and saved-for-backward tracking for one model."""
        names = {m: n or "<root>" for n, m in model.named_modules()}
        handles = []

        def pre(mod, _args):
            if mod is model:
                self.phase = "forward"
            self.module_stack.append(names.get(mod, type(mod).__name__))

        def post(mod, _args, _out):
            if self.module_stack:
                self.module_stack.pop()
            if mod is model:
                self.phase = "backward"  # until the optimizer starts (or the next forward)

        for m in names:
            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post, always_call=True))

        def step_pre(*_a):
            self.phase = "optimizer"
            self._defer = self.fused_optimizer

        def step_post(*_a):
            self.phase = "after"
            if self._defer:
                self._end_defer()
            if self._dirty:  # see _end_defer: not from inside zero_grad's finalizers
                self._take_snapshot()
            if self._phase_dirty:
                self._take_phase_snapshot()

        if optimizer is not None:
            handles.append(optimizer.register_step_pre_hook(step_pre))
            handles.append(optimizer.register_step_post_hook(step_post))

        def pack(t: Tensor):
            st = _storage(t)
            if st is not None and st._cdata not in self.saved:
                self.saved[st._cdata] = self.module_stack[-1] if self.module_stack else "<root>"
            return t

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield self
        finally:
            for h in handles:
                h.remove()

    # --------------------------------------------------------------- results
    def breakdown(self, module_depth: int = 3) -> dict:
        """Bytes per category at the peak, and saved activations per module (``module_depth`` name parts)."""
        self.finish()
        per_module: dict[str, int] = {}
        cats = _categorise(self.peak_snapshot, self.peak_roles, getattr(self, "peak_saved", {}), per_module,
                           module_depth)  # fmt: skip
        top = dict(sorted(per_module.items(), key=lambda kv: -kv[1])[:12])
        phases = {
            ph: {"peak_bytes": self.phase_peaks[ph], "categories": _categorise(*self.phase_snapshots[ph])}
            for ph in self.phase_snapshots
        }
        return {
            "peak_bytes": self.peak,
            "phase_at_peak": self.peak_phase,
            "categories": cats,
            "activations_by_module": top,
            "phases": phases,  # each phase's own peak and breakdown (vla plan's FSDP derivation)
        }


def _categorise(
    snap: dict, roles: dict, saved: dict, per_module: dict | None = None, module_depth: int = 3
) -> dict:
    """Bytes per category of a snapshot of live storages (saved activations per module into
    ``per_module``)."""
    cats = dict.fromkeys(CATEGORIES, 0)
    for key, n in snap.items():
        for cat in ("parameters", "gradients", "optimizer_state", "inputs"):
            if key in roles.get(cat, ()):
                cats[cat] += n
                break
        else:
            if key in saved:
                cats["activations"] += n
                if per_module is not None:
                    mod = ".".join(saved[key].split(".")[:module_depth])
                    per_module[mod] = per_module.get(mod, 0) + n
            else:
                cats["temporaries"] += n
    return cats


def training_roles(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    inputs: Iterable[Tensor] | Callable[[], Iterable[Tensor]] = (),
) -> Callable[[], dict[str, set[int]]]:
    """The ``roles`` callback of ``LiveTensorTracker`` for a model, its optimizer and a batch
    (``inputs``: the batch's tensors, or a callable returning the current batch's)."""
    fixed = None if callable(inputs) else list(inputs)

    def roles() -> dict[str, set[int]]:
        params = list(model.parameters()) + list(model.buffers())
        opt: list[Tensor] = []
        if optimizer is not None:
            for st in optimizer.state.values():
                opt.extend(v for v in st.values() if isinstance(v, Tensor))
        return {
            "parameters": storage_keys(params),
            "gradients": storage_keys(p.grad for p in model.parameters() if p.grad is not None),
            "optimizer_state": storage_keys(opt),
            "inputs": storage_keys(fixed if fixed is not None else inputs()),
        }

    return roles


def cpu_allocation_events(fn: Callable[[], object]) -> list[tuple[int, int, int]]:
    """Every allocation and free torch's CPU allocator makes while ``fn`` runs, in time order:
    (time ns, bytes: + allocated / - freed, the allocator's running total after it). From the
    profiler's memory events (``profile_memory=True``); it records every op, so it is for
    measurement runs, not hot loops."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    gc.collect()  # garbage from earlier runs would otherwise be freed (and counted) in this one
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            f = node.extra_fields
            events.append((node.start_time_ns, f.alloc_size, f.total_allocated))
    events.sort()
    return events


def cpu_allocator_peak(fn: Callable[[], object]) -> int:
    """Peak bytes held by torch's CPU allocator while ``fn`` runs, counting only what ``fn`` allocates.

    Kernel-internal buffers count, pages the OS has not touched yet count too (they are allocated).
    """
    events = cpu_allocation_events(fn)
    if not events:
        return 0
    # Each event carries the allocator's running total of what it handed out while a profiler
    # recorded memory (in this or an earlier session): the peak is the largest total minus the
    # total just before this session's first allocation.
    base = events[0][2] - events[0][1]
    return max(e[2] for e in events) - base


def cuda_memory_stats(device: torch.device) -> dict | None:
    """Allocated / reserved peaks and allocator overhead on CUDA; ``None`` elsewhere."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    alloc = torch.cuda.max_memory_allocated(device)
    reserved = torch.cuda.max_memory_reserved(device)
    return {
        "peak_allocated_bytes": alloc,
        "peak_reserved_bytes": reserved,
        "allocator_overhead_bytes": reserved - alloc,
    }
