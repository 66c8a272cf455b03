"""CPU training speed of the demo step, per CPU kind and precision: today's step (baseline) and
each change measured alone against it, then the best combination. Writes bench/results/train_cpu.json.

    .venv/bin/python bench/train_cpu.py                    # both kinds on an avx512_bf16 machine
    .venv/bin/python bench/train_cpu.py --kinds avx2 --reps 3

The AVX2-only kind is this machine with its kernels capped (``ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2``; each kind runs in its own process, since the cap is read at start-up).
On a machine without avx512_bf16 the native kind is ``avx2`` and no cap is needed.

Each kind times the variants of ``bench/train.py --ab`` interleaved (every repetition runs every
variant in turn, so a noisy neighbour hits all alike; medians), 2 intra-op threads, batch 32, the
demo model (tiny + demo recipe), synthetic batches (data loading is not part of the step: the
demo preloads its data). Variants: ``fused`` (AdamW's fused CPU kernel instead of foreach),
``regional`` (``train.compile``: each block compiled), ``compile`` (the whole model compiled),
``threads1`` (one thread). Compile time is the variant's ``first_step_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import print_table, write_results
from bench.train import ab, machine

CAP = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
OPTIONS = ("fused", "regional", "compile", "threads1")
SETTINGS = {
    "": "eager, foreach AdamW, 2 threads",
    "fused": "fused AdamW",
    "regional": "train.compile=true (each block torch.compile'd)",
    "compile": "torch.compile of the whole model",
    "threads1": "1 intra-op thread",
}


def native_kind() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx512_bf16" if " avx512_bf16" in flags else "avx2"


def child(precisions: list[str], options: list[str], reps: int, steps: int) -> None:
    """Runs in the capped (or native) process: prints one JSON line of rows."""
    import torch

    torch.set_num_threads(2)
    rows = []
    for p in precisions:
        specs = (
            [p] + [f"{p}+{o}" for o in options] + ([f"{p}+regional+fused"] if "regional" in options else [])
        )
        for r in ab(specs, reps, steps):
            r["precision"] = p
            rows.append(r)
    print("ROWS " + json.dumps({"rows": rows, "machine": machine()}), flush=True)


def summarize(rows: list[dict]) -> dict:
    """Per precision: baseline (the plain spec) and best (fastest median) with ratios."""
    out: dict[str, dict] = {}
    for p in sorted({r["precision"] for r in rows}):
        mine = [r for r in rows if r["precision"] == p]
        base = next(r for r in mine if r["variant"] == p)
        best = min(mine, key=lambda r: r["step_s_median"])

        def entry(r: dict) -> dict:
            opts = r["variant"].split("+")[1:]
            return {
                "variant": r["variant"],
                "settings": ", ".join(SETTINGS[o] for o in opts) or SETTINGS[""],
                "step_s": r["step_s_median"],
                "samples_per_s": round(r["batch"] / r["step_s_median"], 1),
                "first_step_s": r["first_step_s"],
            }

        out[p] = {"baseline": entry(base), "best": entry(best)}
        out[p]["best"]["ratio_vs_baseline"] = round(base["step_s_median"] / best["step_s_median"], 3)
        for r in mine:
            r["ratio_vs_baseline"] = round(base["step_s_median"] / r["step_s_median"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="", help="comma list of avx2, avx512_bf16 (default: native + avx2)")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument(
        "--options", default=",".join(OPTIONS), help=f"variants to time beside the baseline: {OPTIONS}"
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--note", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    precisions = [p for p in args.precisions.split(",") if p]
    options = [o for o in args.options.split(",") if o]
    if args.child:
        return child(precisions, options, args.reps, args.steps)
    native = native_kind()
    kinds = [k for k in (args.kinds or ",".join(dict.fromkeys([native, "avx2"]))).split(",") if k]
    path = Path(__file__).parent / "results" / "train_cpu.json"
    results: dict = json.loads(path.read_text()) if path.exists() else {}  # runs merge per kind + precision
    results = {k: results.get(k, {}) for k in ("kinds", "machines", "previous")} | {
        "rows": results.get("rows", [])
    }
    for kind in kinds:
        if kind not in ("avx2", "avx512_bf16") or (kind == "avx512_bf16" and native != kind):
            raise SystemExit(f"cannot run kind {kind!r} on this {native} machine")
        old = results["machines"].get(kind, {})
        if kind == native and old.get("ONEDNN_MAX_CPU_ISA"):
            # A native run replaces figures measured under the ISA cap; those are kept beside it.
            results["previous"][f"{kind}_capped"] = {
                "kinds": results["kinds"].pop(kind, {}),
                "machine": old,
                "rows": [r for r in results["rows"] if r["kind"] == kind],
            }
            results["rows"] = [r for r in results["rows"] if r["kind"] != kind]
        env = {**os.environ, **(CAP if kind != native else {})}
        # One Inductor cache per kind: with one cache shared by capped and native runs, a compiled
        # step crashed with heap corruption here ("double free or corruption"); a fresh one ran.
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", f"/tmp/vla_inductor_{kind}")
        cmd = [sys.executable, __file__, "--child", "--precisions", ",".join(precisions),
               "--options", ",".join(options), "--reps", str(args.reps), "--steps", str(args.steps)]  # fmt: skip
        print(f"== {kind}: {' '.join(cmd[2:])}", flush=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        sys.stdout.write("".join(ln + "\n" for ln in proc.stdout.splitlines() if not ln.startswith("ROWS ")))
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ROWS ")), None)
        if proc.returncode or line is None:
            raise SystemExit(f"{kind} run failed:\n{proc.stderr[-3000:]}")
        data = json.loads(line[5:])
        for r in data["rows"]:
            r["kind"] = kind
        results["rows"] = [r for r in results["rows"] if (r["kind"], r["precision"]) not in
                           {(kind, p) for p in precisions}] + data["rows"]  # fmt: skip
        results["machines"][kind] = data["machine"]
        results["kinds"].setdefault(kind, {}).update(summarize(data["rows"]))
        print_table(data["rows"], ["kind", "variant", "step_s_median", "cpu_s_per_step_median", "ratio_vs_baseline",
                                   "first_step_s"])  # fmt: skip
    results["notes"] = (
        "batch 32, demo model (tiny + demo recipe), synthetic batches, 2 intra-op threads unless threads1; "
        "interleaved medians; avx2 = this machine capped with ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2. "
        + args.note
    ).strip()
    results.pop("environment", None)
    print("wrote", write_results("train_cpu", results))


if __name__ == "__main__":
    main()
