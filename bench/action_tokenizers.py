"""Action tokenizer benchmark: tokens per chunk, compression, round-trip error, encode/decode time.

Data: random smooth trajectories (a few low-frequency sines plus a cubic drift per dim, in [-1, 1]),
which stand in for normalized robot action chunks. FAST is fitted on a train split and measured
on a held-out split. Prints a table and writes bench/results/action_tokenizers.json.

    .venv/bin/python bench/action_tokenizers.py [--n-fit 4000] [--n-eval 500]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from vlastack.config import TokenHeadConfig
from vlastack.models.action_tokens import make_action_tokenizer
from vlastack.models.action_tokens.fast import fast_error_bound

LM_VOCAB = 257_152  # PaliGemma-sized vocabulary; placement does not change the numbers below
SHAPES = [(16, 8), (50, 7)]


def smooth_chunks(n: int, horizon: int, dim: int, seed: int) -> np.ndarray:
    """[n, horizon, dim] smooth trajectories in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, horizon)[None, :, None]
    x = np.zeros((n, horizon, dim))
    for _ in range(3):
        f = rng.uniform(0.05, 1.5, (n, 1, dim))
        x += rng.uniform(0.05, 0.3, (n, 1, dim)) * np.sin(
            2 * np.pi * f * t + rng.uniform(0, 6.3, (n, 1, dim))
        )
    c = rng.normal(0, 0.15, (n, 4, dim))
    x += c[:, :1] + c[:, 1:2] * t + c[:, 2:3] * t**2 + c[:, 3:4] * t**3
    return np.clip(x, -1.0, 1.0)


def measure(tok, x: np.ndarray) -> dict:
    for c in x[:20]:  # warm up caches before timing
        tok.decode(tok.encode(c))
    t0 = time.perf_counter()
    seqs = [tok.encode(c) for c in x]
    t_enc = (time.perf_counter() - t0) / len(x)
    t0 = time.perf_counter()
    dec = [tok.decode(s) for s in seqs]
    t_dec = (time.perf_counter() - t0) / len(x)
    out = np.stack([d[0] for d in dec])
    err = np.abs(out - x)
    lens = np.array([len(s) for s in seqs])
    return {
        "tokens_mean": float(lens.mean()),
        "tokens_p95": float(np.percentile(lens, 95)),
        "tokens_max": int(lens.max()),
        "max_abs_err": float(err.max()),
        "rmse": float(np.sqrt((err**2).mean())),
        "valid_frac": float(np.mean([d[1] for d in dec])),
        "encode_us": t_enc * 1e6,
        "decode_us": t_dec * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-fit", type=int, default=4000)
    ap.add_argument("--n-eval", type=int, default=500)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "action_tokenizers.json"))
    args = ap.parse_args()

    rows = []
    for horizon, dim in SHAPES:
        train = smooth_chunks(args.n_fit, horizon, dim, seed=0)
        test = smooth_chunks(args.n_eval, horizon, dim, seed=1)
        bins = make_action_tokenizer(TokenHeadConfig(), LM_VOCAB, horizon, dim, [0, 1, 2])
        rows.append({"tokenizer": "bins", "H": horizon, "A": dim, "fit_s": 0.0, **measure(bins, test)})
        for scale in (10.0, 20.0):
            cfg = TokenHeadConfig(tokenizer="fast", fast_scale=scale, placement="skip_special")
            tok = make_action_tokenizer(cfg, LM_VOCAB, horizon, dim, list(range(LM_VOCAB - 128, LM_VOCAB)))
            t0 = time.perf_counter()
            tok.fit(train)
            fit_s = time.perf_counter() - t0
            r = measure(tok, test)
            r.update(
                tokenizer=f"fast(scale={scale:g})",
                H=horizon,
                A=dim,
                fit_s=fit_s,
                bpe_vocab=tok.bpe_vocab_size,
                err_bound=fast_error_bound(horizon, scale),
            )
            rows.append(r)
        for r in rows[-3:]:
            r["compression_vs_bins"] = horizon * dim / r["tokens_mean"]

    hdr = (
        f"{'tokenizer':<16}{'H×A':>7}{'tok/chunk':>10}{'p95':>6}{'ratio':>7}{'max|err|':>10}"
        f"{'rmse':>9}{'valid':>7}{'enc µs':>8}{'dec µs':>8}{'fit s':>7}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            f"{r['tokenizer']:<16}{r['H']:>3}×{r['A']:<3}{r['tokens_mean']:>10.1f}{r['tokens_p95']:>6.0f}"
            f"{r['compression_vs_bins']:>7.2f}{r['max_abs_err']:>10.4f}{r['rmse']:>9.4f}{r['valid_frac']:>7.2f}"
            f"{r['encode_us']:>8.0f}{r['decode_us']:>8.0f}{r['fit_s']:>7.2f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"n_fit": args.n_fit, "n_eval": args.n_eval, "machine": platform.processor() or platform.machine()}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
