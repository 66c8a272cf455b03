"""Export checks and artifact latency: every format vs eager PyTorch on unseen random inputs.

    python bench/export.py                          # tiny preset, all three formats
    python bench/export.py --formats onnx torchscript --overrides model.vlm.depth=1 model.expert.depth=1

For each format: export time, max |artifact - eager| (tolerance 1e-4, fp32), and p50/p90 latency of
the artifact next to eager ``sample_actions`` at batch 1. Writes bench/results/export.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, print_table, time_fn, write_results
from vlastack.config import load_config
from vlastack.infer.export import FORMATS, ExportedSampler, _run_artifact, example_inputs, export_policy
from vlastack.infer.policy import Policy
from vlastack.models import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--overrides", nargs="*", default=[])
    ap.add_argument("--formats", nargs="*", default=list(FORMATS))
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    cfg = load_config(args.preset, overrides=args.overrides)
    torch.manual_seed(0)
    policy = Policy(build_model(cfg.model))
    inputs = example_inputs(policy, 1, seed=1)
    module = ExportedSampler(policy).eval()
    with torch.inference_mode():
        eager_ms = time_fn(lambda: module(*inputs), "cpu", warmup=2, repeats=args.repeats)
    rows = [
        {
            "format": "eager",
            "max_abs_diff": 0.0,
            "export_s": 0.0,
            "p50_ms": round(percentile(eager_ms, 50), 2),
            "p90_ms": round(percentile(eager_ms, 90), 2),
        }
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats:
            side = export_policy(policy, fmt, Path(tmp) / fmt)
            path = Path(tmp) / fmt / side["artifact"]
            if fmt == "pt2":
                runner = torch._inductor.aoti_load_package(str(path))
                call = lambda r=runner: r(*inputs)  # noqa: E731
            else:
                call = lambda f=fmt, p=path: _run_artifact(f, p, inputs)  # noqa: E731 (includes session load for onnx)
                if fmt == "onnx":
                    import onnxruntime as ort

                    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), inputs)}
                    call = lambda s=sess, f=feeds: s.run(None, f)  # noqa: E731
                elif fmt == "torchscript":
                    ts = torch.jit.load(str(path))
                    call = lambda m=ts: m(*inputs)  # noqa: E731
            with torch.inference_mode():
                ms = time_fn(call, "cpu", warmup=2, repeats=args.repeats)
            rows.append(
                {
                    "format": fmt,
                    "max_abs_diff": side["check"]["max_abs_diff"],
                    "export_s": round(side["check"]["export_seconds"], 1),
                    "p50_ms": round(percentile(ms, 50), 2),
                    "p90_ms": round(percentile(ms, 90), 2),
                }
            )
            print_table(rows[-1:], list(rows[-1]))
    print()
    print_table(rows, ["format", "max_abs_diff", "export_s", "p50_ms", "p90_ms"])
    path = write_results(
        "export", {"preset": args.preset, "overrides": args.overrides, "tolerance": 1e-4, "rows": rows}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
