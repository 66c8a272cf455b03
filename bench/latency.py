"""``sample_actions`` latency: p50/p90 over repeats after warm-up, batch 1.

    python bench/latency.py                     # tiny + small on CPU (and pi0 when CUDA is present)
    python bench/latency.py --presets tiny --repeats 10 --modes eager

Rows: eager vs torch.compile (see ``sampler`` for the modes; on CUDA also CUDA graphs), fp32 vs
bf16 autocast. For pi0 on a GPU it also prints the roofline floor: max(FLOPs / peak bf16 matmul
rate, bytes moved / memory bandwidth).
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
    return 2 * (total + cfg.head_options.num_denoise_steps * (n_expert + kv))


MODES = ("eager", "compiled", "cudagraphs", "step", "step-cudagraphs")


def sampler(model, mode: str, dtype: torch.dtype):
    """``sample_actions`` under ``mode``: eager; ``compiled`` (the whole sampler, the Euler loop
    unrolled); ``step`` (``FlowHead.compile_decoding``: the prefix pass and one denoise step
    compiled apart); ``*cudagraphs`` adds mode="reduce-overhead". ``step-cudagraphs`` reuses one
    cache, marked static, across calls (the step writes it in place)."""
    head = model.head
    for name in ("prefill", "denoise_step"):  # undo an earlier ``step`` mode's instance overrides
        head.__dict__.pop(name, None)
    torch._dynamo.reset()
    kw = {"mode": "reduce-overhead"} if mode.endswith("cudagraphs") else {}
    if mode == "eager":
        return model.sample_actions
    if not mode.startswith("step"):
        return torch.compile(model.sample_actions, fullgraph=True, dynamic=False, **kw)
    if not hasattr(head, "denoise_step"):
        raise ValueError(f"mode {mode!r} needs the flow head")
    head.compile_decoding(**kw)
    if mode == "step":
        return model.sample_actions
    device = next(model.parameters()).device
    cache = head.new_cache(model, 1, dtype, device).mark_static()
    return lambda batch: model.sample_actions(batch, cache=cache)


def bench_preset(
    name: str, device: str, dtypes: list[str], modes: list[str], repeats: int, on_row=None
) -> list[dict]:
    """Rows for one preset; ``on_row(rows)`` after each (so a run cut short keeps its rows)."""
    cfg = PRESETS[name]().model
    torch.manual_seed(0)
    model = build_model(cfg, device=device).eval()
    batch = dummy_batch(cfg, 1, train=False, device=device)
    rows = []
    for mode in modes:
        compiled = mode != "eager"
        for dt in dtypes:
            fn = sampler(model, mode, torch.bfloat16 if dt == "bf16" else torch.float32)
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
                    "mode": mode,
                    "dtype": dt,
                    "p50_ms": round(percentile(times, 50), 2),
                    "p90_ms": round(percentile(times, 90), 2),
                    "params": model.num_params(),
                }
            )
            print_table(rows[-1:], list(rows[-1]))
            if on_row:
                on_row(rows)
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
    ap.add_argument("--modes", default="eager,compiled", help=f"CPU presets; any of {MODES}")
    ap.add_argument(
        "--cuda-modes",
        default="eager,step,step-cudagraphs",
        help="pi0 on CUDA; the unrolled `compiled` sampler took over 5 min to compile on an H100 host",
    )
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--name", default=None, help="results file name (default latency / latency_cuda)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    presets = args.presets or (["tiny", "small"] + (["pi0"] if cuda else []))
    name_out = args.name or ("latency" if not cuda else "latency_cuda")
    dtypes = args.dtypes.split(",")
    rows: list[dict] = []

    def save(new_rows: list[dict]) -> None:
        write_results(name_out, {"batch_size": 1, "rows": rows + new_rows})

    for name in presets:
        device = "cuda" if (cuda and name == "pi0") else "cpu"
        modes = (args.cuda_modes if device == "cuda" else args.modes).split(",")
        if bad := set(modes) - set(MODES):
            raise SystemExit(f"unknown modes {sorted(bad)}; choose from {MODES}")
        rows += bench_preset(name, device, dtypes, modes, args.repeats, on_row=save)
        if name == "tiny":  # discrete token heads: bins / FAST autoregressive, OFT parallel
            from bench.token_latency import token_rows

            rows += token_rows(
                name, device, [m == "compiled" for m in modes if m in ("eager", "compiled")], args.repeats
            )
        save([])
    print()
    print_table(rows, ["preset", "device", "head", "mode", "dtype", "p50_ms", "p90_ms"])
    path = write_results(name_out, {"batch_size": 1, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
