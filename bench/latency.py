"""``sample_actions`` latency: p50/p90 over repeats after warm-up, batch 1.

    python bench/latency.py                     # tiny + small on CPU (and pi0 when CUDA is present)
    python bench/latency.py --presets tiny --repeats 10 --no-compile

Rows: eager vs torch.compile, fp32 vs bf16 autocast. For pi0 on a GPU it also prints the roofline
floor: max(FLOPs / peak bf16 matmul rate, bytes moved / memory bandwidth).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, print_table, time_fn, write_results
from vlastack.batch import dummy_batch
from vlastack.config import PRESETS
from vlastack.models import build_model

# Dense bf16 tensor-core peak and HBM bandwidth (vendor figures) for the roofline floor.
GPU_PEAKS = {
    "H100": (989e12, 3.35e12),
    "H200": (989e12, 4.8e12),
    "A100": (312e12, 2.0e12),
    "4090": (165e12, 1.0e12),
}


def sampler_flops(model, batch) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        model.sample_actions(batch)
    return fc.get_total_flops()


def sampler_bytes(model, cfg) -> int:
    """Minimum bytes read in one sample_actions call with bf16 weights: every weight once for the
    prefix, the expert + head weights and the KV cache once per denoise step."""
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".expert." in n or n.startswith("head."))
    total = model.num_params()
    kv = cfg.vlm.depth * 2 * cfg.vlm.kv_heads * cfg.vlm.head_dim * (cfg.prefix_len + 1 + cfg.action_horizon)
    return 2 * (total + cfg.num_denoise_steps * (n_expert + kv))


def bench_preset(
    name: str, device: str, dtypes: list[str], compile_modes: list[bool], repeats: int
) -> list[dict]:
    cfg = PRESETS[name]().model
    torch.manual_seed(0)
    model = build_model(cfg, device=device).eval()
    batch = dummy_batch(cfg, 1, train=False, device=device)
    rows = []
    for compiled in compile_modes:
        fn = torch.compile(model.sample_actions, fullgraph=True) if compiled else model.sample_actions
        for dt in dtypes:
            ctx = (
                torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
                if dt == "bf16"
                else contextlib.nullcontext()
            )

            def call(fn=fn, ctx=ctx):
                with torch.inference_mode(), ctx:
                    return fn(batch)

            times = time_fn(call, device, warmup=3 if compiled else 2, repeats=repeats)
            rows.append(
                {
                    "preset": name,
                    "device": device,
                    "mode": "compiled" if compiled else "eager",
                    "dtype": dt,
                    "p50_ms": round(percentile(times, 50), 2),
                    "p90_ms": round(percentile(times, 90), 2),
                    "params": model.num_params(),
                }
            )
            print_table(rows[-1:], list(rows[-1]))
    if device == "cuda" and name == "pi0":
        flops = sampler_flops(model, batch)
        nbytes = sampler_bytes(model, cfg)
        gpu = torch.cuda.get_device_name()
        peak, bw = next((v for k, v in GPU_PEAKS.items() if k in gpu), GPU_PEAKS["H100"])
        floor = max(flops / peak, nbytes / bw) * 1e3
        print(
            f"roofline floor ({gpu}): {flops / 1e12:.2f} TFLOP / {peak / 1e12:.0f} TFLOP/s = {flops / peak * 1e3:.2f} ms; "
            f"{nbytes / 1e9:.2f} GB / {bw / 1e12:.2f} TB/s = {nbytes / bw * 1e3:.2f} ms -> floor {floor:.2f} ms"
        )
        for r in rows:
            r.update(flops=flops, bytes=nbytes, roofline_floor_ms=round(floor, 2))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--presets", nargs="*", default=None)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--name", default=None, help="results file name (default latency / latency_cuda)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    presets = args.presets or (["tiny", "small"] + (["pi0"] if cuda else []))
    compile_modes = [False] if args.no_compile else [False, True]
    name_out = args.name or ("latency" if not cuda else "latency_cuda")
    rows = []
    for name in presets:
        device = "cuda" if (cuda and name == "pi0") else "cpu"
        rows += bench_preset(name, device, ["fp32", "bf16"], compile_modes, args.repeats)
        if name == "tiny":  # discrete token heads: bins / FAST autoregressive, OFT parallel
            from bench.token_latency import token_rows

            rows += token_rows(name, device, compile_modes, args.repeats)
        write_results(name_out, {"batch_size": 1, "rows": rows})  # after each preset: partial runs keep rows
    print()
    print_table(rows, ["preset", "device", "head", "mode", "dtype", "p50_ms", "p90_ms"])
    path = write_results(name_out, {"batch_size": 1, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
