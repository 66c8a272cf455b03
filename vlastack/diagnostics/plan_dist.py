"""``vla plan --nodes N --gpus-per-node G``: per-rank training memory under DDP, FSDP2 and HSDP.

One simulation of the training step on fake tensors (``plan.simulate``: the per-rank batch on one
device) gives parameters, gradients, optimizer state, activations and temporaries at the peak.
Each strategy is then derived from it for a world of ``N x G`` ranks:

- DDP: a full replica per rank, plus DDP's gradient buckets: with ``gradient_as_bucket_view``
  off (torch's default, and ``apply_ddp``'s) the reducer allocates flat buckets as large as the
  trainable parameters, at construction, and holds them for the whole run.
- FSDP2 over all ``W`` ranks: parameters, gradients and optimizer state sharded (``/W``, rows
  padded to a multiple of ``W``), plus FSDP2's working set: the root module's parameters
  (embeddings, projections: everything outside the blocks) all-gathered from the first forward
  until its gradients are reduced, and, around the block being computed, its all-gathered
  parameters, the next block's (prefetched in backward), the block's unsharded gradients and the
  flat reduce-scatter input of the block reduced before (FSDP2 keeps it until the next reduce).
- HSDP: FSDP2 on a ``(N, G)`` mesh: sharded over the ``G`` ranks of a node, replicated across
  nodes, so per rank it is FSDP over ``G`` (with ``N == 1`` HSDP is FSDP).

Variants, each on every strategy: as configured, LoRA, activation checkpointing, 8-bit AdamW
(derived: bitsandbytes' blockwise state is ~2.03 bytes per trainable parameter instead of 8) and
all of them together. A row fits when its per-rank peak is within the per-GPU budget. The
cheapest fitting row is the first in the order DDP < HSDP < FSDP (less communication) and, within a
strategy, as configured < 8-bit AdamW < checkpointing < LoRA < all.

Checked against measured per-rank peaks of real gloo runs on CPU (``bench/plan_dist.py``: world
sizes 1, 2 and 4): the measurement is torch's CPU allocator peak over the two training steps,
after the model is built and wrapped (the trainer builds the full model on every rank before
sharding it, so a rank's peak while starting is at least the full fp32 model plus its shard;
that is reported apart as ``startup_bytes``).
"""

from __future__ import annotations

import gc
import json
import os
import socket
import tempfile
from dataclasses import replace

import torch

from vlastack.config import Config, apply_overrides
from vlastack.diagnostics.memory import fmt_bytes
from vlastack.diagnostics.plan import BYTES_8BIT_STATE, simulate

STRATEGIES = ("ddp", "fsdp", "hsdp")
SHARDED = ("parameters", "gradients", "optimizer_state")


# ----------------------------------------------------------------------------- arguments


def check_cluster(nodes: int, gpus_per_node: int, strategy: str | None = None) -> int:
    """Validate a cluster shape; returns the world size ``nodes * gpus_per_node``."""
    for name, v in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    return nodes * gpus_per_node


# ----------------------------------------------------------------------------- measurement (gloo)

_MARK = 104_729  # bytes of a sentinel allocation that marks a phase in the allocator's trace


def _mark() -> None:
    torch.empty(_MARK, dtype=torch.uint8)


def allocator_phases(fn) -> dict:
    """Torch's CPU allocator while ``fn`` runs, split at each ``_mark()`` it calls: the peak of each
    phase (bytes held, counting what ``fn`` allocated before it too) and the bytes held at each mark.
    The same profiler memory events as ``memory.cpu_allocator_peak``."""
    from vlastack.diagnostics.memory import cpu_allocation_events

    events = cpu_allocation_events(fn)
    base = events[0][2] - events[0][1]
    peaks, held, cur = [0], [], 0
    for _t, size, total in events:
        if size == _MARK:
            held.append(total - size - base)
            peaks.append(0)
            continue
        if size == -_MARK:
            continue
        cur = total - base
        peaks[-1] = max(peaks[-1], cur)
    return {"phase_peaks": peaks, "held_at_marks": held, "end_bytes": cur}


def _wrapper(strategy: str, world: int, nodes: int, precision: str, box: dict):
    from vlastack.train.parallel import apply_ddp, apply_fsdp, fsdp_mp_policy, hsdp_mesh

    def wrap(model):
        if strategy == "ddp":
            box["wrapped"] = apply_ddp(model, torch.device("cpu"))
        else:
            mesh = hsdp_mesh("cpu", world, world // nodes) if strategy == "hsdp" else None
            box["wrapped"] = apply_fsdp(model, fsdp_mp_policy(precision), mesh=mesh)

    return wrap


def measure_rank(
    cfg: Config, batch_size: int, strategy: str, world: int, nodes: int = 1, steps: int = 2
) -> dict:
    """This rank's allocator peaks for ``steps`` training steps under ``strategy`` (the process
    group is up): ``startup_bytes`` (building, wrapping, the optimizer), ``peak_bytes`` (the
    training steps, what the model holds included) and ``held_bytes`` after them."""
    from vlastack.batch import dummy_batch
    from vlastack.diagnostics.plan import _build, _prepare_head
    from vlastack.train.step import train_step

    box: dict = {}

    def body():
        model, opt = _build(cfg, wrap=_wrapper(strategy, world, nodes, cfg.train.precision, box))
        _prepare_head(model, cfg, batch_size)
        batch = dummy_batch(cfg.model, batch_size)
        model.train()
        _mark()
        for _ in range(steps):
            train_step(
                box["wrapped"], opt, [batch], precision=cfg.train.precision, grad_clip=cfg.train.grad_clip
            )
        # gloo frees a collective's buffers when its worker thread takes the next one: a barrier
        # settles them, so what is held after the steps is the model's state alone
        torch.distributed.barrier()
        gc.collect()
        _mark()
        box["keep"] = (model, opt, batch)  # held until the end sentinel is read

    ph = allocator_phases(body)
    box.clear()
    return {
        "startup_bytes": ph["phase_peaks"][0],
        "peak_bytes": ph["phase_peaks"][1],
        "held_bytes": ph["held_at_marks"][1],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int, world: int, nodes: int, cfg: Config, batch_size: int, strategy: str, port: int, out: str
) -> None:
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        res = measure_rank(cfg, batch_size, strategy, world, nodes)
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(res, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure_distributed(
    cfg: Config, batch_size: int, strategy: str, world: int, nodes: int = 1
) -> list[dict]:
    """Per-rank allocator peaks of ``world`` gloo processes on this machine (127.0.0.1) running
    ``strategy`` (ddp | fsdp | hsdp over ``nodes`` "nodes") at the per-rank ``batch_size``."""
    import torch.multiprocessing as mp

    check_cluster(nodes, world // max(nodes, 1), strategy)
    if world % nodes:
        raise ValueError(f"world size {world} is not a multiple of {nodes} nodes")
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _rank_main,
            args=(world, nodes, cfg, batch_size, strategy, _free_port(), out),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        rows = []
        for r in range(world):
            with open(f"{out}/rank{r}.json") as f:
                rows.append(json.load(f))
    return rows


# ----------------------------------------------------------------------------- per-rank derivation


def _param_bytes(cfg: Config) -> dict:
    """Parameter counts FSDP2's working set depends on: the root module's (outside the blocks:
    embeddings, projections, the head) and the largest block's, all and trainable-only, plus
    the trainable total (DDP's buckets). Built on the meta device (no memory)."""
    from vlastack.diagnostics.plan import _build

    with torch.device("meta"):
        from vlastack.train.parallel import blocks

        model, _ = _build(replace(cfg, train=replace(cfg.train, activation_checkpointing=False)))
        inside = {id(p) for b in blocks(model) for p in b.parameters()}
        root = [p for p in model.parameters() if id(p) not in inside]
        per_block = [list(b.parameters()) for b in blocks(model)]
    return {
        "root": sum(p.numel() for p in root),
        "root_trainable": sum(p.numel() for p in root if p.requires_grad),
        "block": max(sum(p.numel() for p in b) for b in per_block),
        "block_trainable": max(sum(p.numel() for p in b if p.requires_grad) for b in per_block),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def derive_rank(
    sim: dict, cfg: Config, strategy: str, nodes: int = 1, gpus_per_node: int = 1, optimizer_8bit: bool = False,
    target: str = "cuda", counts: dict | None = None,
) -> dict:  # fmt: skip
    """Per-rank peak (bytes) and breakdown of a simulated single-device training step (``simulate``
    on the per-rank batch) run under ``strategy`` on ``nodes x gpus_per_node`` ranks.

    Each phase's simulated peak (forward, backward, optimizer) is derived apart, plus FSDP2's
    reduction of the root's gradients at the end of backward; the largest is the rank's peak.
    ``target="cpu"`` (gloo) adds gloo's flat copy of a reduce-scatter's input (NCCL reduces in
    place)."""
    world = check_cluster(nodes, gpus_per_node, strategy)
    counts = counts or _param_bytes(cfg)
    pb = 2 if cfg.train.precision in ("bf16", "fp16") else 4  # FSDP2's unsharded (param_dtype) bytes
    phases = dict(sim.get("phases") or {sim.get("phase_at_peak", "backward"): sim})
    w = gpus_per_node if strategy == "hsdp" else world  # ranks a parameter is sharded over
    root_g = counts["root_trainable"] * 4  # the root's gradients, in the fp32 reduce dtype
    rs_prev = counts["block_trainable"] * 4  # a block's reduce-scatter input, kept until the next
    out: dict = {}
    for name, ph in phases.items():
        c = {k: float(v) for k, v in ph["categories"].items()}
        if optimizer_8bit:
            c["optimizer_state"] *= BYTES_8BIT_STATE / 8
        other = ph["peak_bytes"] - sum(ph["categories"].values())  # 0: the categories are the peak
        extra: dict[str, float] = {}
        if strategy == "ddp":
            extra["ddp_buckets"] = counts["trainable"] * 4  # gradient_as_bucket_view=False
        else:
            g = c["gradients"]
            for k in SHARDED:
                c[k] /= w
            if name in ("forward", "backward"):
                # the root's gradients stay unsharded until the end of backward
                c["gradients"] = min(g, root_g) + max(0.0, g - root_g) / w
                extra["root_unsharded"] = counts["root"] * pb
                extra["blocks_unsharded"] = 2 * counts["block"] * pb  # computing + prefetched
                if name == "backward":
                    extra["reduce_scatter"] = rs_prev
            elif name in ("optimizer", "after"):
                c["temporaries"] /= w  # the optimizer's temporaries are per shard
        out[name] = _row(c, extra, other)
    if strategy != "ddp" and "forward" in phases:
        # the first forward's all-gather of the root: its shard as input, the flat output and the
        # per-parameter copies it is split into (before any activation exists)
        c = {k: float(v) for k, v in phases["forward"]["categories"].items()}
        if optimizer_8bit:
            c["optimizer_state"] *= BYTES_8BIT_STATE / 8
        c = {**dict.fromkeys(c, 0.0), "parameters": c["parameters"] / w, "optimizer_state": c["optimizer_state"] / w,
             "inputs": c["inputs"]}  # fmt: skip
        out["root_all_gather"] = _row(c, {"root_all_gather": counts["root"] * pb * (2 + 1 / w)}, 0)
    if strategy != "ddp" and "backward" in phases:
        # the end of backward: the root's gradients copied into the reduce-scatter input
        c = {k: float(v) for k, v in phases["backward"]["categories"].items()}
        if optimizer_8bit:
            c["optimizer_state"] *= BYTES_8BIT_STATE / 8
        full_g = phases.get("optimizer", phases["backward"])["categories"]["gradients"]
        c = {**dict.fromkeys(c, 0.0), "parameters": c["parameters"] / w, "optimizer_state": c["optimizer_state"] / w,
             "gradients": full_g / w, "inputs": c["inputs"]}  # fmt: skip
        extra = {"reduce_scatter": root_g + rs_prev}
        if target == "cpu" and w > 1:
            extra["gloo_copy"] = root_g  # gloo reduce-scatters a flat copy of the input
            if strategy == "hsdp" and nodes > 1:
                # the all-reduce across nodes on a second gloo group: two more shard-sized
                # buffers (measured at 2 x 2; NCCL all-reduces in place)
                extra["gloo_all_reduce"] = 2 * root_g / w
        out["root_reduce"] = _row(c, extra, 0)
    top = max(out, key=lambda k: out[k]["peak_bytes"])
    return {**out[top], "phase_at_peak": top, "strategy": strategy, "world_size": world, "phases": out}


def _row(c: dict, extra: dict, other: float) -> dict:
    return {
        "peak_bytes": int(sum(c.values()) + sum(extra.values()) + other),
        "categories": {k: int(v) for k, v in c.items()},
        "extra": {k: int(v) for k, v in extra.items()},
    }


# ----------------------------------------------------------------------------- the cluster plan

LORA_RANK = 16


def cluster_variants(cfg: Config) -> list[tuple[str, tuple[str, ...], bool]]:
    """(name, overrides, 8-bit AdamW) per variant, cheapest first; "all" combines every change."""
    t = cfg.train
    out = [("as configured", (), t.optimizer == "adamw8bit")]
    change: list[str] = []
    if t.optimizer != "adamw8bit":
        out.append(("8-bit AdamW", ("train.optimizer=adamw8bit",), True))
        change.append("train.optimizer=adamw8bit")
    if not t.activation_checkpointing:
        out.append(("checkpointing", ("train.activation_checkpointing=true",), t.optimizer == "adamw8bit"))
        change.append("train.activation_checkpointing=true")
    if t.lora_rank == 0:
        out.append((f"LoRA r={LORA_RANK}", (f"train.lora_rank={LORA_RANK}",), t.optimizer == "adamw8bit"))
        change.append(f"train.lora_rank={LORA_RANK}")
    if len(change) > 1:
        out.append(("all of them", tuple(change), True))
    return out


def cluster_strategies(nodes: int, gpus_per_node: int) -> list[tuple[str, str]]:
    """(strategy, column label), cheapest communication first: DDP, HSDP (several nodes), FSDP."""
    world = nodes * gpus_per_node
    out = [("ddp", "DDP")]
    if nodes > 1 and gpus_per_node > 1:
        out.append(("hsdp", f"HSDP {nodes}x{gpus_per_node}"))
    out.append(("fsdp", f"FSDP x{world}"))
    return out


def plan_cluster(
    cfg: Config, nodes: int = 1, gpus_per_node: int = 1, budget: int | None = None, target: str = "cuda"
) -> dict:
    """Per-rank training peaks of ``cfg`` (``train.batch_size`` per rank) for every strategy and
    variant on ``nodes x gpus_per_node`` ranks; with ``budget`` (bytes per GPU), which fit and the
    cheapest that does (the first fitting cell, strategies then variants in order of cost)."""
    from vlastack.train.precision import resolve_auto

    world = check_cluster(nodes, gpus_per_node)
    if budget is not None and budget <= 0:
        raise ValueError(f"the memory budget must be > 0 bytes, got {budget}")
    cfg, _ = resolve_auto(cfg, target)
    bs = cfg.train.batch_size
    sims: dict = {}
    rows = []
    for name, overrides, opt8 in cluster_variants(cfg):
        c = apply_overrides(cfg, [o for o in overrides if not o.startswith("train.optimizer")])
        if c not in sims:
            sims[c] = (simulate(c, bs, target=target), _param_bytes(c))
        sim, counts = sims[c]
        cells = {}
        for strategy, _label in cluster_strategies(nodes, gpus_per_node):
            d = derive_rank(sim, c, strategy, nodes, gpus_per_node, opt8, target, counts)
            cells[strategy] = {k: d[k] for k in ("peak_bytes", "phase_at_peak", "categories", "extra")}
            if budget:
                cells[strategy]["fits"] = d["peak_bytes"] <= budget
        rows.append({"variant": name, "overrides": list(overrides), "cells": cells})
    out = {
        "nodes": nodes, "gpus_per_node": gpus_per_node, "world_size": world, "batch_size_per_rank": bs,
        "global_batch": bs * cfg.train.grad_accum * world, "precision": cfg.train.precision, "target": target,
        "budget_bytes": budget, "strategies": [s for s, _ in cluster_strategies(nodes, gpus_per_node)],
        "labels": dict(cluster_strategies(nodes, gpus_per_node)), "rows": rows,
        "startup_bytes": _startup_bytes(cfg, world),
    }  # fmt: skip
    if budget:
        out["cheapest"] = next(
            ({"strategy": s, "variant": r["variant"], "overrides": [f"train.parallel={s}", *r["overrides"]],
              "peak_bytes": r["cells"][s]["peak_bytes"]}
             for s in out["strategies"] for r in rows if r["cells"][s]["fits"]),
            None,
        )  # fmt: skip
    return out


def _startup_bytes(cfg: Config, world: int) -> int:
    """What a rank holds while the trainer starts: the full fp32 model on the device, then its shard
    (it moves the whole model before FSDP2 shards it)."""
    with torch.device("meta"):
        from vlastack.models.vla import build_model

        n = sum(p.numel() * p.element_size() for p in build_model(cfg.model).parameters())
    return n + n // world


def format_cluster(p: dict) -> str:
    """The table ``vla plan --nodes/--gpus-per-node`` prints: variants x strategies, GiB per rank."""
    budget = p.get("budget_bytes")
    head = (
        f"training peak per rank: {p['nodes']} node(s) x {p['gpus_per_node']} GPU(s) = world {p['world_size']}, "
        f"batch {p['batch_size_per_rank']} per rank (global {p['global_batch']}), {p['precision']}, on {p['target']}"
        + (f", budget {fmt_bytes(budget)} per GPU" if budget else "")
    )
    labels = [p["labels"][s] for s in p["strategies"]]
    lines = [head, f"  {'':16s}" + "".join(f"{lab:>20s}" for lab in labels)]
    for r in p["rows"]:
        cells = []
        for s in p["strategies"]:
            c = r["cells"][s]
            fit = "" if not budget else (" ok" if c["fits"] else " OOM")
            cells.append(f"{fmt_bytes(c['peak_bytes']):>16s}{fit:4s}")
        lines.append(f"  {r['variant']:16s}" + "".join(cells))
    lines.append(
        f"  (while starting, each rank holds the full fp32 model, then its shard: {fmt_bytes(p['startup_bytes'])})"
    )
    if budget:
        ch = p.get("cheapest")
        if ch:
            lines.append(
                f"cheapest that fits: {p['labels'][ch['strategy']]}, {ch['variant']}: {' '.join(ch['overrides'])}"
                f" -> {fmt_bytes(ch['peak_bytes'])} per rank"
            )
        else:
            lines.append("nothing here fits: more GPUs, a smaller per-rank batch, or a smaller model")
    return "\n".join(lines)
