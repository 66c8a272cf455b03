"""Ranking of the action heads on the demo task: flow vs bins-AR, FAST-AR and bins-parallel + L1.

Every head trains on the demo dataset (`vla demo`'s: 2000 scripted episodes, DART 0.1, lossless
video) with the demo recipe (tiny preset, grounding head + attention loss, bf16, batch 32, EMA)
and is evaluated closed-loop on 100 unseen-seed episodes, re-planning every step.

Budget. "The same CPU budget" is the demo's: 3400 bf16 steps of the flow head, ~640 s of
training on 2 idle cores. The machine this runs on is shared, so wall time is not comparable
between runs; instead ``timing`` measures every head's training step interleaved (round-robin,
the same batch shapes, median), and each head gets ``3400 * t_flow / t_head`` steps. Results then
do not depend on what else ran.

    python bench/heads.py timing                        # -> budget steps per head
    python bench/heads.py timing --heads oft            # one head added (flow timed beside it)
    python bench/heads.py train bins_ar --seed 0        # runs/heads/bins_ar_s0 (full budget)
    python bench/heads.py train fast_ar --variant nobpe --set model.head_options.fast_vocab_size=57
    python bench/heads.py diag runs/heads/bins_ar_s0    # held-out token accuracy, per-step error
    python bench/heads.py eval runs/heads/bins_ar_s0    # 100 episodes + latency p50
    python bench/heads.py eval RUN --steps-per-chunk 4 --tag _spc4   # execution ablations
    python bench/heads.py tokenizer                     # FAST on the data alone: tokens, round-trip error
    python bench/heads.py report                        # the table (docs/heads.md)

Everything lands in bench/results/heads.json (read, updated, written back per command).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, environment, percentile
from vlastack.labs._core import cpu_flags

OUT = RESULTS / "heads.json"
DATA = "runs/demo_data"  # `vla data generate --episodes 2000 --noise 0.1 --seed 0 --video-quality lossless`
HELDOUT = "runs/heldout_data"  # the same with --episodes 200 --seed 500000 (never trained on)
FLOW_STEPS = 3400  # the demo recipe's budget (~640 s on 2 idle avx512_bf16 cores)

# Head name -> (packaged recipe, overrides on top of it).
HEADS: dict[str, tuple[str, list[str]]] = {
    "flow": ("demo", []),
    "bins_ar": ("demo_tokens", []),
    # FAST on this data (H=8, 4 dims, scale 10): 16 tokens on average with a 512-id BPE, p99 23,
    # max 25 over the first 10,000 chunks; 28 + EOS positions keep the step near the bins' 32.
    "fast_ar": (
        "demo_tokens",
        [
            "model.head_options.tokenizer=fast",
            "model.head_options.fast_vocab_size=512",
            "model.head_options.max_action_tokens=28",
            # demo_tokens' bin_sigma=2 never applied to BPE pieces (no order); said explicitly now.
            "model.head_options.bin_sigma=0",
        ],
    ),
    "bins_parallel_l1": (
        "demo_tokens",
        ["model.head_options.decoding=parallel", "model.head_options.regression_head=true"],
    ),
    # OpenVLA-OFT's recipe: one learned query per step, parallel decoding, L1 (configs/demo_oft.yaml).
    "oft": ("demo_oft", []),
}
LOAD_NOTE = (
    "2-core CPU: seed-0 runs trained on a mostly idle machine, seed-1 runs on one thread each beside "
    "1-2 other jobs (budgets are step counts, so success does not depend on load); latency_ms_p50 "
    "(per run and for every recipe) measured on the idle machine; the timing table on a loaded one"
)


def load_results() -> dict:
    return json.loads(OUT.read_text()) if OUT.exists() else {"runs": {}}


def save_results(res: dict) -> None:
    res.update(
        environment=environment(),
        cpu_flags=cpu_flags(),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        load_note=LOAD_NOTE,
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(res, indent=2) + "\n")


def head_config(head: str, seed: int = 0, steps: int | None = None, extra: list[str] | tuple = ()):
    from vlastack.config import load_config

    recipe, overrides = HEADS[head]
    ov = [*overrides, f"train.seed={seed}", *extra]
    if steps is not None:
        ov.append(f"train.steps={steps}")
    return load_config("tiny", recipe, ov)


def _fit_for_timing(model, cfg, batch) -> None:
    """Attach a tokenizer so a token head can train on dummy batches (the step's cost depends on
    the config's shapes, not on what the tokenizer was fitted on)."""
    if not cfg.model.head_spec.action_tokens:
        return
    if cfg.model.head_options.tokenizer == "fast":
        g = torch.Generator().manual_seed(0)
        t = torch.linspace(-0.6, 0.6, cfg.model.action_horizon)[None, :, None]
        x = (t * torch.rand(2000, 1, cfg.model.action_dim, generator=g)).clamp(-1, 1)
        model.head.fit_tokenizer(x)
    else:
        model.head.fit_tokenizer(batch["actions"], batch["action_is_pad"], batch["action_dim_mask"])


def cmd_timing(args: argparse.Namespace) -> None:
    """Interleaved per-step timing of every head (round-robin, median) -> budget steps."""
    from vlastack.batch import dummy_batch
    from vlastack.models import build_model
    from vlastack.train.optim import build_optimizer
    from vlastack.train.step import train_step

    # One thread: with two, OpenMP threads spin while their partner is descheduled, so on a busy
    # machine process CPU time inflates with the load; a single thread's CPU time does not.
    torch.set_num_threads(args.threads)
    # A subset is timed beside flow (the reference every budget is relative to) and merged into
    # the existing table, so the budgets of runs already made stay as they were.
    timed = list(HEADS) if not args.heads else ["flow", *(h for h in args.heads if h != "flow")]
    setups = {}
    for head in timed:
        cfg = head_config(head)
        torch.manual_seed(0)
        model = build_model(cfg.model)
        batch = dummy_batch(cfg.model, cfg.train.batch_size)
        batch["actions"] = batch["actions"].clamp(-1, 1)
        _fit_for_timing(model, cfg, batch)
        setups[head] = (model, build_optimizer(model, cfg.train), batch, cfg.train.precision)
    wall: dict[str, list[float]] = {h: [] for h in timed}
    cpu: dict[str, list[float]] = {h: [] for h in timed}
    for r in range(args.warmup + args.steps):
        for head, (model, opt, batch, precision) in setups.items():
            t0, c0 = time.perf_counter(), time.process_time()
            train_step(model, opt, [batch], precision=precision)
            if r >= args.warmup:
                wall[head].append(time.perf_counter() - t0)
                cpu[head].append(time.process_time() - c0)
        print(f"round {r + 1}/{args.warmup + args.steps}", flush=True)
    # The budget comes from process CPU time, which other jobs on the machine disturb far less
    # than wall time; wall medians are recorded beside it.
    med = {h: statistics.median(v) for h, v in cpu.items()}
    out = {}
    for h in timed:
        steps = round(FLOW_STEPS * med["flow"] / med[h])
        out[h] = {
            "step_cpu_s_median": med[h],
            "step_wall_s_median": statistics.median(wall[h]),
            "step_cpu_s_all": cpu[h],
            "step_wall_s_all": wall[h],
            "relative_cost": med[h] / med["flow"],
            "budget_steps": steps,
            "samples_per_s_interleaved": 32 / statistics.median(wall[h]),
            "samples_per_cpu_s": 32 / med[h],
        }
        print(
            f"{h:18s} cpu {med[h]:.3f} s/step  wall {out[h]['step_wall_s_median']:.3f}  x{med[h] / med['flow']:.2f}  -> {steps} steps"
        )
    res = load_results()
    method = (
        f"{args.steps} steps per head after {args.warmup} warm-up rounds, round-robin "
        f"({', '.join(timed)}, then again), batch 32 dummy batches of the recipe's "
        f"shapes, bf16 autocast, {args.threads} thread(s); budget_steps = 3400 x median(flow) / median(head) over process "
        "CPU time per step"
    )  # fmt: skip
    if args.heads and res.get("timing"):
        for h in timed[1:]:
            out[h]["method"] = method + "; timed beside flow alone and merged into this table"
            out[h]["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            res["timing"]["heads"][h] = out[h]
    else:
        res["timing"] = {"method": method, "heads": out}
    save_results(res)


def budget_steps(head: str) -> int:
    t = load_results().get("timing")
    if not t:
        raise SystemExit("run `python bench/heads.py timing` first (it sets each head's step budget)")
    return t["heads"][head]["budget_steps"]


def cmd_train(args: argparse.Namespace) -> None:
    from vlastack.train.trainer import Trainer

    steps = args.steps or budget_steps(args.head)
    cfg = head_config(args.head, args.seed, steps, args.set)
    name = f"{args.head}_{args.variant}_s{args.seed}" if args.variant else f"{args.head}_s{args.seed}"
    out = Path(args.out or f"runs/heads/{name}")
    res = load_results()
    if out.name in res["runs"] and res["runs"][out.name].get("variant", "") != args.variant:
        raise SystemExit(
            f"{out.name} in {OUT} is variant {res['runs'][out.name].get('variant')!r}: pass --out"
        )
    t0, c0 = time.perf_counter(), time.process_time()
    summary = Trainer(cfg, data_path=args.data, run_dir=out).fit()
    cpu_s = time.process_time() - c0  # every thread of this process (not the preload workers)
    res = load_results()
    # A new training replaces the record: evaluations of an earlier model under this name are void.
    res["runs"][out.name] = dict(
        head=args.head,
        variant=args.variant,
        seed=args.seed,
        steps=steps,
        overrides=list(HEADS[args.head][1]) + list(args.set),
        train_wall_s=time.perf_counter() - t0,
        train_cpu_hours=cpu_s / 3600,
        # The machine each run trained on: machines differ (avx512_bf16 or AVX2 only), and the
        # recipe's bf16 autocast is overridden to fp32 where bf16 matmuls are slow.
        precision=cfg.train.precision,
        cpu_flags=cpu_flags(),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        train={k: v for k, v in summary.items() if k != "losses"},
    )
    save_results(res)


def _policy_dir(run: Path, checkpoint: str = "final") -> Path:
    """The EMA weights of ``run/<checkpoint>`` (``final`` or ``step_N``) when saved, else the raw."""
    ck = run / checkpoint
    return ck / "ema" if (ck / "ema").is_dir() else ck


def _load(run: Path, checkpoint: str = "final"):
    from vlastack.config import load_config
    from vlastack.models import VLA

    cfg = load_config("tiny", str(run / "config.yaml"))
    model = VLA.from_pretrained(_policy_dir(run, checkpoint)).eval()
    return cfg, model


@torch.no_grad()
def cmd_diag(args: argparse.Namespace) -> None:
    """Held-out frames: token accuracy, grounding error and the sampled chunk's error per step."""
    from torch.utils.data import DataLoader, Subset

    from vlastack.data.samples import make_dataset
    from vlastack.models.heads.grounding import predict_grounding

    run = Path(args.run)
    cfg, model = _load(run, args.checkpoint)
    torch.set_num_threads(2)
    ds = make_dataset(cfg, args.heldout)
    idx = list(range(0, len(ds), max(1, len(ds) // args.samples)))[: args.samples]
    loader = DataLoader(Subset(ds, idx), batch_size=64, shuffle=False)
    torch.manual_seed(0)
    sums: dict[str, float] = {}
    err_step, err_dim, n_step, n_dim = 0.0, 0.0, 0.0, 0.0
    grip_ok, grip_n, invalid, n, ground_se = 0.0, 0.0, 0, 0, 0.0
    for b in loader:
        out = model(b)
        for k, v in out.items():
            if v.dim() == 0:
                sums[k] = sums.get(k, 0.0) + float(v) * len(b["state"])
        s = model.sample(b)
        w = (~b["action_is_pad"])[:, :, None] & b["action_dim_mask"][:, None, :]
        e = (s.actions - b["actions"]).abs() * w
        err_step = err_step + e.sum((0, 2))
        n_step = n_step + w.float().sum((0, 2))
        err_dim = err_dim + e.sum((0, 1))
        n_dim = n_dim + w.float().sum((0, 1))
        g = 3  # the gripper command: > 0 closes
        same = ((s.actions[..., g] > 0) == (b["actions"][..., g] > 0)).float() * w[..., g]
        grip_ok, grip_n = grip_ok + same.sum(0), grip_n + w[..., g].float().sum(0)
        if s.valid is not None:
            invalid += int((~s.valid).sum())
        if cfg.model.grounding.points:
            ground_se += float((predict_grounding(model, b) - b["env_state"]).pow(2).mean(-1).sum())
        n += len(b["state"])
    diag = {
        "heldout": args.heldout,
        "samples": n,
        "teacher_forced": {k: v / n for k, v in sums.items()},
        "sampled_abs_error_per_chunk_step": (err_step / n_step.clamp(min=1)).tolist(),
        "sampled_abs_error_per_dim": (err_dim / n_dim.clamp(min=1)).tolist(),
        "gripper_sign_agreement_per_chunk_step": (grip_ok / grip_n.clamp(min=1)).tolist(),
        "invalid_fraction": invalid / n,
        "grounding_mse": ground_se / n if cfg.model.grounding.points else None,
        "note": "normalized action units; held-out data normalized with its own statistics "
        "(actions are within [-1, 1] with q01/q99 = -1/1, so quantile normalization is the identity)",
    }
    print(json.dumps(diag, indent=1))
    res = load_results()
    res["runs"].setdefault(run.name, {})[
        "diag" if args.checkpoint == "final" else f"diag_{args.checkpoint}"
    ] = diag
    save_results(res)


@torch.no_grad()
def latency(model, batch, repeats: int = 30) -> float:
    ms = []
    for i in range(repeats + 3):
        t0 = time.perf_counter()
        model.sample(batch)
        if i >= 3:
            ms.append((time.perf_counter() - t0) * 1e3)
    return percentile(ms, 50)


def cmd_eval(args: argparse.Namespace) -> None:
    from torch.utils.data import default_collate

    from vlastack.data.samples import make_dataset
    from vlastack.models.heads.serving import parse_decoding
    from vlastack.sim.evaluate import evaluate
    from vlastack.sim.policies import Checkpoint

    run = Path(args.run)
    cfg, model = _load(run, args.checkpoint)
    entry: dict = {"checkpoint": args.checkpoint}
    decoding = tuple(parse_decoding(args.decode).items())
    spec = str(_policy_dir(run, args.checkpoint))
    if args.episodes:
        e = evaluate(
            Checkpoint(spec, decoding) if decoding else spec, suite="builtin", episodes=args.episodes, seed=1_000_000, num_workers=2,
            steps_per_chunk=args.steps_per_chunk, temporal_ensemble=args.temporal_ensemble,
            image_size=cfg.eval.image_size, cameras=cfg.model.camera_names, videos=0, out_dir=run / "eval",
            batch_episodes=args.batch_episodes,
        )  # fmt: skip
        # one chunk per steps_per_chunk steps (1: re-planning every step)
        chunks = sum(-(-ep["steps"] // args.steps_per_chunk) for ep in e["episodes"])
        entry[f"closed_loop{args.tag}"] = {
            "episodes": args.episodes,
            "decoding": dict(decoding),
            "steps_per_chunk": args.steps_per_chunk,
            "temporal_ensemble": args.temporal_ensemble,
            "batch_episodes": e["config"]["batch_episodes"],
            "seed": 1_000_000,
            "mean_task_success": e["mean_task_success"],
            "tasks": {t: v["success_rate"] for t, v in e["tasks"].items()},
            "invalid_decode_fraction": sum(ep["invalid_chunks"] for ep in e["episodes"]) / max(chunks, 1),
            "chunks": chunks,
            "wall_s": e["wall_s"],
        }
        print(json.dumps(entry[f"closed_loop{args.tag}"], indent=1))
    if args.latency:
        torch.set_num_threads(2)
        batch = default_collate([make_dataset(cfg, args.heldout)[0]])
        eager = latency(model, batch)
        t0 = time.perf_counter()
        model.head.compile_decoding()
        model.sample(batch)
        compile_s = time.perf_counter() - t0
        entry["latency_ms_p50"] = {
            "eager": eager,
            "compiled": latency(model, batch),
            "compile_s": compile_s,
            "batch": 1,
            "threads": 2,
        }
        print(json.dumps(entry["latency_ms_p50"], indent=1))
    res = load_results()
    res["runs"].setdefault(run.name, {}).update(entry)
    save_results(res)


@torch.no_grad()
def cmd_latency(args: argparse.Namespace) -> None:
    """p50 of one ``model.sample`` at batch 1, eager then with ``head.compile_decoding()``, per head.

    The decoders run a fixed number of steps whatever the weights (flow: 5 Euler steps; bins-AR:
    32 tokens; FAST: 28 + 1 slots, tokens after EOS masked; parallel: one pass), so a freshly
    initialized model of each recipe times the same as a trained one; heads are measured in turn."""
    from vlastack.batch import dummy_batch
    from vlastack.models import build_model

    torch.set_num_threads(2)
    out = {}
    for head in HEADS:
        cfg = head_config(head)
        torch.manual_seed(0)
        model = build_model(cfg.model)
        batch = dummy_batch(cfg.model, 1)
        _fit_for_timing(model, cfg, dummy_batch(cfg.model, 32))
        model.eval()
        eager = latency(model, batch, args.repeats)
        t0 = time.perf_counter()
        model.head.compile_decoding()
        model.sample(batch)
        compile_s = time.perf_counter() - t0
        out[head] = {"eager": eager, "compiled": latency(model, batch, args.repeats), "compile_s": compile_s}
        print(head, {k: round(v, 1) for k, v in out[head].items()}, flush=True)
    res = load_results()
    res["latency_ms_p50"] = {
        "method": f"batch 1, 2 threads, fp32, p50 of {args.repeats} calls after 3 warm-up calls; compiled: "
        "head.compile_decoding() (the decode step / denoise step / parallel pass)",
        "heads": out,
    }
    save_results(res)


def cmd_tokenizer(args: argparse.Namespace) -> None:
    """FAST on the demo's own chunks, no model: tokens per chunk and round-trip error by DCT scale
    and BPE vocabulary (the quantization part of the error, against what a model reaches), and how
    smooth the chunks are (FAST's DCT compresses smooth signals; these are proportional-control
    deltas with phase switches)."""
    import numpy as np

    from vlastack.data.samples import make_dataset
    from vlastack.models.action_tokens.base import TokenPlacement
    from vlastack.models.action_tokens.fast import FastTokenizer, dct_matrix
    from vlastack.models.heads.tokens.head import hold_last_step

    torch.set_num_threads(1)
    cfg = head_config("fast_ar")
    ds = make_dataset(cfg, args.data)
    idx = np.random.default_rng(0).choice(len(ds), args.fit + args.eval, replace=False)
    items = [ds[int(i)] for i in idx]
    acts = torch.stack([it["actions"] for it in items])
    pads = torch.stack([it["action_is_pad"] for it in items])
    real = int(items[0]["action_dim_mask"].sum())
    chunks = hold_last_step(acts, pads)[:, :, :real].double().numpy()
    fit, ev = chunks[: args.fit], chunks[args.fit :]
    h = chunks.shape[1]
    rows = []
    for scale in (5.0, 10.0, 20.0):
        alphabet = 2 * int(np.floor(np.abs(dct_matrix(h)).sum(1).max() * scale + 0.5)) + 1
        for vocab in (alphabet, 256, 512, 1024):
            tok = FastTokenizer(h, real, TokenPlacement("new_rows", vocab, 1000), scale).fit(fit)
            enc = tok._encode_internal(ev)
            n = np.array([len(e) for e in enc])
            err = np.abs(np.stack([tok._decode_internal(e) for e in enc]) - ev)
            rows.append({
                "scale": scale, "bpe_vocab": vocab, "no_merges": vocab == alphabet,
                "tokens_mean": float(n.mean()), "tokens_p99": float(np.percentile(n, 99)),
                "tokens_max": int(n.max()), "abs_err_step0": float(err[:, 0].mean()),
                "abs_err_mean": float(err.mean()), "abs_err_max": float(err.max()),
            })  # fmt: skip
            print(rows[-1], flush=True)
    bins = (np.clip(np.floor((ev + 1) / 2 * 256), 0, 255) + 0.5) / 256 * 2 - 1
    out = {
        "data": args.data,
        "chunks_fit": args.fit,
        "chunks_eval": args.eval,
        "horizon": h,
        "real_action_dims": real,
        "abs_action_mean_per_dim": np.abs(chunks).mean((0, 1)).tolist(),
        "abs_step_to_step_change_per_dim": np.abs(np.diff(chunks, axis=1)).mean((0, 1)).tolist(),
        "bins256_abs_err_mean": float(np.abs(bins - ev).mean()),
        "fast": rows,
        "note": "normalized units (actions in [-1, 1]); the gripper (last real dim) is +-1. "
        "Quantization error only: what the tokenizer loses before any model predicts a token.",
    }
    res = load_results()
    res["fast_tokenizer_on_demo_data"] = out
    save_results(res)


def table(res: dict) -> str:
    """The Markdown ranking table from heads.json."""
    tasks = ("reach", "push", "pick_place", "stack")
    lines = [
        "| head | seed | steps | train samples/s (1 thread, interleaved, loaded machine) | " + " | ".join(tasks)
        + " | mean | invalid decodes | latency p50 eager / compiled (ms) |",
        "|---" * (7 + len(tasks)) + "|",
    ]  # fmt: skip
    timing = res.get("timing", {}).get("heads", {})
    for _name, r in sorted(
        res.get("runs", {}).items(), key=lambda kv: (list(HEADS).index(kv[1].get("head", "flow")), kv[0])
    ):
        cl = r.get("closed_loop")
        # A run without its own measurement shows its head's recipe-level figure, marked as such
        # (a variant, e.g. bins-AR at H = 1, decodes a different number of tokens).
        own = r.get("latency_ms_p50")
        lat = own or res.get("latency_ms_p50", {}).get("heads", {}).get(r.get("head"))
        sps = timing.get(r.get("head"), {}).get("samples_per_s_interleaved")
        if r.get("stopped_at_step"):  # a run cut short: say how far it got
            r = {
                **r,
                "steps": f"{r['stopped_at_step']} of {r['steps']} (evaluated: {r.get('checkpoint', 'final')})"
                if cl
                else r["steps"],
            }
        cells = [f"{cl['tasks'].get(t, 0):.0%}" for t in tasks] if cl else ["-"] * len(tasks)
        head = f"{r.get('head')} ({r['variant']})" if r.get("variant") else r.get("head")
        lines.append(
            f"| {head} | {r.get('seed')} | {r.get('steps')} | {sps:.0f} | " if sps else
            f"| {head} | {r.get('seed')} | {r.get('steps')} | - | "
        )  # fmt: skip
        lines[-1] += " | ".join(cells) + " | "
        lines[-1] += (
            f"**{cl['mean_task_success']:.0%}** | {cl['invalid_decode_fraction']:.1%} | "
            if cl
            else "- | - | "
        )
        mark = "" if own else " (recipe)"
        lines[-1] += f"{lat['eager']:.1f} / {lat['compiled']:.1f}{mark} |" if lat else "- |"
    return "\n".join(lines)


def _pooled(rates: list[float], episodes: list[int]) -> str:
    """The Wilson 95% interval of the episodes pooled over seeds (successes rounded from rates)."""
    from vlastack.stats import wilson

    k = sum(round(r * n) for r, n in zip(rates, episodes, strict=True))
    lo, hi = wilson(k, sum(episodes))
    return f"[{lo:.1%}, {hi:.1%}]"


def summary(res: dict) -> str:
    """Per head (and variant) over its seeds: mean success, the Wilson 95% interval of the pooled
    episodes, min and per seed, invalid decodes."""
    lines = [
        "| head | seeds | mean success | 95% interval (pooled episodes) | min | per seed | invalid decodes |",
        "|---|---|---|---|---|---|---|",
    ]
    flow = res.get("flow_reference", {}).get("demo_100_episodes_by_training_seed", {})
    if flow:
        v = list(flow.values())
        per = ", ".join(f"{x:.0%}" for x in v)
        lines.append(
            f"| flow (demo recipe) | {len(v)} | **{sum(v) / len(v):.1%}** | {_pooled(v, [100] * len(v))} | "
            f"{min(v):.0%} | {per} | - |"
        )
    variants = sorted(
        {(r.get("head"), r.get("variant", "")) for r in res.get("runs", {}).values()},
        key=lambda hv: (list(HEADS).index(hv[0]) if hv[0] in HEADS else len(HEADS), hv[1]),
    )
    for head, variant in variants:
        runs = [
            r
            for r in res.get("runs", {}).values()
            if r.get("head") == head and r.get("variant", "") == variant and r.get("closed_loop")
        ]
        if not runs:
            continue
        runs.sort(key=lambda r: r["seed"])
        name = f"{head} ({variant})" if variant else head
        v = [r["closed_loop"]["mean_task_success"] for r in runs]
        n = [r["closed_loop"]["episodes"] for r in runs]
        bad = [r["closed_loop"]["invalid_decode_fraction"] for r in runs]
        per = ", ".join(f"{x:.0%}" for x in v)
        lines.append(
            f"| {name} | {len(v)} | **{sum(v) / len(v):.1%}** | {_pooled(v, n)} | {min(v):.0%} | {per} | "
            f"{sum(bad) / len(bad):.1%} |"
        )
    return "\n".join(lines)


def cmd_report(args: argparse.Namespace) -> None:
    res = load_results()
    print(table(res))
    print()
    print(summary(res))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("timing")
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--warmup", type=int, default=3)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument(
        "--heads", nargs="*", choices=list(HEADS), default=None, help="time these beside flow only"
    )
    t.set_defaults(func=cmd_timing)
    t = sub.add_parser("train")
    t.add_argument("head", choices=list(HEADS))
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=None, help="default: the head's budget from `timing`")
    t.add_argument("--data", default=DATA)
    t.add_argument("--out", default=None)
    t.add_argument("--set", nargs="*", default=[], help="extra dotted overrides")
    t.add_argument("--variant", default="", help="name of what --set changes (the summary groups by it)")
    t.set_defaults(func=cmd_train)
    t = sub.add_parser("diag")
    t.add_argument("run")
    t.add_argument("--heldout", default=HELDOUT)
    t.add_argument("--samples", type=int, default=512)
    t.add_argument("--checkpoint", default="final", help="final | step_N")
    t.set_defaults(func=cmd_diag)
    t = sub.add_parser("eval")
    t.add_argument("run")
    t.add_argument("--episodes", type=int, default=100)
    t.add_argument("--latency", action=argparse.BooleanOptionalAction, default=False)
    t.add_argument(
        "--decode", action="append", default=[], metavar="KEY=VALUE", help="Policy decoding option"
    )
    t.add_argument("--tag", default="", help="suffix of the result key (closed_loop<tag>)")
    t.add_argument(
        "--steps-per-chunk", type=int, default=1, help="actions executed per chunk (1: re-plan every step)"
    )
    t.add_argument("--temporal-ensemble", type=float, default=0.0, help="ACT's exponential weight (0: off)")
    t.add_argument(
        "--batch-episodes", type=int, default=1,
        help="episodes side by side per worker, one batched decode per step (eval.batch_episodes)",
    )  # fmt: skip
    t.add_argument("--checkpoint", default="final", help="final | step_N")
    t.add_argument("--heldout", default=HELDOUT)
    t.set_defaults(func=cmd_eval)
    t = sub.add_parser("latency")
    t.add_argument("--repeats", type=int, default=30)
    t.set_defaults(func=cmd_latency)
    t = sub.add_parser("tokenizer")
    t.add_argument("--data", default=DATA)
    t.add_argument("--fit", type=int, default=2000)
    t.add_argument("--eval", type=int, default=1000)
    t.set_defaults(func=cmd_tokenizer)
    t = sub.add_parser("report")
    t.set_defaults(func=cmd_report)
    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
