"""What a LeRobot Diffusion Policy step costs on this CPU, per U-Net size: the measurement behind the
U-Net sizes of the Diffusion Policy tuning trials in bench/results/metaworld.json (issue #64).

Runs under the LeRobot venv's Python (it imports lerobot 0.6.1; from vlastack only bench/lerobot_common,
standard library):

    /work/lrvenv/bin/python bench/lerobot_dp_cost.py [--out bench/results/lerobot_dp_cost.json]

For each ``down_dims`` (LeRobot's default (512, 1024, 2048), the Diffusion Policy repository's
low-dim (256, 512, 1024), and (128, 256, 512)) with the trials' other settings (2 observation steps,
horizon 16, 8 actions, 112 px crop of 128 px frames, GroupNorm, a 10-d task one-hot as environment
state, DDIM 10 steps): parameters; CPU seconds of one training step (``policy.forward`` + backward +
AdamW at batch 8, 2 threads, random inputs, no data loading; the mean of 4 steps after 2 warm-up
steps); the steps that fit in the 1.71 CPU-hour trial budget at that cost; and the wall time of one
action chunk at inference (``select_action`` after ``reset``, 1 thread as the policy server runs, the
mean of 3). A training run costs more per step than this (loader workers, logging): the trials take
their step count from ``bench/lerobot_metaworld.py train``'s probe, which includes them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.lerobot_common import machine, write_json

SIZES = [(512, 1024, 2048), (256, 512, 1024), (128, 256, 512)]
BATCH, BUDGET_CPU_H = 8, 1.71


def policy(down_dims: tuple[int, int, int]) -> torch.nn.Module:
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    cfg = DiffusionConfig(
        horizon=16, n_obs_steps=2, n_action_steps=8, drop_n_last_frames=7, use_group_norm=True,
        pretrained_backbone_weights=None, crop_shape=(112, 112), down_dims=down_dims,
        noise_scheduler_type="DDIM", num_inference_steps=10, device="cpu",
        input_features={
            "observation.image": PolicyFeature(FeatureType.VISUAL, (3, 128, 128)),
            "observation.state": PolicyFeature(FeatureType.STATE, (4,)),
            "observation.environment_state": PolicyFeature(FeatureType.ENV, (10,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (4,))},
    )  # fmt: skip
    return DiffusionPolicy(cfg)


def measure(down_dims: tuple[int, int, int]) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    p = policy(down_dims)
    batch = {
        "observation.image": torch.rand(BATCH, 2, 3, 128, 128),
        "observation.state": torch.randn(BATCH, 2, 4),
        "observation.environment_state": torch.zeros(BATCH, 2, 10),
        "action": torch.randn(BATCH, 16, 4),
        "action_is_pad": torch.zeros(BATCH, 16, dtype=torch.bool),
    }
    opt = torch.optim.AdamW(p.parameters(), 1e-4)
    for i in range(6):
        if i == 2:
            cpu0, wall0 = time.process_time(), time.perf_counter()
        loss, _ = p.forward(batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
    train_cpu = (time.process_time() - cpu0) / 4
    train_wall = (time.perf_counter() - wall0) / 4
    p.eval()
    torch.set_num_threads(1)
    obs = {
        "observation.image": torch.rand(1, 3, 128, 128),
        "observation.state": torch.randn(1, 4),
        "observation.environment_state": torch.zeros(1, 10),
    }
    with torch.no_grad():
        p.reset()
        p.select_action(obs)
        t = time.perf_counter()
        for _ in range(3):
            p.reset()
            p.select_action(obs)
        chunk_s = (time.perf_counter() - t) / 3
    return {
        "down_dims": list(down_dims),
        "params_m": round(sum(x.numel() for x in p.parameters()) / 1e6, 1),
        "train_cpu_s_per_step": round(train_cpu, 2),
        "train_wall_s_per_step": round(train_wall, 2),
        "steps_in_budget": int(BUDGET_CPU_H * 3600 // train_cpu),
        "inference_s_per_chunk": round(chunk_s, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/lerobot_dp_cost.json")
    args = ap.parse_args()
    import lerobot

    rows = []
    for dd in SIZES:
        rows.append(measure(dd))
        r = rows[-1]
        print(f"down_dims {dd}: {r['params_m']}M params, {r['train_cpu_s_per_step']} CPU-s/step "
              f"({r['steps_in_budget']} steps in {BUDGET_CPU_H} CPU-h), "
              f"{r['inference_s_per_chunk']} s per chunk", flush=True)  # fmt: skip
    write_json(
        Path(args.out),
        {
            "machine": machine(),
            "versions": {"lerobot": lerobot.__version__, "torch": torch.__version__, "python": sys.version.split()[0]},
            "settings": {"batch": BATCH, "train_threads": 2, "inference_threads": 1, "budget_cpu_h": BUDGET_CPU_H},
            "rows": rows,
        },
    )  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
