"""The per-step training cost of each head on the Meta-World MT10 recipe's shapes, so every head
gets the flow row's CPU-hours there (issue #67's fair protocol: the same data and CPU budget).

    python bench/mt10_heads_timing.py      # no labels, bf16 -> bench/results/mt10_step_costs.json
    python bench/mt10_heads_timing.py --recipe hindsight --precision fp32 --flow-steps 12000 \
        --heads flow oft bins_parallel_l1 fast bins_ar_h1   # -> mt10_step_costs_hindsight_fp32.json

Interleaved round-robin, process CPU time of one thread (a busy machine disturbs it far less than
wall time), compiled as ``train.compile`` compiles (fullgraph), dummy batches of the recipe's
shapes (batch 32, 128 px, 40 text tokens, 4 real action dims). A head's budget is
``flow_steps x cost(flow) / cost(head)`` steps: the flow rows trained 24,000 bf16 steps without
labels and 12,000 fp32 steps on hindsight labels (``mt10.vlastack_hindsight``, the chosen recipe,
trained on an AVX2-only CPU), so ``--recipe hindsight --precision fp32 --flow-steps 12000`` gives
the budgets of the heads' rows beside it.
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
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import environment  # noqa: E402
from vlastack.batch import dummy_batch  # noqa: E402
from vlastack.config import load_config  # noqa: E402
from vlastack.labs._core import cpu_flags  # noqa: E402
from vlastack.models import build_model  # noqa: E402
from vlastack.train.optim import build_optimizer  # noqa: E402
from vlastack.train.step import train_step  # noqa: E402

RECIPES = {
    # the simulator's object and goal positions dropped (the fair protocol's first trial)
    "no_labels": [
        "model.grounding.points=0",
        "model.grounding.attend_weight=0",
        "model.grounding.state_index=[]",
    ],
    # the chosen recipe: grounding on `vla data hindsight` labels (environment_state), no 39-d state
    "hindsight": ["model.grounding.state_index=[]"],
}
BINS = [
    "model.head=tokens",
    "model.head_options.tokenizer=bins",
    "model.head_options.num_bins=256",
    "model.head_options.placement=new_rows",
    "model.head_options.bin_sigma=2",
    "data.norm.action=quantiles",
]
# Each head's built-in-suite recipe (docs/heads.md) on top of the MT10 recipe.
HEADS = {
    "flow": [],
    # OpenVLA-OFT's recipe (configs/demo_oft.yaml): one query per step, parallel, L1
    "oft": ["model.head=oft", "model.head_options.hidden=256", "model.head_options.l1=true",
            "data.norm.action=quantiles"],
    "bins_parallel_l1": [*BINS, "model.head_options.decoding=parallel", "model.head_options.regression_head=true"],
    # the built-in suite's FAST recipe: no BPE merges, H = 4, soft targets
    "fast": ["model.head=tokens", "model.head_options.tokenizer=fast", "model.head_options.placement=new_rows",
             "model.head_options.fast_vocab_size=41", "model.head_options.max_action_tokens=16",
             "model.action_horizon=4", "model.head_options.bin_sigma=2", "data.norm.action=quantiles"],
    # OpenVLA's one-step recipe (bins-AR at H = 1)
    "bins_ar_h1": [*BINS, "model.action_horizon=1"],
}  # fmt: skip
REAL_DIMS = 4  # Meta-World's action: x, y, z, gripper


def setup(overrides: list[str]):
    cfg = load_config("tiny", "metaworld_mt10", overrides)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    batch = dummy_batch(cfg.model, cfg.train.batch_size)
    batch["actions"] = batch["actions"].clamp(-1, 1)
    batch["action_dim_mask"][:, REAL_DIMS:] = False
    if cfg.model.head_spec.action_tokens:  # a tokenizer fitted on smooth chunks of the real dims
        g = torch.Generator().manual_seed(0)
        t = torch.linspace(-0.6, 0.6, cfg.model.action_horizon)[None, :, None]
        x = (t * torch.rand(2000, 1, cfg.model.action_dim, generator=g)).clamp(-1, 1)
        x[:, :, REAL_DIMS:] = 0
        model.head.fit_tokenizer(x, action_dim_mask=batch["action_dim_mask"][0])
    model.compile(fullgraph=True, dynamic=False)
    return model, build_optimizer(model, cfg.train), batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="no_labels")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--flow-steps", type=int, default=24000, help="the flow row's steps (the budget)")
    ap.add_argument("--heads", nargs="+", choices=sorted(HEADS), default=["flow", "fast"])
    ap.add_argument("--rounds", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=8)
    args = ap.parse_args()
    heads = list(dict.fromkeys(["flow", *args.heads]))  # flow first: the yardstick
    torch.set_num_threads(1)
    setups = {h: setup(RECIPES[args.recipe] + HEADS[h]) for h in heads}
    cpu: dict[str, list[float]] = {h: [] for h in setups}
    for r in tqdm(range(args.warmup + args.rounds), desc="rounds"):
        for h, (model, opt, batch) in setups.items():
            c0 = time.process_time()
            train_step(model, opt, [batch], precision=args.precision)
            if r >= args.warmup:
                cpu[h].append(time.process_time() - c0)
    med = {h: statistics.median(v) for h, v in cpu.items()}
    out = {
        "date": datetime.date.today().isoformat(), "environment": environment(), "cpu_flags": cpu_flags(),
        "recipe": args.recipe, "precision": args.precision, "overrides": {h: RECIPES[args.recipe] + HEADS[h] for h in heads},
        "method": f"{args.rounds} rounds after {args.warmup} warm-up, round-robin, compiled (fullgraph), "
                  f"{args.precision}, 1 thread, process CPU time per train_step on a batch-32 dummy batch "
                  "of the MT10 recipe's shapes",
        "step_cpu_s_median": med,
        "flow_steps": args.flow_steps,
        "budget_steps": {h: round(args.flow_steps * med["flow"] / med[h]) for h in med},
    }  # fmt: skip
    name = "mt10_step_costs.json" if args.recipe == "no_labels" and args.precision == "bf16" else (
        f"mt10_step_costs_{args.recipe}_{args.precision}.json")  # fmt: skip
    path = ROOT / "bench" / "results" / name
    path.write_text(json.dumps(out, indent=1) + "\n")
    for h in med:
        print(
            f"{h:16s} {med[h]:.3f} CPU-s/step  x{med[h] / med['flow']:.2f}  -> {out['budget_steps'][h]} steps"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
