"""L06 zero_grad: set_to_none, what it frees and when; what forgetting zero_grad really does."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from vlastack.labs._core import Ctx, Finding, Lab, MiB, compare

LAB = Lab("zero_grad", "zero_grad(set_to_none): speed, memory held, peak; forgetting it")


def _step_peak(set_to_none: bool | None, width: int, batch: int) -> dict[str, float]:
    """MemTracker's peak (MiB by category) of one SGD iteration, after two warm-up iterations.
    ``set_to_none=None``: zero_grad is never called (forgotten)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(8)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width)

    def it() -> None:
        model(x).pow(2).mean().backward()
        opt.step()
        if set_to_none is not None:
            opt.zero_grad(set_to_none=set_to_none)

    it()
    it()
    mt = MemTracker()
    mt.track_external(model, opt)
    with mt:
        it()
    peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {str(getattr(k, "value", k)): v / MiB for k, v in peak.items()}


@LAB.check("S0-15")
def set_to_none_default_speed_and_memory(ctx: Ctx) -> Finding:
    default = inspect.signature(torch.optim.Optimizer.zero_grad).parameters["set_to_none"].default
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(100)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 256)).sum().backward()
    grads = [p.grad for p in model.parameters()]

    def zero_none() -> None:
        opt.zero_grad(set_to_none=True)
        for p, g in zip(model.parameters(), grads):  # put the grads back, as a backward would
            p.grad = g

    def zero_fill() -> None:
        opt.zero_grad(set_to_none=False)

    t = compare({"set_to_none=True": zero_none, "set_to_none=False": zero_fill}, reps=ctx.n(9, 5), inner=10)
    opt.zero_grad(set_to_none=False)
    held_false = sum(p.grad.numel() * 4 for p in model.parameters()) / MiB
    opt.zero_grad(set_to_none=True)
    held_true = sum(0 if p.grad is None else p.grad.numel() * 4 for p in model.parameters()) / MiB
    w = ctx.n(1024, 512)
    pk_t, pk_f = _step_peak(True, w, 256), _step_peak(False, w, 256)
    rows = [
        {
            "zero_grad": "set_to_none=True",
            "ms/call (100 Linear)": t["set_to_none=True"],
            "grads held MiB": held_true,
            "step peak MiB": pk_t["Total"],
            "of which grads": pk_t["Gradient"],
        },
        {
            "zero_grad": "set_to_none=False",
            "ms/call (100 Linear)": t["set_to_none=False"],
            "grads held MiB": held_false,
            "step peak MiB": pk_f["Total"],
            "of which grads": pk_f["Gradient"],
        },
    ]
    ok = default is True and held_true == 0 and held_false > 20 and pk_t["Total"] < pk_f["Total"]
    return Finding(
        f"default set_to_none={default}; zero_grad {t['set_to_none=True']:.3f} ms (None) vs "
        f"{t['set_to_none=False']:.3f} ms (fill 0); held after it {held_true} vs {held_false:.1f} MiB; "
        f"one step's peak (8x Linear({w}), b256) {pk_t['Total']:.1f} vs {pk_f['Total']:.1f} MiB",
        ok,
        "True with caveats: it is the default since torch 2.0; None skips a memset (the time includes "
        "re-attaching the grads here); the grads are freed only until the next backward allocates them "
        "again, so it lowers the forward-time peak, not the steady state.",
        rows=rows,
    )


@LAB.check("S0-31", "S2-11")
def forgetting_zero_grad(ctx: Ctx) -> Finding:
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    x = torch.randn(32, 64)
    ptrs, norms = set(), []
    for _ in range(4):
        model(x).pow(2).sum().backward()  # no zero_grad between steps
        ptrs.add(model.weight.grad.data_ptr())
        norms.append(model.weight.grad.norm().item())
    ratios = [n / norms[0] for n in norms]
    grows = len(ptrs) == 1 and all(abs(r - (i + 1)) < 1e-4 for i, r in enumerate(ratios))
    # The peak, not only the storages: with the default set_to_none=True the gradients are freed
    # after each step; forgotten, the last step's gradients live through the next forward.
    w = ctx.n(1024, 512)
    kept, forgot = _step_peak(True, w, 256), _step_peak(None, w, 256)
    grad_mib = 8 * (w * w + w) * 4 / MiB  # the 8 Linear layers' gradients, fp32
    rise = forgot["Total"] - kept["Total"]
    ok = grows and rise > 0.05 * grad_mib
    return Finding(
        f"4 backward calls without zero_grad: {len(ptrs)} grad storage(s); grad norm "
        + " -> ".join(f"{n:.1f}" for n in norms)
        + f"; step peak {kept['Total']:.1f} MiB with zero_grad(set_to_none=True), {forgot['Total']:.1f} MiB "
        f"without (+{rise:.1f} MiB; one set of gradients is {grad_mib:.1f} MiB)",
        ok,
        "Partly true as a memory cause: memory does not grow (gradients accumulate in place into one "
        "storage), but the steady peak rises: with the default set_to_none=True zero_grad frees the "
        "gradients before the next forward, and forgotten they live through it, next to its "
        "activations. The rise is less than a full set of gradients, because with zero_grad the new "
        "gradients already overlap the activations backward has not yet freed. The real damage is "
        "wrong gradients (k times too large after k steps).",
        verdict="C (no growth; a higher peak; gradients wrong)",
    )
