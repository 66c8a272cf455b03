"""Token-head decoding options: what greedy, temperature and top-p sampling cost per chunk (batch 1),
with the decode step eager or compiled (``model.head.compile_decoding()``, fullgraph).

    python bench/decoding.py [--preset tiny] [--repeats 10] [--threads 1] [--no-compile]

FAST head (``placement=new_rows``) fitted on smooth random chunks, untrained, so it never emits the
end token: every row runs the full ``max_action_tokens + 1`` steps (the worst case), and the rows
differ only in ``pick``: argmax, Gumbel-max over seeded noise, or Gumbel-max after the top-p sort.
Rows are measured interleaved (one call of each in turn) so a noisy neighbour hits them alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, print_table, write_results
from bench.token_latency import smooth_chunks
from vlastack.batch import dummy_batch
from vlastack.config import PRESETS, TokenHeadConfig
from vlastack.models import build_model

OPTIONS = {"greedy": (0.0, 1.0), "temperature=1": (1.0, 1.0), "temperature=1,top_p=0.9": (1.0, 0.9)}


def rows(preset: str, compile_modes: tuple[bool, ...], repeats: int) -> list[dict]:
    base = PRESETS[preset]().model
    cfg = replace(base, head="tokens", head_options=TokenHeadConfig(tokenizer="fast", placement="new_rows"))
    calls = {}
    for compiled in compile_modes:
        torch.manual_seed(0)
        model = build_model(cfg).eval()
        model.head.fit_tokenizer(smooth_chunks(2000, cfg.action_horizon, cfg.action_dim))
        if compiled:
            model.head.compile_decoding()
        batch = dummy_batch(cfg, 1, train=False)
        for name, (temp, top_p) in OPTIONS.items():
            gen = torch.Generator().manual_seed(0)

            def call(model=model, batch=batch, temp=temp, top_p=top_p, gen=gen):
                with torch.inference_mode():
                    return model.sample(batch, temperature=temp, top_p=top_p, generator=gen)

            for _ in range(2):  # warm-up (compiles the step for this temperature / top_p)
                call()
            calls[(name, compiled)] = (call, model.head.num_steps)
    times: dict = {k: [] for k in calls}
    for _ in range(repeats):
        for k, (call, _) in calls.items():
            t0 = time.perf_counter()
            call()
            times[k].append(time.perf_counter() - t0)
    out = []
    for (name, compiled), (_, steps) in calls.items():
        p50 = percentile(times[(name, compiled)], 50) * 1e3
        out.append({"preset": preset, "decoding": name, "mode": "compiled-step" if compiled else "eager",
                    "decode_steps": steps, "vocab": cfg.vlm.vocab_size + cfg.head_options.fast_vocab_size,
                    "p50_ms": round(p50, 2), "p90_ms": round(percentile(times[(name, compiled)], 90) * 1e3, 2),
                    "per_token_ms": round(p50 / steps, 3)})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = rows(args.preset, (False,) if args.no_compile else (False, True), args.repeats)
    print_table(result, ["preset", "decoding", "mode", "decode_steps", "p50_ms", "p90_ms", "per_token_ms"])
    flags = next(
        (
            ln.split(":", 1)[1].split()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("flags")
        ),
        [],
    )
    payload = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "cpu_flags": [f for f in flags if f.startswith(("avx", "fma", "amx", "sse4"))],
               "batch_size": 1, "threads": args.threads, "repeats": args.repeats, "rows": result,
               "note": "wall time, rows interleaved; measured while other jobs shared the 2-core CPU"}  # fmt: skip
    print(f"wrote {write_results('decoding', payload)}")


if __name__ == "__main__":
    main()
