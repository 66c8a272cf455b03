"""bench/latency_gpu.py --smoke: the GPU bench's code paths on the CPU with tiny shapes (no figures).
Slow: ~70 s of CPU (eager baseline, fast path, graph fallback, breakdown, profiler, training + LoRA,
the pi05_lora_24gb recipe, vla serve --fast against Policy.infer with the openpi client)."""

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
        "infer,train,recipe24,serve",
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
    assert sec["train/pi05_lora_24gb"]["b2"]["samples_per_s"] > 0
    served = sec["serve/pi0"]["b1"]
    assert {"serve_p50_ms", "policy_p50_ms", "overhead_ms", "policy_rtc_inference_p50_ms"} <= set(served)
    assert data["skipped"] == {}


@pytest.mark.slow
def test_latency_gpu_compile_variants_smoke(tmp_path):
    """``--parts compile --compile-variants layers,default`` (~20 s of CPU): one row per variant,
    each checked against the uncompiled static function on the same inputs."""
    out = tmp_path / "compile.json"
    cmd = [sys.executable, str(ROOT / "bench" / "latency_gpu.py"), "--smoke", "--parts", "compile"]
    cmd += ["--presets", "pi0", "--compile-variants", "layers,default", "--repeats", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=600)
    data = json.loads(out.read_text())
    rows = data["sections"]["infer/pi0"]
    for name in ("fast-compile-layers-graph_b1", "fast-compile-graph_b1"):
        assert rows[name]["rel_err_vs_fast_eager"] < 1e-4, rows[name]
    assert data["skipped"] == {}
