"""L03 autograd_basics: the graph autograd records, accumulation, leaves, detach, None grads, anomalies."""

from __future__ import annotations

import torch

from vlastack.labs._core import Ctx, Finding, Lab, compare

LAB = Lab("autograd_basics", "grad_fn graphs, accumulation, leaves, detach, retain_graph, anomaly mode")


def graph_text(fn, depth: int = 0, seen: set | None = None) -> list[str]:
    """Indented text of the autograd graph under ``fn`` (a ``grad_fn``), shared nodes printed once."""
    seen = set() if seen is None else seen
    if fn is None:
        return []
    name = type(fn).__name__
    if fn in seen:
        return ["  " * depth + f"{name} (shared, see above)"]
    seen.add(fn)
    out = ["  " * depth + name]
    for child, _ in fn.next_functions:
        out += graph_text(child, depth + 1, seen)
    return out


def _chain(fn) -> list[str]:
    return [ln.strip() for ln in graph_text(fn)]


@LAB.check("S0-10", "S0-11", "S2-10")
def graph_is_built_while_running(ctx: Ctx) -> Finding:
    w, x, b = (torch.tensor(v, requires_grad=True) for v in (2.0, 0.5, 1.0))
    f = w * x + b
    text = graph_text(f.grad_fn)

    def branchy(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum() if x.sum() > 0 else (x.exp() - 1).pow(2).sum()

    pos = _chain(branchy(torch.ones(3, requires_grad=True)).grad_fn)
    neg = _chain(branchy(-torch.ones(3, requires_grad=True)).grad_fn)
    ok = (
        text[0] == "AddBackward0"
        and [t.strip() for t in text[1:]]
        == ["MulBackward0", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad"]
        and w.grad_fn is None
        and w.is_leaf
        and pos != neg
    )
    return Finding(
        f"f = w*x + b: {' > '.join(t.strip() for t in text)}; leaf w.grad_fn = {w.grad_fn}; "
        f"branchy(+1): {' > '.join(pos)}; branchy(-1): {' > '.join(neg)}",
        ok,
        "True: grad_fn records the op that made each tensor (leaves have None and an AccumulateGrad "
        "node); a Python `if` on data gives a different graph per input, because the graph is "
        "recorded as the code runs.",
        rows=[{"graph of f = w*x + b": ln} for ln in text],
    )


@LAB.check("S1-01")
def seed_chain_rule(ctx: Ctx) -> Finding:
    a = torch.tensor(2.0, requires_grad=True)
    b = torch.tensor(3.0, requires_grad=True)
    c = a * b + b
    c.backward()
    ok = a.grad.item() == b.item() and b.grad.item() == a.item() + 1
    return Finding(
        f"a=2, b=3: a.grad = {a.grad.item()} (b = 3), b.grad = {b.grad.item()} (a + 1 = 3)",
        ok,
        "True: b is used twice, so its two contributions (a and 1) add up in b.grad.",
    )


@LAB.check("S2-11")
def backward_accumulates(ctx: Ctx) -> Finding:
    x = torch.tensor([1.0], requires_grad=True)
    w = torch.tensor([2.0], requires_grad=True)
    (x * w).backward()
    first = (x.grad.item(), w.grad.item())
    (x * w).backward()
    second = (x.grad.item(), w.grad.item())
    return Finding(
        f"after 1st backward x.grad, w.grad = {first}; after 2nd = {second}",
        first == (2.0, 1.0) and second == (4.0, 2.0),
        "True, as printed in the note: .grad accumulates across backward calls until it is zeroed.",
    )


@LAB.check("S3-12")
def only_leaves_keep_grad(ctx: Ctx) -> Finding:
    x = torch.tensor(3.0, requires_grad=True)
    h = x * x
    y = h + 1
    y.backward()
    h2 = x * x
    h2.retain_grad()
    (h2 + 1).backward()
    ok = h.grad is None and x.grad.item() == 12.0 and h2.grad.item() == 1.0
    return Finding(
        f"non-leaf h.grad = {h.grad}; leaf x.grad = {x.grad.item()} (two backwards of 2x = 6); "
        f"with h.retain_grad(): h.grad = {h2.grad.item()}",
        ok,
        "True: backward walks the graph in reverse topological order and accumulates into leaves only; "
        "a non-leaf's .grad stays None unless retain_grad() is called.",
    )


@LAB.check("S0-13", "S2-13")
def detach_is_an_alias(ctx: Ctx) -> Finding:
    x = torch.ones(3, requires_grad=True)
    y = x * 2
    z = y.detach()
    z[0] = 100.0  # in-place write through the alias
    ok = not z.requires_grad and z.is_leaf and z.grad_fn is None and y[0].item() == 100.0
    return Finding(
        f"z = y.detach(): requires_grad {z.requires_grad}, is_leaf {z.is_leaf}, grad_fn {z.grad_fn}; "
        f"same storage {z.data_ptr() == y.data_ptr()}; after z[0] = 100, y[0] = {y[0].item()}",
        ok,
        "True, with a caveat: detach() shares the storage, so in-place edits of the detached tensor "
        "change the original too (use detach().clone() for an independent copy).",
    )


@LAB.check("S1-14")
def unused_param_grad_is_none(ctx: Ctx) -> Finding:
    used = torch.nn.Parameter(torch.ones(2))
    unused = torch.nn.Parameter(torch.ones(2))
    loss = (used * 3).sum()
    loss.backward(retain_graph=True)
    none_with_retain = unused.grad is None
    loss.backward()  # allowed because the graph was retained
    try:
        loss.backward()
        second = "no error"
    except RuntimeError as e:
        second = str(e).split(".")[0]
    ok = none_with_retain and unused.grad is None and "second time" in second
    return Finding(
        f"unused parameter grad after backward(retain_graph=True): {unused.grad}; a third backward "
        f"without a retained graph: '{second}'",
        ok,
        "False remedy: an unused parameter's grad is None (true), but retain_graph does not change "
        "that; it only allows another backward through the same graph. Fix the graph (or use "
        "DDP's find_unused_parameters / set the grad to zeros).",
    )


@LAB.check("S1-16")
def anomaly_mode_names_the_op(ctx: Ctx) -> Finding:
    x = torch.tensor([-1.0, 4.0], requires_grad=True)
    err = ""
    with torch.autograd.detect_anomaly(check_nan=True):
        try:
            torch.sqrt(x).sum().backward()  # sqrt(-1) = nan, its backward returns nan
        except RuntimeError as e:
            err = str(e)
    w = torch.randn(64, 64, requires_grad=True)
    xs = torch.randn(32, 64)

    def step() -> None:
        torch.tanh(xs @ w).pow(2).sum().backward()

    def step_anomaly() -> None:
        with torch.autograd.detect_anomaly(check_nan=True):
            step()

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled" on every entry
        t = compare({"plain": step, "anomaly": step_anomaly}, reps=ctx.n(7, 5), inner=20)
    slow = t["anomaly"] / t["plain"]
    return Finding(
        f"error: '{err.splitlines()[0] if err else 'none'}'; overhead on a tiny step {slow:.1f}x "
        f"({t['plain'] * 1e3:.0f} vs {t['anomaly'] * 1e3:.0f} us)",
        "SqrtBackward0" in err,
        "True: anomaly mode names the backward op that produced NaN and prints the forward traceback "
        "that created it; it is slow (records stacks for every op), so enable it only to debug.",
        data={"overhead_x": slow},
    )
