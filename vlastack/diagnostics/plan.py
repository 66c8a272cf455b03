"""``vla plan``: predict peak training and inference memory of a config without allocating it.

The prediction runs the project's real training step (``vlastack.train.step.train_step``: autocast,
backward, clipping, AdamW) on the real model, LoRA and activation checkpointing included, under
``FakeTensorMode``: tensors carry shapes and dtypes but no data, and ``LiveTensorTracker`` follows
which storages are alive at every op, exactly as it does on a real run. Two steps run, because the
optimizer state appears in the first and coexists with the activations from the second on.

Two knobs are not simulated but derived from the simulated breakdown (and say so in their rows):

- ``train.optimizer=adamw8bit``: the two fp32 moments (8 bytes per trainable parameter) become
  8-bit with one fp32 absmax per 256 values (bitsandbytes' blockwise layout): ~2.03 bytes.
- FSDP over ``W`` ranks: parameters, gradients and optimizer state are divided by ``W``; two
  blocks' full parameters (the one computing and the one prefetched) are added back, in the
  compute dtype. Activations are per rank and unchanged.

"Peak" means the largest number of bytes held by tensor storages at one moment of the run; on CPU
this equals torch's CPU allocator peak (``bench/plan.py`` measures both), on CUDA it is
``max_memory_allocated`` (the caching allocator reserves more: plan with ~10% headroom).
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vlastack.batch import dummy_batch
from vlastack.config import Config, apply_overrides
from vlastack.diagnostics.memory import (
    CATEGORIES,
    LiveTensorTracker,
    cpu_allocator_peak,
    fmt_bytes,
    training_roles,
)

TARGETS = ("cpu", "cuda")
BYTES_8BIT_STATE = 2 + 8 / 256  # two uint8 moments + one fp32 absmax per 256-value block each


# ----------------------------------------------------------------------------- one run (fake or real)


def _build(cfg: Config, fused: bool = False, wrap=None):
    """The model as the trainer builds it (LoRA, activation checkpointing), and its optimizer
    (``fused``: the fused AdamW a GPU runs, else the CPU's foreach). ``wrap(model)``: called before
    the optimizer is built, as the trainer applies DDP or FSDP2 (the caller keeps the wrapper)."""
    from vlastack.models.vla import build_model
    from vlastack.nn.lora import apply_lora
    from vlastack.train.optim import build_optimizer, freeze_parts
    from vlastack.train.parallel import apply_activation_checkpointing

    t = cfg.train
    torch.manual_seed(t.seed)
    model = build_model(cfg.model)
    freeze_parts(model, t)
    if t.lora_rank > 0:
        apply_lora(
            model, t.lora_targets, t.lora_rank, t.lora_alpha, t.lora_dropout, model.unreachable_linears
        )
        freeze_parts(model, t)  # as the trainer: a frozen part's adapters stay frozen
    if t.activation_checkpointing:
        apply_activation_checkpointing(model)
    if wrap is not None:
        wrap(model)
    adamw = replace(t, optimizer="adamw")  # 8-bit is derived, see the module docstring
    return model, build_optimizer(model, adamw, fused=fused)


def _prepare_head(model, cfg: Config, batch_size: int) -> None:
    """The head's own ``prepare`` on dummy samples (a token head fits its action tokenizer)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # prepared on real (dummy) samples
        model.head.prepare(_DummySamples(cfg, max(2, batch_size)))


class _DummySamples(torch.utils.data.Dataset):
    """``n`` dummy training samples, made on first access (a head that prepares nothing allocates
    nothing)."""

    def __init__(self, cfg: Config, n: int) -> None:
        self.cfg, self.n, self.batch = cfg, n, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if self.batch is None:
            self.batch = dummy_batch(self.cfg.model, self.n, seed=1)
        return {k: v[i] for k, v in self.batch.items()}


def _run_train(
    cfg: Config, batch_size: int, steps: int, fake: bool, target: str = "cpu"
) -> LiveTensorTracker:
    from vlastack.train.step import train_step

    # A GPU step runs fused AdamW. On real tensors it runs here as it would there; under fake
    # tensors it cannot (see LiveTensorTracker), so the foreach step runs and the tracker counts
    # only what outlives it, which is what the fused kernel allocates.
    cuda = target == "cuda"
    model, opt = _build(cfg, fused=cuda and not fake)
    _prepare_head(model, cfg, batch_size)
    batch = dummy_batch(cfg.model, batch_size)
    roles = training_roles(model, opt, batch.values())
    tr = LiveTensorTracker(roles, fake_scalars=fake, fused_optimizer=cuda and fake)
    tr.track([*model.parameters(), *model.buffers(), *batch.values()])
    model.train()
    with tr, tr.watch(model, opt):
        for _ in range(steps):
            train_step(model, opt, [batch], precision=cfg.train.precision, grad_clip=cfg.train.grad_clip)
    tr.finish()
    return tr


def _run_infer(cfg: Config, batch_size: int, fake: bool) -> LiveTensorTracker:
    from vlastack.models.vla import build_model
    from vlastack.train.step import autocast_ctx

    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    _prepare_head(model, cfg, batch_size)
    batch = dummy_batch(cfg.model, batch_size, train=False)
    tr = LiveTensorTracker(training_roles(model, None, batch.values()), fake_scalars=fake)
    tr.track([*model.parameters(), *model.buffers(), *batch.values()])
    tr.phase = "inference"
    with tr, tr.watch(model), torch.inference_mode(), autocast_ctx("cpu", cfg.train.precision):
        model.sample_actions(batch)
    tr.finish()
    return tr


def simulate(cfg: Config, batch_size: int, mode: str = "train", steps: int = 2, target: str = "cpu") -> dict:
    """Predicted peak (bytes) and its breakdown for ``mode`` = train | infer, without allocating,
    for a run on ``target`` (cpu | cuda: which optimizer kernels the step uses)."""
    if target not in TARGETS:
        raise ValueError(f"target {target!r}: choose one of {TARGETS}")
    if cfg.model.head_spec.action_tokens and cfg.model.head_options.tokenizer != "bins":
        raise ValueError(
            f"vla plan cannot simulate the {cfg.model.head_options.tokenizer!r} action tokenizer (it encodes real "
            "data); plan with model.head_options.tokenizer=bins and the same max_action_tokens instead"
        )
    # allow_non_fake_inputs: a fitted token head keeps small real lookup tables as plain attributes
    with FakeTensorMode(allow_non_fake_inputs=True):
        tr = (
            _run_train(cfg, batch_size, steps, True, target)
            if mode == "train"
            else _run_infer(cfg, batch_size, True)
        )
    return tr.breakdown()


def measure(cfg: Config, batch_size: int, mode: str = "train", steps: int = 2, target: str = "cpu") -> dict:
    """The same run on real CPU tensors: the tracker's peak and torch's CPU allocator peak
    (``target="cuda"`` runs the fused AdamW a GPU would, on the CPU)."""
    box = {}

    def body():
        box["tr"] = (
            _run_train(cfg, batch_size, steps, False, target)
            if mode == "train"
            else _run_infer(cfg, batch_size, False)
        )

    alloc = cpu_allocator_peak(body)
    out = box["tr"].breakdown()
    out["allocator_peak_bytes"] = alloc
    return out


# ----------------------------------------------------------------------------- derived knobs


def _block_param_bytes(cfg: Config, dtype_bytes: int) -> int:
    """Parameters of the largest decoder/vision block (what FSDP all-gathers at once)."""
    with torch.device("meta"):
        from vlastack.models.vla import build_model
        from vlastack.train.parallel import blocks

        model = build_model(cfg.model)
        return max(sum(p.numel() for p in b.parameters()) for b in blocks(model)) * dtype_bytes


def derive(sim: dict, cfg: Config, optimizer_8bit: bool = False, fsdp: int = 1) -> dict:
    """Adjust a simulated training breakdown for an 8-bit optimizer and/or FSDP over ``fsdp`` ranks."""
    cats = dict(sim["categories"])
    peak = sim["peak_bytes"]
    if optimizer_8bit:
        new = cats["optimizer_state"] * BYTES_8BIT_STATE / 8
        peak -= cats["optimizer_state"] - new
        cats["optimizer_state"] = new
    if fsdp > 1:
        shard = sum(cats[k] for k in ("parameters", "gradients", "optimizer_state"))
        gathered = 2 * _block_param_bytes(cfg, 2 if cfg.train.precision != "fp32" else 4)
        for k in ("parameters", "gradients", "optimizer_state"):
            cats[k] /= fsdp
        peak += shard / fsdp - shard + gathered
        cats["temporaries"] += gathered
    return {**sim, "peak_bytes": int(peak), "categories": {k: int(v) for k, v in cats.items()}}


# ----------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...] = ()
    optimizer_8bit: bool = False
    fsdp: int = 1
    cost: str = ""  # what the change costs, for the "cheapest fix" ordering


def _variants(cfg: Config) -> list[Variant]:
    """Single changes in order of cost (cheapest first), then everything together."""
    t = cfg.train
    out = []
    if t.precision == "fp32":
        out.append(Variant("bf16 autocast", ("train.precision=bf16",), cost="none on GPUs with bf16; faster"))
    if t.optimizer != "adamw8bit":
        out.append(Variant("8-bit AdamW", ("train.optimizer=adamw8bit",), optimizer_8bit=True,
                           cost="needs bitsandbytes (CUDA); tiny quality risk"))  # fmt: skip
    if not t.activation_checkpointing:
        out.append(Variant("activation checkpointing", ("train.activation_checkpointing=true",),
                           cost="~30% more compute per step"))  # fmt: skip
    if t.lora_rank == 0:
        out.append(Variant("LoRA r=16", ("train.lora_rank=16",), cost="trains adapters only"))
    for w in (2, 4, 8):
        out.append(Variant(f"FSDP x{w}", ("train.parallel=fsdp",), fsdp=w, cost=f"{w} GPUs"))
    return out


def _predict(cfg: Config, v: Variant, batch_size: int, cache: dict, target: str = "cpu") -> dict:
    c = apply_overrides(
        cfg, [o for o in v.overrides if not o.startswith(("train.optimizer", "train.parallel"))]
    )
    key = (c, batch_size, target)
    if key not in cache:
        cache[key] = simulate(c, batch_size, target=target)
    return derive(cache[key], c, v.optimizer_8bit or cfg.train.optimizer == "adamw8bit", v.fsdp)


def largest_batch(
    cfg: Config, v: Variant, budget: int, cache: dict, limit: int = 4096, target: str = "cpu"
) -> int:
    """Largest batch whose predicted peak fits ``budget`` (0 if not even 1): memory is affine in the
    batch size, so two simulations give the line and a third (or a few) confirm the answer."""
    p1 = _predict(cfg, v, 1, cache, target)["peak_bytes"]
    if p1 > budget:
        return 0
    p2 = _predict(cfg, v, 2, cache, target)["peak_bytes"]
    slope = max(p2 - p1, 1)
    b = int(min(limit, 1 + (budget - p1) // slope))
    while b > 1 and _predict(cfg, v, b, cache, target)["peak_bytes"] > budget:
        b = max(1, int(b * 0.95))
    return b


def plan(
    cfg: Config,
    budget: int | None = None,
    batch_sizes: tuple[int, ...] = (),
    infer: bool = True,
    rss: bool = False,
    data: str | None = None,
    target: str = "cpu",
) -> dict:
    """Predicted peaks for ``cfg`` and each single change; with ``budget``, what fits and the cheapest
    fix; with ``rss``, the CPU training process's peak RSS (``diagnostics.rss``; ``data`` sizes a
    preloaded dataset). ``target``: the device the training runs on (cpu | cuda), which decides the
    optimizer's kernels and so its temporaries (pi0 at batch 8: 54.0 GiB simulated with foreach
    AdamW, 47.3 with fused; an H100 measured 47.4)."""
    if rss and target != "cpu":
        raise ValueError(
            "the process RSS is predicted for CPU training only: use --no-rss with --target cuda"
        )
    from vlastack.train.precision import resolve_auto

    cfg, _ = resolve_auto(cfg, target)  # auto: what training on ``target`` would measure and take
    cache: dict = {}
    bs = cfg.train.batch_size
    base = Variant("as configured")
    rows = []
    for v in [base, *_variants(cfg)]:
        pred = _predict(cfg, v, bs, cache, target)
        row = {
            "variant": v.name,
            "overrides": list(v.overrides) + ([f"(world size {v.fsdp})"] if v.fsdp > 1 else []),
            "derived": v.optimizer_8bit or v.fsdp > 1,
            "peak_bytes": pred["peak_bytes"],
            "categories": pred["categories"],
            "cost": v.cost,
        }
        if budget:
            row["fits"] = pred["peak_bytes"] <= budget
        rows.append(row)
    out = {"batch_size": bs, "precision": cfg.train.precision, "budget_bytes": budget, "train": rows}
    out["target"] = target
    out["batch_sweep"] = [
        {"batch_size": b, "peak_bytes": _predict(cfg, base, b, cache, target)["peak_bytes"]}
        for b in batch_sizes
    ]
    if infer:
        out["infer"] = {"batch_size": bs, **simulate(cfg, bs, "infer")}
    if rss:
        from vlastack.diagnostics.rss import predict_rss

        out["process_rss"] = predict_rss(cfg, rows[0]["categories"], data)
    if budget:
        out["largest_batch"] = largest_batch(cfg, base, budget, cache, target=target)
        out["fits"] = rows[0]["fits"]
        if not out["fits"]:
            out["fix"] = cheapest_fix(cfg, budget, rows, cache, target)
    return out


def cheapest_fix(cfg: Config, budget: int, rows: list[dict], cache: dict, target: str = "cpu") -> dict | None:
    """The first single change (cheapest first) that fits; else a smaller batch with gradient
    accumulation (same effective batch); else the cheapest combination that fits."""
    single = [r for r in rows[1:] if r["fits"]]
    if single:
        return {
            "change": single[0]["variant"],
            "overrides": single[0]["overrides"],
            "peak_bytes": single[0]["peak_bytes"],
        }
    base = Variant("as configured")
    fitting = largest_batch(cfg, base, budget, cache, limit=cfg.train.batch_size, target=target)
    if fitting >= 1:
        # The largest micro-batch that fits *and* divides the effective batch, so that
        # micro-batch x accumulation is exactly the configured effective batch (61 x 3 = 183
        # would silently change it from 128; 32 x 4 keeps it).
        effective = cfg.train.batch_size * cfg.train.grad_accum
        b = next(d for d in range(fitting, 0, -1) if effective % d == 0)
        ov = [f"train.batch_size={b}", f"train.grad_accum={effective // b}"]
        return {"change": f"smaller micro-batch, same effective batch ({effective} = {b} x {effective // b})",
                "overrides": ov, "peak_bytes": _predict(cfg, base, b, cache, target)["peak_bytes"],
                "effective_batch": effective}  # fmt: skip
    combo: list[str] = []
    opt8, fsdp = False, 1
    for v in _variants(cfg):
        if v.fsdp > 1:
            fsdp = v.fsdp
        else:
            combo += v.overrides
            opt8 = opt8 or v.optimizer_8bit
        pred = _predict(cfg, Variant("combo", tuple(combo), opt8, fsdp), cfg.train.batch_size, cache, target)
        if pred["peak_bytes"] <= budget:
            ov = combo + ([f"train.parallel=fsdp (world size {fsdp})"] if fsdp > 1 else [])
            return {"change": "combined", "overrides": ov, "peak_bytes": pred["peak_bytes"]}
    return None


def format_plan(p: dict) -> str:
    """The table ``vla plan`` prints."""
    where = p.get("target", "cpu")
    lines = [
        f"training peak per rank at batch {p['batch_size']} on {where} "
        "(predicted on fake tensors; * = derived):"
    ]
    budget = p.get("budget_bytes")
    for r in p["train"]:
        fit = "" if budget is None else ("  fits" if r["fits"] else "  OOM")
        c = r["categories"]
        lines.append(
            f"  {r['variant'] + ('*' if r['derived'] else ''):26s} {fmt_bytes(r['peak_bytes']):>12s}{fit}"
            f"   (params {fmt_bytes(c['parameters'])}, grads {fmt_bytes(c['gradients'])}, "
            f"optim {fmt_bytes(c['optimizer_state'])}, activations {fmt_bytes(c['activations'])})"
        )
    for s in p.get("batch_sweep", []):
        lines.append(f"  batch {s['batch_size']:<5d} {fmt_bytes(s['peak_bytes']):>12s}")
    if "infer" in p:
        lines.append(
            f"inference peak at batch {p['infer']['batch_size']}: {fmt_bytes(p['infer']['peak_bytes'])}"
        )
    if "process_rss" in p:
        r = p["process_rss"]
        parts = ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in r["parts"].items() if v)
        lines.append(f"CPU training process peak RSS: {fmt_bytes(r['rss_bytes'])}   ({parts})")
        lines += [f"  ({n})" for n in r["notes"]]
    if budget:
        lines.append(
            f"budget {fmt_bytes(budget)}: largest batch that fits as configured: {p['largest_batch']}"
        )
        if p["fits"]:
            lines.append("the config fits as it is")
        elif p.get("fix"):
            f = p["fix"]
            lines.append(
                f"OOM: cheapest fix: {f['change']}: {' '.join(f['overrides'])} -> {fmt_bytes(f['peak_bytes'])}"
            )
        else:
            lines.append(
                "OOM: no single or combined change tried here fits; use more GPUs or a smaller model"
            )
    return "\n".join(lines)


__all__ = [
    "CATEGORIES",
    "cheapest_fix",
    "derive",
    "format_plan",
    "largest_batch",
    "measure",
    "plan",
    "simulate",
]
