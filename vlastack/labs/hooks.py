"""L08 hooks: forward pre/post and full backward hooks, their order, and finding vanishing gradients."""

from __future__ import annotations

import torch
from torch import nn

from vlastack.labs._core import Ctx, Finding, Lab

LAB = Lab("hooks", "forward pre/post hooks and full backward hooks; locating a vanishing gradient")


@LAB.check("S2-18", "S0-17")
def hook_order(ctx: Ctx) -> Finding:
    m = nn.Linear(3, 3)
    order = []
    handles = [
        m.register_forward_pre_hook(lambda mod, inp: order.append("forward_pre_hook")),
        m.register_forward_hook(lambda mod, inp, out: order.append("forward_hook (post)")),
        m.register_full_backward_hook(lambda mod, gin, gout: order.append("full_backward_hook")),
    ]
    m(torch.randn(2, 3, requires_grad=True)).sum().backward()
    first = list(order)
    for h in handles:
        h.remove()
    order.clear()
    m(torch.randn(2, 3, requires_grad=True)).sum().backward()
    ok = first == ["forward_pre_hook", "forward_hook (post)", "full_backward_hook"] and order == []
    return Finding(
        f"call order: {' -> '.join(first)}; after handle.remove(): {len(order)} calls",
        ok,
        "Correction of the note's wording: the hook that runs after forward is a forward (post) hook, "
        "not a backward hook; backward hooks (register_full_backward_hook(hook), hook(module, "
        "grad_input, grad_output)) run during backward.",
    )


def _grad_norms(blocks: nn.ModuleList, residual: bool) -> list[float]:
    norms = [0.0] * len(blocks)
    handles = [
        b.register_full_backward_hook(lambda mod, gin, gout, i=i: norms.__setitem__(i, gout[0].norm().item()))
        for i, b in enumerate(blocks)
    ]
    h = torch.randn(32, 64, requires_grad=True)
    for b in blocks:
        h = h + b(h) if residual else b(h)
    h.pow(2).mean().backward()
    for hd in handles:
        hd.remove()
    return norms


@LAB.check("S0-17")
def backward_hooks_locate_vanishing(ctx: Ctx) -> Finding:
    torch.manual_seed(0)
    sig = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.Sigmoid()) for _ in range(12))
    res = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(12))
    ns, nr = _grad_norms(sig, False), _grad_norms(res, True)
    rows = [
        {"block": i, "sigmoid stack |grad_out|": ns[i], "ReLU + residual |grad_out|": nr[i]}
        for i in (0, 3, 6, 9, 11)
    ]
    ok = ns[0] / ns[-1] < 1e-3 and nr[0] / nr[-1] > 0.1
    return Finding(
        f"grad-output norm block 0 / block 11: sigmoid stack {ns[0] / ns[-1]:.1e}, ReLU + residual {nr[0] / nr[-1]:.2f}",
        ok,
        "True: a full backward hook per block shows where the gradient vanishes: the sigmoid stack "
        "loses about an order of magnitude per block (sigmoid' <= 1/4); residual connections keep it.",
        rows=rows,
    )
