"""L05 grad_modes: what no_grad / inference_mode / requires_grad_(False) save, cost and forbid."""

from __future__ import annotations

import torch
from torch import nn

from vlastack.labs._core import Ctx, Finding, Lab, MiB, SavedTensors, compare, graph_nodes

LAB = Lab("grad_modes", "no_grad, inference_mode, frozen parameters: saved activations and per-op cost")


def _mlp(width: int = 512, hidden: int = 2048) -> nn.Module:
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))


@LAB.check("S0-12", "S0-32", "S2-13")
def saved_activations_per_mode(ctx: Ctx) -> Finding:
    model = _mlp()
    x = torch.randn(64, 512)
    out = {}
    for mode, cm in (
        ("grad", torch.enable_grad),
        ("no_grad", torch.no_grad),
        ("inference_mode", torch.inference_mode),
    ):
        with cm(), SavedTensors(exclude=model.parameters()) as meter:
            y = model(x)
        out[mode] = (meter.alive_bytes() / MiB, y.requires_grad)
        del y
    model.requires_grad_(False)  # frozen: nothing requires grad, so nothing is recorded
    with SavedTensors() as meter:
        y = model(x)
    out["frozen (requires_grad_(False))"] = (meter.alive_bytes() / MiB, y.requires_grad)
    rows = [{"mode": k, "saved MiB": v[0], "output requires_grad": v[1]} for k, v in out.items()]
    ok = out["grad"][0] > 1 and all(v[0] == 0 and not v[1] for k, v in out.items() if k != "grad")
    return Finding(
        f"MLP 512-2048-512, batch 64: saved for backward {out['grad'][0]:.2f} MiB with grad, "
        f"{out['no_grad'][0]} under no_grad / inference_mode / frozen",
        ok,
        "True: without grad mode no graph is recorded and no activation is kept (the forward's "
        "temporaries are freed as it goes). Parameters are excluded from the count.",
        rows=rows,
    )


@LAB.check("S4-23")
def inference_mode_speed(ctx: Ctx) -> Finding:
    small = torch.randn(16)
    model = _mlp(256, 1024)
    xb = torch.randn(8, 256)

    def pointwise() -> None:
        y = small
        for _ in range(20):
            y = y * 1.01 + 0.1

    def views() -> None:
        for _ in range(20):
            small.view(4, 4).t().unsqueeze(0)

    def mlp() -> None:
        model(xb)

    def run(cm, fn):
        def go() -> None:
            with cm():
                fn()

        return go

    rows, ratios = [], {}
    for name, fn, per in (
        ("pointwise x40", pointwise, 40),
        ("view ops x60", views, 60),
        ("MLP 256-1024-256 b8", mlp, 1),
    ):
        t = compare(
            {
                "grad": run(torch.enable_grad, fn),
                "no_grad": run(torch.no_grad, fn),
                "inference": run(torch.inference_mode, fn),
            },
            reps=ctx.n(21, 9),
            inner=ctx.n(50, 20),
        )
        ratios[name] = t["inference"] / t["no_grad"]
        rows.append(
            {
                "work": name,
                **{f"{k} us/op": v * 1e3 / per for k, v in t.items()},
                "inference/no_grad": ratios[name],
            }
        )
    worst = max(ratios.values())
    return Finding(
        "inference_mode / no_grad time: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()),
        None if ctx.quick else worst <= 1.1,
        "Partly true: inference_mode skips version counters and view tracking, which shows on tiny "
        "ops; on real work (the MLP) the gain is within noise. Asserted only in full mode, and only "
        "that it is not slower by more than 10%.",
        data=ratios,
        rows=rows,
    )


@LAB.check("S4-23")
def inference_tensor_restrictions(ctx: Ctx) -> Finding:
    with torch.inference_mode():
        t = torch.ones(3)
    w = torch.ones(3, requires_grad=True)
    errors = {}
    try:
        (w * t).sum().backward()  # mul saves t for backward
        errors["save for backward"] = "no error"
    except RuntimeError as e:
        errors["save for backward"] = str(e).split(".")[0]
    try:
        t.add_(1)
        errors["in-place update outside the mode"] = "no error"
    except RuntimeError as e:
        errors["in-place update outside the mode"] = str(e).split(".")[0]
    ok = t.is_inference() and all(v != "no error" for v in errors.values())
    return Finding(
        "; ".join(f"{k}: '{v}'" for k, v in errors.items()),
        ok,
        "The price of inference_mode: tensors made inside it are inference tensors; they cannot be "
        "saved for backward or updated in place outside the mode (clone() them first). no_grad has "
        "no such restriction.",
    )


@LAB.check("S1-15")
def accumulating_the_loss_keeps_graphs(ctx: Ctx) -> Finding:
    model = _mlp(64, 256)
    iters = 50
    res = {}
    for how in ("total += loss", "total += loss.item()"):
        with SavedTensors(exclude=model.parameters()) as meter:
            total = 0.0
            for _ in range(iters):
                loss = model(torch.randn(32, 64)).pow(2).mean()
                total = total + (loss if how == "total += loss" else loss.item())
            del loss
        nodes = graph_nodes(total) if isinstance(total, torch.Tensor) else 0
        res[how] = (nodes, meter.alive_bytes() / MiB)
        del total
    rows = [{"loop": k, "graph nodes alive": v[0], "saved MiB alive": v[1]} for k, v in res.items()]
    ok = res["total += loss"][0] > 5 * iters and res["total += loss.item()"] == (0, 0.0)
    return Finding(
        f"after {iters} iterations: `total += loss` keeps {res['total += loss'][0]} graph nodes and "
        f"{res['total += loss'][1]:.2f} MiB of activations alive; `.item()` keeps none",
        ok,
        "True: summing loss tensors chains every iteration's graph (and its saved activations) onto "
        "`total`; log loss.item() or loss.detach() instead.",
        rows=rows,
    )
