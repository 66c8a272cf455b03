"""L15 export: tracing vs scripting vs torch.export on data-dependent control flow."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import torch
from torch import nn

from vlastack.labs._core import Ctx, Finding, Lab

LAB = Lab("export", "torch.jit.trace vs torch.jit.script vs torch.export (+ torch.cond) on an if/else")


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x * 10 - 1


class CondBranchy(nn.Module):
    """The same function with the branch as data: torch.cond, which export keeps."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x * 10 - 1, (x,))


@LAB.check("S0-25", "S0-26")
def trace_script_export(ctx: Ctx) -> Finding:
    pos, neg = torch.ones(1), -torch.ones(1)
    m = Branchy()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        traced = torch.jit.trace(m, pos)
        scripted = torch.jit.script(m)
    kinds = sorted({x.category.__name__ for x in w})
    exported = torch.export.export(CondBranchy(), (pos,))
    log = logging.getLogger("torch")
    level = log.level
    log.setLevel(logging.CRITICAL)  # the failing export logs its whole graph
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            torch.export.export(Branchy(), (pos,))
        plain_export = "no error"
    except Exception as e:
        plain_export = type(e).__name__
    finally:
        log.setLevel(level)
    rows = [
        {"method": "eager", "f(+1)": m(pos).item(), "f(-1)": m(neg).item()},
        {
            "method": "torch.jit.trace (traced with +1)",
            "f(+1)": traced(pos).item(),
            "f(-1)": traced(neg).item(),
        },
        {"method": "torch.jit.script", "f(+1)": scripted(pos).item(), "f(-1)": scripted(neg).item()},
        {
            "method": "torch.export + torch.cond",
            "f(+1)": exported.module()(pos).item(),
            "f(-1)": exported.module()(neg).item(),
        },
    ]
    has_if = "prim::If" in str(scripted.graph)
    ok = (
        traced(neg).item() == -2.0
        and scripted(neg).item() == -11.0
        and exported.module()(neg).item() == -11.0
        and has_if
        and "TracerWarning" in kinds
        and plain_export != "no error"
    )
    return Finding(
        f"f(-1): eager -11, traced {traced(neg).item():g} (branch baked in), scripted "
        f"{scripted(neg).item():g} (graph has prim::If: {has_if}), export+cond "
        f"{exported.module()(neg).item():g}; warnings {kinds}; export of the plain `if` raises {plain_export}",
        ok,
        "True: tracing records the branch taken (with a TracerWarning); scripting keeps control flow. "
        "On torch 2.x both TorchScript paths are deprecated in favour of torch.export, where a "
        "data-dependent branch must be written as torch.cond.",
        rows=rows,
    )


@LAB.check("S0-27")
def scripted_module_round_trip(ctx: Ctx) -> Finding:
    m = torch.jit.script(Branchy())
    buf = io.BytesIO()
    torch.jit.save(m, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    same = all(loaded(x).item() == m(x).item() for x in (torch.ones(1), -torch.ones(1)))
    return Finding(
        f"torch.jit.save -> torch.jit.load round trip: same outputs {same}, {buf.getbuffer().nbytes} bytes; "
        "the C++ side (torch::jit::load, AOTInductor .pt2) is run by "
        "tests/infer/test_infer_export.py::test_cpp_example_matches_python (examples/cpp/main.cpp)",
        same,
        "True: a TorchScript archive is self-contained and loads in C++ (libtorch) without Python; "
        "vlastack's C++ example loads both TorchScript and pt2 artifacts and matches Python.",
    )
