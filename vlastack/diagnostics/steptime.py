"""Where a training step's time goes, read from a ``torch.profiler`` trace of a few steps.

The doctor's loop marks each step and its data / host-to-device phases with ``record_function``
ranges (``doctor::step``, ``doctor::data``, ``doctor::h2d``) and the model's forward with
``doctor::forward`` (module hooks). The rest comes from names torch itself emits: backward is
every ``autograd::engine::evaluate_function`` range (recomputation under activation checkpointing
included), the optimizer is ``Optimizer.step#...`` and ``Optimizer.zero_grad#...``, and a host
sync is ``aten::_local_scalar_dense`` (what ``.item()``, ``float(t)``, ``bool(t)`` call) plus, on
CUDA, explicit stream/device synchronizations; ``SyncLocator`` finds their source lines (the
profiler's Python stacks name only the enclosing function, and distort the timing). Phases are made exclusive in the order syncs >
optimizer > backward > forward > h2d > data; what no phase covers is "other" (gradient clipping,
the scheduler, Python between phases).

"Ops" are the leaf ``aten::`` ops on the CPU (the ones that run a kernel) and CUDA kernels on a
GPU; "short" means under 10 us, the scale at which launch and dispatch overhead dominate.
"""

from __future__ import annotations

import bisect
import os
import traceback
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PHASES = ("data", "h2d", "forward", "backward", "optimizer", "host_syncs", "other")
SHORT_US = 10.0
MATMUL_WORDS = ("mm", "addmm", "bmm", "matmul", "linear", "conv", "scaled_dot_product", "attention", "gemm")
CUDA_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


# ----------------------------------------------------------------------------- intervals


def union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``a`` minus ``b`` (both unions)."""
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def length(iv: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in iv)


# ----------------------------------------------------------------------------- classification


def _phase_of(name: str) -> str | None:
    if name == "doctor::data":
        return "data"
    if name == "doctor::h2d":
        return "h2d"
    if name == "doctor::forward":
        return "forward"
    if name.startswith("autograd::engine::evaluate_function"):
        return "backward"
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return "optimizer"
    if name == "aten::_local_scalar_dense" or name in CUDA_SYNCS:
        return "host_syncs"
    return None


def _is_cuda(e) -> bool:
    dt = getattr(e, "device_type", None)
    return dt is not None and str(dt).endswith("CUDA")


def _is_project_frame(path: str) -> bool:
    p = path.replace("\\", "/")
    return not ("/torch/" in p or "site-packages" in p or p.startswith("<") or "/vlastack/diagnostics/" in p)


_PLUMBING = ("/torch/_dynamo/", "/torch/utils/", "/torch/_ops.py", "/torch/_compile.py", "/torch/_tensor.py")


def _short(path: str) -> str:
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


class SyncLocator(TorchDispatchMode):
    """Records where host syncs happen, to the source line: every ``aten::_local_scalar_dense``
    (``.item()``, ``float(t)``, ``bool(t)``) and every copy from a CUDA tensor to the CPU
    (``.cpu()``, ``.tolist()``, ``.numpy()`` on CUDA). Keyed by the first frame outside torch and
    this package, with the innermost frame (``via``) and the source line."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, dict] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default or (
            func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)
            and _d2h(func, args, kwargs)
        ):
            self._record(func)
        return func(*args, **kwargs)

    def _record(self, func) -> None:
        stack = traceback.extract_stack()[:-2]
        inner = next((f for f in reversed(stack) if not any(p in f.filename for p in _PLUMBING)), None)
        frame = next((f for f in reversed(stack) if _is_project_frame(f.filename)), inner)
        if frame is None:
            return
        where = f"{_short(frame.filename)}:{frame.lineno} ({frame.name})"
        via = f"{_short(inner.filename)}:{inner.lineno} ({inner.name})" if inner else ""
        d = self.found.setdefault(where, {"where": where, "via": via, "code": (frame.line or "").strip(),
                                          "op": str(func.overloadpacket.__name__), "count": 0})  # fmt: skip
        d["count"] += 1


def _d2h(func, args, kwargs) -> bool:
    if func is torch.ops.aten.copy_.default:  # copy_(dst, src)
        return args[0].device.type == "cpu" and args[1].device.type == "cuda"
    dev = kwargs.get("device")
    return args[0].device.type == "cuda" and dev is not None and torch.device(dev).type == "cpu"


def is_matmul(name: str) -> bool:
    n = name.lower().removeprefix("aten::")
    return any(w in n for w in MATMUL_WORDS)


# ----------------------------------------------------------------------------- analysis


def analyze(events, on_gpu: bool = False) -> dict:
    """Per-step breakdown, host-sync count, op counts and top ops from profiler events
    (``prof.events()``) of steps marked with ``doctor::step``."""
    steps = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == "doctor::step")
    if not steps:
        raise ValueError("no doctor::step ranges in the trace")
    lo, hi = steps[0][0], steps[-1][1]
    n = len(steps)
    phase_iv: dict[str, list] = defaultdict(list)
    syncs = {"count": 0, "time_us": 0.0}
    ops: dict[str, list[float]] = defaultdict(list)  # name -> self times (CPU) / durations (CUDA)
    kernels: list[tuple[float, float]] = []
    leaves: list[float] = []  # durations of CPU leaf ops (the ones that run a kernel) or CUDA kernels
    cpu_ops: list[tuple] = []
    for e in events:
        s, t = e.time_range.start, e.time_range.end
        if t < lo or s > hi:
            continue
        if on_gpu and _is_cuda(e):
            kernels.append((s, t))
            leaves.append(t - s)
            ops[e.name].append(t - s)
            continue
        ph = _phase_of(e.name)
        if ph:
            phase_iv[ph].append((s, t))
        if ph == "host_syncs":
            syncs["count"] += 1
            syncs["time_us"] += t - s
        if not on_gpu and e.name.startswith("aten::"):
            # Time by self time: composite ops nest (linear -> addmm -> resolve_conj).
            cpu_ops.append((s, e.name, e.self_cpu_time_total, t - s, e))
    steps_iv = union(steps)
    total = length(steps_iv)
    taken: list[tuple[float, float]] = []
    time_us = {}
    for ph in ("host_syncs", "optimizer", "backward", "forward", "h2d", "data"):
        own = _intersect(subtract(union(phase_iv[ph]), taken), steps_iv)
        time_us[ph] = length(own)
        taken = union(taken + own)
    time_us["other"] = max(0.0, total - length(taken))
    loading = union(phase_iv["data"] + phase_iv["h2d"])
    starts = [a for a, _ in loading]
    for s, name, self_us, dur, e in cpu_ops:
        k = bisect.bisect_right(starts, s) - 1
        if k >= 0 and s < loading[k][1]:
            continue  # collate / decode ops of the data loader are data wait, not compute
        ops[name].append(self_us)
        if not any(c.name.startswith("aten::") for c in e.cpu_children):
            leaves.append(dur)
    op_time = sum(d for v in ops.values() for d in v)
    leaf_time = sum(leaves)
    short = [d for d in leaves if d < SHORT_US]
    mm_time = sum(sum(v) for k, v in ops.items() if is_matmul(k))
    top = sorted(ops.items(), key=lambda kv: -sum(kv[1]))[:15]
    compute_window = total - time_us["data"] - time_us["h2d"]
    out = {
        "profiled_steps": n,
        "profiled_step_time_s": total / n / 1e6,
        "phase_s": {ph: time_us[ph] / n / 1e6 for ph in PHASES},
        "phase_fraction": {ph: time_us[ph] / max(total, 1e-9) for ph in PHASES},
        "host_syncs": {"per_step": syncs["count"] / n, "time_s_per_step": syncs["time_us"] / n / 1e6},
        "kernel_kind": "CUDA kernels" if on_gpu else "CPU leaf aten ops",
        "kernels_per_step": len(leaves) / n,
        "short_kernel_fraction": len(short) / max(len(leaves), 1),
        "short_kernel_time_fraction": sum(short) / max(leaf_time, 1e-9),
        "kernel_time_fraction": op_time / max(compute_window, 1e-9) if not on_gpu else None,
        "matmul_time_fraction": mm_time / max(op_time, 1e-9),
        "gpu_busy_fraction": length(union(kernels)) / max(total, 1e-9) if on_gpu else None,
        "top_ops": [
            {
                "name": k,
                "calls_per_step": len(v) / n,
                "time_ms_per_step": sum(v) / n / 1e3,
                "mean_us": sum(v) / len(v),
                "share": sum(v) / max(op_time, 1e-9),
            }
            for k, v in top
        ],
    }
    if not on_gpu:
        # On a CPU every op is synchronous: time outside ops is Python + dispatcher overhead.
        out["host_overhead_fraction"] = max(0.0, 1.0 - out["kernel_time_fraction"])
    return out


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for s, e in a:
        for bs, be in b:
            lo, hi = max(s, bs), min(e, be)
            if lo < hi:
                out.append((lo, hi))
    return out


def verdict(step: dict, data_wait_fraction: float, on_gpu: bool) -> tuple[str, list[str]]:
    """The bottleneck and the numbers behind it (thresholds documented in docs/doctor.md)."""
    why = [f"data wait {data_wait_fraction:.0%} of the step"]
    if data_wait_fraction >= 0.25:
        return "data-bound", why
    short = step["short_kernel_time_fraction"]
    mm = step["matmul_time_fraction"]
    if on_gpu:
        busy = step["gpu_busy_fraction"] or 0.0
        why += [f"GPU busy {busy:.0%}", f"{short:.0%} of kernel time in kernels < 10 us"]
        if busy < 0.6:
            return "launch/host-bound", why
    else:
        over = step["host_overhead_fraction"]
        why += [f"{over:.0%} of compute time outside ops (Python/dispatch)",
                f"{short:.0%} of op time in ops < 10 us"]  # fmt: skip
        if over >= 0.4 or short >= 0.3:
            return "launch/host-bound", why
    why.append(f"matmul/attention ops {mm:.0%} of op time")
    return ("compute-bound", why) if mm >= 0.5 else ("memory-bound", why)


# ----------------------------------------------------------------------------- model parts

MODULE_RANGE = "doctor::module::"  # record_function prefix of the per-module ranges (``part_hooks``)
PARTS = ("vision_encoder", "vlm_decoder", "joint_attention", "action_expert", "head_and_loss")


def part_of_module(name: str) -> str:
    """Which part of a ``VLA`` a module name (``named_modules``) belongs to. Code that runs in a
    module's own ``forward`` outside its children counts for that module: the joint attention
    (SDPA, RoPE, the experts' concatenation) runs in ``decoder.layers.N`` itself, the flow
    interpolation and the losses in the root (``head.loss`` is a method, not a module call)."""
    n = name.removeprefix("module.").removeprefix("_orig_mod.")
    parts = n.split(".")
    if n.startswith(("vision", "projector")):
        return "vision_encoder"
    if n.startswith("decoder.layers.") and len(parts) >= 4 and parts[3] == "expert":
        return "action_expert"
    if n.startswith("decoder.expert_norm"):
        return "action_expert"
    if n.startswith("decoder.layers.") and len(parts) >= 4:
        return "vlm_decoder"
    if n.startswith(("decoder.layers.", "decoder.rope")) or n == "decoder":
        return "joint_attention"
    if n.startswith("decoder."):
        return "vlm_decoder"
    return "head_and_loss"


def part_hooks(model: torch.nn.Module) -> list:
    """Forward pre/post hooks on every submodule that open and close a ``record_function`` range
    named after it, for ``part_times``. Returns the hook handles (``.remove()`` them to undo)."""
    from torch.profiler import record_function

    handles = []
    for name, m in model.named_modules():
        stack: list = []

        def pre(_m, _args, name=name, stack=stack):
            rf = record_function(MODULE_RANGE + name)
            rf.__enter__()
            stack.append(rf)

        def post(_m, _args, _out, stack=stack):
            if stack:
                stack.pop().__exit__(None, None, None)

        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post, always_call=True))
    return handles


def part_times(events) -> dict[str, float]:
    """Forward + backward op time per model part (``PARTS``), microseconds per profiled step.

    A forward op counts for the innermost module range (``part_hooks``) around it; a backward
    node (``autograd::engine::evaluate_function``) for the part of the forward op that created it,
    matched by the autograd sequence number. Gradient accumulation into ``.grad`` has no forward
    op and counts as ``grad_accumulation``."""
    evs = sorted(events, key=lambda e: (e.time_range.start, -e.time_range.end))
    n_steps = sum(1 for e in evs if e.name == "doctor::step") or 1
    seq_part: dict[int, str] = {}
    out: dict[str, float] = defaultdict(float)
    stack: list[tuple[float, str]] = []  # open module ranges: (end, part)
    in_op_until = -1.0  # end of the top-level aten op being inside (its children are not counted)
    for e in evs:
        s, t = e.time_range.start, e.time_range.end
        while stack and stack[-1][0] <= s:
            stack.pop()
        if e.name.startswith(MODULE_RANGE):
            stack.append((t, part_of_module(e.name[len(MODULE_RANGE) :])))
            continue
        if e.name.startswith("autograd::engine::evaluate_function"):
            if "AccumulateGrad" in e.name:
                out["grad_accumulation"] += t - s
            else:
                out[seq_part.get(e.sequence_nr, "head_and_loss")] += t - s
            in_op_until = max(in_op_until, t)
            continue
        if not e.name.startswith("aten::") or s < in_op_until or not stack:
            continue  # nested in a counted op, or outside the model's forward (optimizer, data)
        part = stack[-1][1]
        out[part] += t - s
        in_op_until = t
        todo = [e]  # composite ops: the node may belong to a descendant (linear -> matmul -> mm)
        while todo:
            x = todo.pop()
            if x.sequence_nr >= 0:
                seq_part[x.sequence_nr] = part
            todo.extend(x.cpu_children)
    return {k: v / n_steps for k, v in out.items()}
