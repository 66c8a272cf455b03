"""The per-step training cost of each head on the Meta-World MT10 recipe's shapes, so every head
gets the flow row's CPU-hours there (issue #67's fair protocol: the same data and CPU budget).

    python bench/mt10_heads_timing.py      # -> bench/results/mt10_step_costs.json

Interleaved round-robin, process CPU time of one thread (a busy machine disturbs it far less than
wall time), compiled as ``train.compile`` compiles (fullgraph), bf16, dummy batches of the
recipe's shapes (batch 32, 128 px, 40 text tokens, 4 real action dims). A head's budget is
``24000 x cost(flow) / cost(head)`` steps: the flow row trained 24,000 steps.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import environment  # noqa: E402
from vlastack.batch import dummy_batch  # noqa: E402
from vlastack.config import load_config  # noqa: E402
from vlastack.labs._core import cpu_flags  # noqa: E402
from vlastack.models import build_model  # noqa: E402
from vlastack.train.optim import build_optimizer  # noqa: E402
from vlastack.train.step import train_step  # noqa: E402

NO_LABELS = ["model.grounding.points=0", "model.grounding.attend_weight=0", "model.grounding.state_index=[]"]
HEADS = {
    "flow": [],
    # the built-in suite's FAST recipe (docs/heads.md): no BPE merges, H = 4, soft targets
    "fast": ["model.head=tokens", "model.head_options.tokenizer=fast", "model.head_options.placement=new_rows",
             "model.head_options.fast_vocab_size=41", "model.head_options.max_action_tokens=16",
             "model.action_horizon=4", "model.head_options.bin_sigma=2", "data.norm.action=quantiles"],
}  # fmt: skip
FLOW_STEPS = 24000
REAL_DIMS = 4  # Meta-World's action: x, y, z, gripper


def setup(overrides: list[str]):
    cfg = load_config("tiny", "metaworld_mt10", NO_LABELS + overrides)
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


def main(rounds: int = 32, warmup: int = 8) -> None:
    torch.set_num_threads(1)
    setups = {h: setup(o) for h, o in HEADS.items()}
    cpu: dict[str, list[float]] = {h: [] for h in setups}
    for r in range(warmup + rounds):
        for h, (model, opt, batch) in setups.items():
            c0 = time.process_time()
            train_step(model, opt, [batch], precision="bf16")
            if r >= warmup:
                cpu[h].append(time.process_time() - c0)
        print(f"round {r + 1}/{warmup + rounds}", flush=True)
    med = {h: statistics.median(v) for h, v in cpu.items()}
    out = {
        "date": datetime.date.today().isoformat(), "environment": environment(), "cpu_flags": cpu_flags(),
        "method": f"{rounds} rounds after {warmup} warm-up, round-robin, compiled (fullgraph), bf16, 1 thread, "
                  "process CPU time per train_step on a batch-32 dummy batch of the MT10 recipe's shapes",
        "step_cpu_s_median": med,
        "budget_steps": {h: round(FLOW_STEPS * med["flow"] / med[h]) for h in med},
    }  # fmt: skip
    path = ROOT / "bench" / "results" / "mt10_step_costs.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    for h in med:
        print(
            f"{h:6s} {med[h]:.3f} CPU-s/step  x{med[h] / med['flow']:.2f}  -> {out['budget_steps'][h]} steps"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
