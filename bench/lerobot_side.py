"""LeRobot's side of bench/latency_gpu.py: PI0Policy / PI05Policy (lerobot 0.6.1) with random weights
at the shapes vlastack's bench uses, timed the same way. Runs in its own process with .gpu_wheels
installed first on PYTHONPATH (by latency_gpu.py), imports nothing from vlastack, and rewrites ``--out`` after
every figure so a run stopped at its budget keeps what it measured.

    python bench/lerobot_side.py --out /tmp/lr.json [--compile] [--budget-s 300]

Rows: ``<kind>/eager_b<B>`` (``predict_action_chunk``, LeRobot's bf16 dtype, chunk 50, 10 steps),
``<kind>/compile_b1`` (``torch.compile(model.sample_actions)``, what ``compile_model=True`` does;
mode ``--compile-mode``, LeRobot's default is max-autotune), ``<kind>/train`` (``policy.forward``
+ backward + fused AdamW, gradient checkpointing, largest batch that fits). Inputs: uint8-valued
float images in [0, 1] for every camera, a 48 (pi0) / 200 (pi05) token prompt, a random state.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

import torch

CAMERAS = {
    "pi0": ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
    "pi05": ("base_0_rgb", "left_wrist_0_rgb"),
}
TOKENS = {"pi0": 48, "pi05": 200}
STATE_DIM = ACTION_DIM = 32
CHUNK, STEPS, IMAGE = 50, 10, 224
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[lerobot {time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


class Out:
    def __init__(self, path: Path) -> None:
        self.path, self.data = path, {"rows": {}, "skipped": {}}
        self.save()

    def put(self, key: str, value) -> None:
        self.data["rows"][key] = value
        self.save()
        log(f"{key}: {value}")

    def skip(self, key: str, why: str) -> None:
        self.data["skipped"][key] = why
        self.save()
        log(f"SKIP {key}: {why}")

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=2, default=str))


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def timed(fn, device: str, repeats: int, warmup: int = 2) -> dict:
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    sync()
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    return {"p50_ms": round(percentile(ms, 50), 3), "p90_ms": round(percentile(ms, 90), 3), "n": repeats}


def make_policy(kind: str, device: str, smoke: bool):
    from lerobot.configs import FeatureType, PolicyFeature

    if kind == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config as Config
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy as Policy
    else:
        from lerobot.policies.pi05.configuration_pi05 import PI05Config as Config
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy as Policy
    inputs = {
        f"observation.images.{c}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, IMAGE, IMAGE))
        for c in CAMERAS[kind]
    }
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    config = Config(
        input_features=inputs,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))},
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        num_inference_steps=STEPS,
        tokenizer_max_length=TOKENS[kind],
        device=device,
        dtype="bfloat16" if device == "cuda" else "float32",
        gradient_checkpointing=True,
    )
    if smoke:  # the config and the inputs only: a full-size LeRobot model on a shared CPU is minutes
        return None, config
    with torch.device(device):  # build on the GPU: random init of 3B params on the host takes minutes
        policy = Policy(config)
    return policy.to(device), config


def make_batch(kind: str, b: int, device: str, train: bool) -> dict:
    g = torch.Generator().manual_seed(b)
    batch = {
        f"observation.images.{c}": torch.randint(0, 256, (b, 3, IMAGE, IMAGE), generator=g).float() / 255
        for c in CAMERAS[kind]
    }
    n = TOKENS[kind]
    lengths = torch.randint(n // 4, n + 1, (b,), generator=g)
    mask = torch.arange(n)[None] < lengths[:, None]
    batch["observation.language.tokens"] = torch.randint(2, 250000, (b, n), generator=g) * mask
    batch["observation.language.attention_mask"] = mask
    batch["observation.state"] = torch.randn(b, STATE_DIM, generator=g)
    if train:
        batch["action"] = torch.randn(b, CHUNK, ACTION_DIM, generator=g)
        batch["action_is_pad"] = torch.zeros(b, CHUNK, dtype=torch.bool)
    return {k: v.to(device) for k, v in batch.items()}


def run_kind(kind: str, args, out: Out) -> None:
    dev = args.device
    t0 = time.perf_counter()
    policy, config = make_policy(kind, dev, args.smoke)
    if policy is None:
        batch = make_batch(kind, 1, dev, train=True)
        out.put(f"{kind}/smoke", {"config": type(config).__name__, "inputs": sorted(batch)})
        return
    policy.eval()
    out.put(f"{kind}/build_s", round(time.perf_counter() - t0, 1))
    out.put(f"{kind}/params", sum(p.numel() for p in policy.parameters()))
    batches = [1] if args.compile else args.batches
    for b in batches:
        batch = make_batch(kind, b, dev, train=False)
        noise = torch.randn(b, CHUNK, 32, device=dev)
        if args.compile:
            policy.model.sample_actions = torch.compile(policy.model.sample_actions, mode=args.compile_mode)
        call = lambda batch=batch, noise=noise: policy.predict_action_chunk(batch, noise=noise)  # noqa: E731
        try:
            with torch.inference_mode():
                t0 = time.perf_counter()
                call()
                if dev == "cuda":
                    torch.cuda.synchronize()
                row = {"warmup_s": round(time.perf_counter() - t0, 2)}
                row.update(timed(call, dev, args.repeats if b == 1 else max(3, args.repeats // 4)))
            row["samples_per_s"] = round(b * 1e3 / row["p50_ms"], 2)
            if args.compile:
                row["compile_mode"] = args.compile_mode
            out.put(f"{kind}/{'compile' if args.compile else 'eager'}_b{b}", row)
        except Exception as e:
            traceback.print_exc()
            out.skip(f"{kind}/infer_b{b}", f"{type(e).__name__}: {str(e)[:400]}")
    if args.compile or time.perf_counter() - T0 > args.budget_s - 60:
        return
    policy.train()
    opt = torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad], lr=2.5e-5, fused=dev == "cuda"
    )
    for b in args.train_batches:
        batch = make_batch(kind, b, dev, train=True)
        try:

            def step(batch=batch):
                loss, _ = policy.forward(batch)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            step()
            row = {
                "batch": b,
                "dtype": "bfloat16 params" if dev == "cuda" else "float32",
                "gradient_checkpointing": True,
            }
            row.update(timed(step, dev, args.train_steps, warmup=1))
            row["samples_per_s"] = round(b * 1e3 / row["p50_ms"], 2)
            out.put(f"{kind}/train", row)
            break
        except torch.OutOfMemoryError:
            log(f"{kind} train batch {b} does not fit")
        except Exception as e:
            traceback.print_exc()
            out.skip(f"{kind}/train", f"{type(e).__name__}: {str(e)[:400]}")
            break
        # outside the except block, so the failed step's activations are no longer referenced
        opt.zero_grad(set_to_none=True)
        gc.collect(), torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kinds", default="pi0,pi05")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--train-batches", default="32,24,16,8")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--train-steps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-mode", default="default", help="LeRobot's own default is max-autotune")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.train_batches = [int(b) for b in args.train_batches.split(",")]
    out = Out(Path(args.out))
    try:
        import lerobot
        import transformers

        out.data["versions"] = {
            "lerobot": lerobot.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
        }
        out.save()
    except Exception as e:  # why lerobot cannot import is the figure here
        traceback.print_exc()
        out.skip("import", f"{type(e).__name__}: {e}")
        return
    for kind in args.kinds.split(","):
        if time.perf_counter() - T0 > args.budget_s - 45:
            out.skip(kind, "budget")
            continue
        try:
            run_kind(kind, args, out)
        except Exception as e:
            traceback.print_exc()
            out.skip(kind, f"{type(e).__name__}: {str(e)[:400]}")
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
