"""L13 compile: where torch.compile helps (memory-bound fusion) and where not (matmul); its semantics.

One process compiles everything here: the first Inductor compile pays ~10-20 s of warm-up, which
is why this lab is marked slow (excluded from the default test suite, run by `vla lab all`).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from vlastack.labs._core import Ctx, Finding, Lab, Skip, compare

LAB = Lab(
    "compile",
    "torch.compile: fusion speedups vs matmul, compile time, graph breaks, recompiles, failures",
    slow=True,
)


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def pointwise(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * 1.5 + 0.5) * torch.tanh(x) - x.exp() * 0.01


def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)).to(x.dtype)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


class TinyMLP(nn.Module):
    def __init__(self, d: int = 128, depth: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU()) for _ in range(depth)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return x


@LAB.check("S2-25", "S0-33", "S2-23", "S2-26", "S4-17", "S4-18")
def where_compile_helps(ctx: Ctx) -> Finding:
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    x = torch.randn(ctx.n(4 * 2**20, 2**20))
    h, w = torch.randn(ctx.n(4096, 2048), 1024), torch.zeros(1024)
    m = ctx.n(1024, 512)
    a, b = torch.randn(m, m), torch.randn(m, m)
    mlp = TinyMLP(depth=4).eval()
    xb = torch.randn(1, 128)
    cases = {
        "pointwise chain": (pointwise, (x,)),
        "RMSNorm": (rmsnorm, (h, w)),
        f"matmul {m}^3": (matmul, (a, b)),
        "batch-1 4-block MLP": (mlp, (xb,)),
    }
    if ctx.quick:  # each Inductor compile costs seconds on a small machine
        del cases["RMSNorm"], cases["batch-1 4-block MLP"]
    rows, speed, code = [], {}, ""
    # One compile worker (no pool on a small shared machine); no on-disk cache, so the first call
    # measures a real compile rather than a cache hit from an earlier run. Restored afterwards.
    for name, (fn, args) in cases.items():
        cfn = torch.compile(fn)
        t0 = time.perf_counter()
        with torch.no_grad(), inductor_config.patch(compile_threads=1, force_disable_caches=True):
            if not code:  # the first case: also keep the generated code
                _, codes = run_and_get_code(cfn, *args)
                code = "\n".join(codes)
            else:
                cfn(*args)
        compile_s = time.perf_counter() - t0
        with torch.no_grad():
            t = compare(
                {
                    "eager": lambda fn=fn, args=args: fn(*args),
                    "compiled": lambda cfn=cfn, args=args: cfn(*args),
                },
                reps=ctx.n(7, 5),
                inner=ctx.n(3, 2) if "MLP" not in name else 50,
            )
        speed[name] = t["eager"] / t["compiled"]
        rows.append(
            {
                "work": name,
                "eager ms": t["eager"],
                "compiled ms": t["compiled"],
                "speedup": speed[name],
                "first call s (wall)": compile_s,
            }
        )
    end_to_end = {} if ctx.quick else _demo_end_to_end(ctx, rows)
    speed.update(end_to_end)
    with _CountOps() as counter:
        pointwise(x[:16])
    kernels = len(set(re.findall(r"cpp_fused_\w+", code)))
    cpp = 'extern "C"' in code or "cpp_fused" in code
    pw = speed["pointwise chain"]
    mm = speed[f"matmul {m}^3"]
    # end to end: compiled must not be slower (a regression there is a bug, not a finding)
    ok = pw >= 1.5 and 0.8 <= mm <= 1.25 and cpp and all(v >= 0.9 for v in end_to_end.values())
    return Finding(
        "speedup (thread time, 1 thread): "
        + ", ".join(f"{k} {v:.2f}x" for k, v in speed.items())
        + f"; eager pointwise = {len(counter.ops)} aten ops, compiled = {kernels} fused C++ kernel(s) "
        f"(generated C++/OpenMP, not Triton, on CPU: {cpp})",
        ok,
        "Corrected: the gain depends on where time goes. Memory-bound chains of small ops fuse into "
        "one loop (the big wins); a matmul already runs a tuned BLAS kernel (~1.0x); '~20% end to end' "
        "is a property of a model's op mix, not of compile: measured end to end on the demo model, "
        "the training step (forward, backward, AdamW; matmul-heavy) gains about that, the batch-1 "
        "sampler (small ops, Python overhead) much more. First calls take seconds (compilation). "
        "The 245 -> 75 ms figure is open-pi-zero's README (RTX 4090), not measurable here; vlastack's "
        "own figures are in bench/results/latency*.json.",
        data={"speedup": speed},
        rows=rows,
    )


def _demo_end_to_end(ctx: Ctx, rows: list[dict]) -> dict[str, float]:
    """The claim's own unit: the demo model's whole training step (batch 32: forward, backward,
    AdamW) and its whole sampler (batch 1: prefix pass plus the Euler loop), eager vs compiled
    (``fullgraph=True``), fp32. Appends rows; returns {name: speedup}."""
    import torch._inductor.config as inductor_config

    from vlastack.batch import dummy_batch
    from vlastack.config import load_config
    from vlastack.config.io import load_yaml
    from vlastack.models import build_model
    from vlastack.train.optim import build_optimizer
    from vlastack.train.step import train_step

    cfg = load_yaml("demo_fp32", base=load_config("tiny", "demo"))  # the demo's fp32 recipe
    out = {}
    for name in ("demo training step (batch 32)", "demo sampler (batch 1)"):
        torch._dynamo.reset()
        models = {}
        for mode in ("eager", "compiled"):
            torch.manual_seed(0)  # both start from the same weights and see the same batch
            model = build_model(cfg.model)
            if "training" in name:
                opt = build_optimizer(model, cfg.train)
                batch = dummy_batch(cfg.model, 32)
                if mode == "compiled":
                    model.compile(fullgraph=True, dynamic=False)

                def fn(model=model, opt=opt, batch=batch):
                    return train_step(model, opt, [batch], device_type="cpu", precision="fp32")
            else:
                model.eval()
                batch = dummy_batch(cfg.model, 1, train=False)
                sample = model.sample_actions
                if mode == "compiled":
                    sample = torch.compile(sample, fullgraph=True, dynamic=False)

                def fn(sample=sample, batch=batch):
                    with torch.inference_mode():
                        return sample(batch)

            models[mode] = fn
        t0 = time.perf_counter()
        with inductor_config.patch(compile_threads=1, force_disable_caches=True):
            models["compiled"]()
        compile_s = time.perf_counter() - t0
        t = compare(models, reps=ctx.n(7, 3), inner=ctx.n(3, 1))
        out[name] = t["eager"] / t["compiled"]
        rows.append(
            {
                "work": name,
                "eager ms": t["eager"],
                "compiled ms": t["compiled"],
                "speedup": out[name],
                "first call s (wall)": compile_s,
            }
        )
    return out


def _branchy(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # data-dependent Python control flow
        return x * 2
    return x - 1


@LAB.check("S1-17", "S0-10")
def graph_breaks(ctx: Ctx) -> Finding:
    torch._dynamo.reset()
    exp = torch._dynamo.explain(_branchy)(torch.ones(4))
    reason = str(exp.break_reasons[0].reason).splitlines()[0][:90] if exp.break_reasons else ""
    ok = exp.graph_count == 2 and exp.graph_break_count == 1
    return Finding(
        f"explain(if x.sum() > 0: ...): {exp.graph_count} graphs, {exp.graph_break_count} break ('{reason}')",
        ok,
        "Caveat: compile captures code without data-dependent Python control flow; each such `if` "
        "splits the graph and runs the decision in Python (torch.cond or a torch.where keeps one graph).",
    )


def _counting_backend(counter: list):
    def backend(gm, example_inputs):
        counter.append(len(example_inputs))
        return gm.forward

    return backend


@LAB.check("S2-27")
def recompiles(ctx: Ctx) -> Finding:
    torch._dynamo.reset()
    shapes: list = []
    f = torch.compile(lambda x: x * 2 + 1, backend=_counting_backend(shapes))
    for n in range(2, 8):
        f(torch.ones(n))
    ints: list = []
    g = torch.compile(lambda x, k: x * k, backend=_counting_backend(ints))
    for k in range(10):
        g(torch.ones(3), k)
    ok = len(shapes) == 2 and len(ints) == 2
    return Finding(
        f"sizes 2..7 -> {len(shapes)} compiles; a Python int argument 0..9 -> {len(ints)} compiles",
        ok,
        "Caveat: a changed shape or int recompiles once, then dynamo marks it dynamic and reuses one "
        "graph; what hurts is data-dependent control flow (graph breaks) and many distinct guards.",
    )


@LAB.check("S2-28")
def no_torchdynamo_compiled_attribute(ctx: Ctx) -> Finding:
    from torch._dynamo.eval_frame import OptimizedModule

    m = torch.compile(nn.Linear(2, 2), backend="eager")
    has = hasattr(m, "_torchdynamo_compiled")
    ok = not has and isinstance(m, OptimizedModule) and isinstance(m._orig_mod, nn.Linear)
    return Finding(
        f"hasattr(compiled, '_torchdynamo_compiled') = {has}; isinstance(OptimizedModule) = "
        f"{isinstance(m, OptimizedModule)}; ._orig_mod is the original",
        ok,
        "False: the attribute does not exist (AttributeError). Test isinstance(m, "
        "torch._dynamo.eval_frame.OptimizedModule) or use m._orig_mod.",
        verdict="F",
    )


@LAB.check("S2-29")
def failing_compile_raises(ctx: Ctx) -> Finding:
    import torch._dynamo.config as dcfg

    def broken(gm, example_inputs):
        raise RuntimeError("backend exploded")

    torch._dynamo.reset()
    f = torch.compile(lambda x: x + 1, backend=broken)
    try:
        f(torch.ones(2))
        default = "no error"
    except Exception as e:
        default = type(e).__name__
    torch._dynamo.reset()
    old, log = dcfg.suppress_errors, logging.getLogger("torch._dynamo")
    level = log.level
    dcfg.suppress_errors = True
    log.setLevel(logging.CRITICAL)  # the fallback logs the whole traceback as a warning
    try:
        out = torch.compile(lambda x: x + 1, backend=broken)(torch.ones(2))
        fallback = out.tolist()
    finally:
        dcfg.suppress_errors = old
        log.setLevel(level)
        torch._dynamo.reset()
    ok = default == "BackendCompilerFailed" and fallback == [2.0, 2.0]
    return Finding(
        f"a failing backend raises {default} by default; with torch._dynamo.config.suppress_errors = True "
        f"it falls back to eager ({fallback})",
        ok,
        "False by default: compile errors raise. Eager fallback needs suppress_errors=True; only graph "
        "breaks (unsupported Python) run silently in eager.",
        verdict="F (default)",
    )


_LOGS = """
import torch
def f(x):
    if x.sum() > 0:
        return x * 2
    return x
torch.compile(f, backend="eager")(torch.ones(3))
"""


@LAB.check("S2-30")
def torch_logs_show_graph_breaks(ctx: Ctx) -> Finding:
    if ctx.quick:
        raise Skip("full mode only: a fresh Python process with torch costs ~10 s here")
    env = {**os.environ, "TORCH_LOGS": "graph_breaks"}
    p = subprocess.run([sys.executable, "-c", _LOGS], capture_output=True, text=True, timeout=180, env=env)
    line = next((ln for ln in p.stderr.splitlines() if "Graph break" in ln), "")
    return Finding(
        f"TORCH_LOGS=graph_breaks python ... -> rc {p.returncode}, logs: '{line.strip()[:100]}'",
        p.returncode == 0 and bool(line),
        "True (TORCH_COMPILE_DEBUG=1 still writes torch_compile_debug/), but TORCH_LOGS is the current "
        "interface: graph_breaks, recompiles, output_code (the generated kernels) and more.",
    )
