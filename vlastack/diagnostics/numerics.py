"""Numerics: per-module activation/gradient statistics, the first module that produces a NaN/inf,
bf16-vs-fp32 drift per layer, and the training anomaly guard (``train.anomaly_guard=true``).

    insp = NumericsInspector(model)
    with insp:
        model(batch)["loss"].backward()
    insp.report()  # {"modules": [...], "first_nonfinite": {...} | None}

Forward hooks record the statistics of every module's floating-point outputs (mean, std, max
|x|, fraction non-finite, computed in fp32) and of its inputs when an output is the first
non-finite one; a tensor hook on each output records the gradient flowing into it in backward.
Hooks fire in completion order (a child before its parent), so the first module seen with a
non-finite output whose inputs were all finite is where the NaN/inf was born.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_leaves

STAT_KEYS = ("mean", "std", "max_abs", "nonfinite")


# ----------------------------------------------------------------------------- the trainer's checks


def is_finite(x: Tensor | float) -> bool:
    """True if a scalar tensor or float is neither NaN nor inf (one host sync for a tensor)."""
    if isinstance(x, Tensor):
        return bool(torch.isfinite(x).all())
    return x == x and abs(x) != float("inf")


def nonfinite_grads(params: Iterable[nn.Parameter] | nn.Module, names: bool = True) -> list[str]:
    """Names (or indices) of parameters whose gradient holds a NaN or inf (for error messages)."""
    items = params.named_parameters() if isinstance(params, nn.Module) else enumerate(params)
    bad = []
    for n, p in items:
        g = p.grad
        if g is not None and not bool(torch.isfinite(g).all()):
            bad.append(str(n))
    return bad


# ----------------------------------------------------------------------------- statistics


def tensor_stats(x: Tensor) -> dict[str, float]:
    """mean, std, max |x| over the finite values and the fraction of non-finite values (fp32)."""
    x = x.detach().float()
    fin = torch.isfinite(x)
    n = x.numel()
    xf = torch.where(fin, x, 0.0)
    nfin = fin.sum().clamp(min=1)
    mean = xf.sum() / nfin
    var = (torch.where(fin, x - mean, 0.0) ** 2).sum() / nfin
    vals = torch.stack(
        [mean, var.sqrt(), xf.abs().max() if n else xf.new_zeros(()), 1 - fin.sum() / max(n, 1)]
    )
    return dict(zip(STAT_KEYS, vals.tolist()))


def _floats(obj) -> list[Tensor]:
    return [t for t in tree_leaves(obj) if isinstance(t, Tensor) and t.is_floating_point()]


def _merge(stats: list[dict]) -> dict[str, float]:
    """Several outputs of one module: worst max_abs and non-finite fraction, mean of the rest."""
    if len(stats) == 1:
        return stats[0]
    return {
        "mean": sum(s["mean"] for s in stats) / len(stats),
        "std": sum(s["std"] for s in stats) / len(stats),
        "max_abs": max(s["max_abs"] for s in stats),
        "nonfinite": max(s["nonfinite"] for s in stats),
    }


class NumericsInspector:
    """Forward/backward statistics per module of ``model`` while the context is open.

    ``depth``: only modules whose dotted name has at most this many parts (None: all).
    """

    def __init__(self, model: nn.Module, depth: int | None = None) -> None:
        self.model = model
        self.names = {
            m: (n or "<root>")
            for n, m in model.named_modules()
            if depth is None or (n.count(".") + 1 if n else 0) <= depth
        }
        self.forward: dict[str, dict] = {}
        self.backward: dict[str, dict] = {}
        self.order: list[str] = []
        self.first_nonfinite: dict | None = None
        self.first_output_nonfinite: str | None = None
        self.first_nonfinite_grad: str | None = None  # in backward order (the order grads arrive)
        self._handles: list = []

    def _hook(self, mod: nn.Module, args, kwargs, out) -> None:
        name = self.names[mod]
        outs = _floats(out)
        if not outs:
            return
        st = _merge([tensor_stats(t) for t in outs])
        if name not in self.forward:
            self.order.append(name)
        self.forward[name] = st
        if st["nonfinite"] > 0:
            if self.first_output_nonfinite is None:
                self.first_output_nonfinite = name
            ins = [tensor_stats(t) for t in _floats((args, kwargs))]
            if self.first_nonfinite is None and all(s["nonfinite"] == 0 for s in ins):
                params = [{"name": n, **tensor_stats(p)} for n, p in mod.named_parameters(recurse=False)]
                self.first_nonfinite = {
                    "module": name,
                    "type": type(mod).__name__,
                    "output": st,
                    "inputs": ins,
                    "parameters": params,
                }
        for t in outs:
            if t.requires_grad:
                t.register_hook(lambda g, name=name: self._grad(name, g))

    def _grad(self, name: str, g: Tensor) -> None:
        st = tensor_stats(g)
        if st["nonfinite"] > 0 and self.first_nonfinite_grad is None:
            self.first_nonfinite_grad = name
        prev = self.backward.get(name)
        self.backward[name] = st if prev is None else _merge([prev, st])

    def __enter__(self) -> NumericsInspector:
        for m in self.names:
            self._handles.append(m.register_forward_hook(self._hook, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def report(self, top: int = 15) -> dict:
        """Per-module stats in execution order, the first non-finite module, and the largest |x|."""
        rows = [{"module": n, "forward": self.forward[n], "grad": self.backward.get(n)} for n in self.order]
        return {
            "modules": rows,
            "first_nonfinite": self.first_nonfinite,
            "first_output_nonfinite": self.first_output_nonfinite,
            "first_nonfinite_grad": self.first_nonfinite_grad,
            "modules_nonfinite_grad": sum(1 for v in self.backward.values() if v["nonfinite"] > 0),
            "modules_with_grad": len(self.backward),
            "largest_activations": sorted(rows, key=lambda r: -r["forward"]["max_abs"])[:top],
        }


# ----------------------------------------------------------------------------- training health


def suggested_lr(lr: float) -> float:
    """A learning rate to try after ``lr`` diverged: a tenth of it, at most 1e-3 (the from-scratch
    recipes' rate), since a rate orders of magnitude off is not fixed by a factor of ten."""
    return min(lr / 10, 1e-3)


def training_health(steps: list[dict], model: nn.Module, optimizer: torch.optim.Optimizer, train_cfg) -> dict:
    """Whether a run is diverging, from its steps' loss and gradient norm (``steps``: dicts with
    ``step``, ``loss``, ``grad_norm``, ``ok`` in order) and the state they left: the first step
    whose loss or gradients turned non-finite, how many parameters and optimizer-state tensors are
    non-finite now, and what to change. Activations can stay finite while the gradients overflow
    (a learning rate far too high blows the weights up once; every later step's gradients are
    inf and skipped), so checking activations alone misses it."""

    def finite(x: float) -> bool:
        return x == x and abs(x) != float("inf")

    bad = [s for s in steps if not (finite(s["loss"]) and finite(s["grad_norm"])) or not s["ok"]]
    params = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]
    state = sum(
        1
        for st in optimizer.state.values()
        for v in st.values()
        if isinstance(v, Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())
    )
    norms = [s["grad_norm"] for s in steps if finite(s["grad_norm"])]
    out = {
        "steps": len(steps),
        "nonfinite_steps": len(bad),
        "first_nonfinite_step": bad[0] if bad else None,
        "grad_norm_first": norms[0] if norms else None,
        "grad_norm_last_finite": norms[-1] if norms else None,
        "nonfinite_parameters": params[:10],
        "nonfinite_parameter_count": len(params),
        "nonfinite_optimizer_state_tensors": state,
        "diverging": bool(bad or params or state),
        "advice": "",
    }
    if out["diverging"]:
        t = train_cfg
        out["advice"] = (
            f"train.lr={t.lr:g} (warm-up {t.warmup_steps} steps, grad_clip {t.grad_clip:g}, {t.precision}): "
            f"lower train.lr (try {suggested_lr(t.lr):g}), lengthen train.warmup_steps"
            + ("" if t.grad_clip > 0 else ", turn clipping on (train.grad_clip=1.0)")
            + (", or train in bf16/fp32 instead of fp16" if t.precision == "fp16" else "")
        )
    return out


# ----------------------------------------------------------------------------- drift


def precision_drift(
    model: nn.Module, batch: dict, layers: list[str] | None = None, seed: int = 0
) -> list[dict]:
    """Relative error ``||y_bf16 - y_fp32|| / ||y_fp32||`` of each layer's output, forward only.

    Both passes see the same batch and the same random draws (flow noise and time); the bf16 pass
    runs under ``torch.autocast(bfloat16)`` as training with ``train.precision=bf16`` does.
    ``layers``: module names (default: every decoder/vision block, the projector and the head's
    output projection).
    """
    mods = dict(model.named_modules())
    if layers is None:
        layers = [n for n in mods if _is_block(n)] + [
            n for n in ("projector", "head.action_out_proj") if n in mods
        ]
    outs: dict[str, list[Tensor]] = {}

    def grab(key):
        def hook(mod, args, out):
            t = _floats(out)
            if t:
                outs.setdefault(key, []).append(t[0].detach().float().clone())

        return hook

    dev = next(model.parameters()).device
    handles = [mods[n].register_forward_hook(grab(n)) for n in layers]
    try:
        losses = []
        for dtype in (None, torch.bfloat16):
            torch.manual_seed(seed)
            ctx = torch.autocast(dev.type, dtype=dtype) if dtype else torch.autocast(dev.type, enabled=False)
            with torch.no_grad(), ctx:
                losses.append(model(batch)["loss"].float())
    finally:
        for h in handles:
            h.remove()
    rows = []
    for n in [*layers, "loss"]:
        pair = [losses[0], losses[1]] if n == "loss" else outs.get(n, [])
        if len(pair) != 2:
            continue
        ref, low = pair
        rel = ((low - ref).norm() / ref.norm().clamp(min=1e-12)).item()
        rows.append({"module": n, "rel_error": rel, "max_abs_diff": (low - ref).abs().max().item()})
    return rows


def _is_block(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 3 and parts[1] == "layers" and parts[2].isdigit()


def inspect(model: nn.Module, batch: dict, drift: bool = True, precision: str = "fp32") -> dict:
    """One forward + backward under ``NumericsInspector`` (gradients cleared afterwards), plus drift."""
    from vlastack.train.step import autocast_ctx

    dev = next(model.parameters()).device
    was_training = model.training
    model.train()
    insp = NumericsInspector(model)
    with insp, autocast_ctx(dev.type, precision):
        loss = model(batch)["loss"]
    if loss.requires_grad:
        loss.float().backward()
    model.zero_grad(set_to_none=True)
    out = insp.report()
    out["loss"] = float(loss.detach())
    out["drift"] = precision_drift(model, batch) if drift else []
    model.train(was_training)
    return out


# ----------------------------------------------------------------------------- anomaly guard


class AnomalyDetected(RuntimeError):
    """A training step produced a non-finite loss or gradient with ``train.anomaly_guard`` on."""

    def __init__(self, message: str, info: dict) -> None:
        super().__init__(message)
        self.info = info


def anomaly_stop(trainer, micro_batches: list[dict], result) -> None:
    """Called by the trainer on a bad step when ``train.anomaly_guard`` is on: re-run each
    micro-batch under ``NumericsInspector`` (the update was skipped, so the weights are those of
    the last good step), write ``anomaly/report.json`` and the batch (safetensors), and raise
    ``AnomalyDetected`` naming the step, the module and the batch. No checkpoint is written for the
    bad step: the run folder keeps the last good one."""
    from safetensors.torch import save_file

    from vlastack.train.checkpoint import latest_checkpoint
    from vlastack.train.step import autocast_ctx

    t = trainer.cfg.train
    folder = Path(trainer.run_dir) / "anomaly"
    folder.mkdir(parents=True, exist_ok=True)
    found, idx = None, None
    for i, mb in enumerate(micro_batches):
        insp = NumericsInspector(trainer.model)
        with insp, autocast_ctx(trainer.device.type, t.precision):
            loss = trainer.model(mb)["loss"]
        if loss.requires_grad and insp.first_nonfinite is None:
            loss.float().backward()  # the gradient hooks were put on the outputs in forward
        trainer.model.zero_grad(set_to_none=True)
        rep = insp.report()
        bad_grad = next(
            (r["module"] for r in rep["modules"] if r["grad"] and r["grad"]["nonfinite"] > 0), None
        )
        if rep["first_nonfinite"] or bad_grad or not is_finite(loss.detach()):
            found, idx = rep, i
            found["first_nonfinite_grad"] = bad_grad
            break
    first_pos = trainer.position - len(micro_batches)
    first = (found or {}).get("first_nonfinite")
    info = {
        "step": trainer.step + 1,  # 1-based, as the trainer logs it (not incremented yet)
        "loss": result.loss,
        "grad_norm": result.grad_norm,
        "batch_position": first_pos + (idx or 0),  # the sampler's batch counter (resumable order)
        "module": first["module"] if first else None,
        "first_nonfinite": first,
        "first_nonfinite_grad": (found or {}).get("first_nonfinite_grad"),
        "reproduced": found is not None,
        "last_good_checkpoint": str(latest_checkpoint(trainer.run_dir) or ""),
    }
    bad = micro_batches[idx or 0]
    save_file({k: v.detach().cpu().contiguous() for k, v in bad.items()}, str(folder / "batch.safetensors"))
    (folder / "report.json").write_text(json.dumps(info, indent=2, default=str))
    where = info["module"] or info["first_nonfinite_grad"] or "not reproduced on re-run (transient?)"
    raise AnomalyDetected(
        f"anomaly guard: step {info['step']} had a non-finite loss/gradient (loss {result.loss}); first "
        f"non-finite module: {where}; batch #{info['batch_position']} saved to {folder / 'batch.safetensors'}; "
        f"last good checkpoint: {info['last_good_checkpoint'] or 'none yet'}",
        info,
    )
