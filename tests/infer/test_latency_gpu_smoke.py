"""bench/latency_gpu.py --smoke: the GPU bench's code paths on the CPU with tiny shapes (no figures).
Slow: ~45 s of CPU (eager baseline, fast path, graph fallback, breakdown, profiler, training + LoRA)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_latency_gpu_smoke(tmp_path):
    out = tmp_path / "smoke.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "latency_gpu.py"),
        "--smoke",
        "--parts",
        "infer,train",
    ]
    cmd += ["--repeats", "1", "--train-steps", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=600)
    data = json.loads(out.read_text())
    assert data["smoke"] is True
    sec = data["sections"]
    for preset in ("pi0", "pi05"):
        rows = sec[f"infer/{preset}"]
        assert {"eager_autocast_fp32_weights_b1", "fast-eager_b1", "fast-graph_b1", "fast-graph_b2"} <= set(
            rows
        )
        assert "policy" in rows["fast-graph_b1"] and "breakdown" in rows["fast-graph_b1"]
    assert {"full", "lora"} <= set(sec["train/pi0"])
    assert data["skipped"] == {}
