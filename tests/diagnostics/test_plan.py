"""vla plan: predictions on fake tensors match real CPU runs; budgets, fixes and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from tests.diagnostics.helpers import micro_cfg
from vlastack.cli import main
from vlastack.diagnostics.memory import fmt_bytes, parse_bytes
from vlastack.diagnostics.plan import derive, measure, plan, simulate


@pytest.mark.parametrize(
    "overrides,mode",
    [
        (("train.precision=bf16", "train.activation_checkpointing=true"), "train"),
        ((), "infer"),
        pytest.param((), "train", marks=pytest.mark.slow),
        pytest.param(("train.lora_rank=4",), "train", marks=pytest.mark.slow),
    ],
)
def test_prediction_matches_the_cpu_allocator(overrides, mode):
    cfg = micro_cfg(*overrides)
    pred = simulate(cfg, 4, mode)
    real = measure(cfg, 4, mode)
    assert abs(pred["peak_bytes"] / real["allocator_peak_bytes"] - 1) <= 0.10
    cats = pred["categories"]
    n_params = sum(p.numel() for p in _model(cfg).parameters())
    assert cats["parameters"] >= 4 * n_params  # fp32 weights (+ buffers)
    if mode == "train":
        assert cats["optimizer_state"] > 0


def test_cuda_target_simulates_the_fused_optimizer():
    """``--target cuda`` plans the fused AdamW a GPU runs: no full-size temporaries in the step, so
    a lower peak where the optimizer step is the peak (pi0 at batch 8: 47.0 GiB vs foreach's 54.0;
    an H100 measured 47.4). Fused AdamW also runs on the CPU, so the prediction is checked there."""
    cfg = micro_cfg()
    cpu, cuda = simulate(cfg, 4, target="cpu"), simulate(cfg, 4, target="cuda")
    assert cuda["peak_bytes"] < cpu["peak_bytes"]
    real = measure(cfg, 4, target="cuda")
    assert abs(cuda["peak_bytes"] / real["allocator_peak_bytes"] - 1) <= 0.10
    with pytest.raises(ValueError, match="target"):
        simulate(cfg, 4, target="tpu")


@pytest.mark.slow
def test_pi05_24gb_recipe_plans_under_22gib():
    """The packaged 24 GB recipe on the full Pi0.5 shapes (~5 min on 2 cores): 17.5 GiB predicted
    (docs/gpu.md); the card's 24 GB leave room for the CUDA context and the caching allocator."""
    from vlastack.config import load_config

    cfg = load_config("pi05", "pi05_lora_24gb")
    pred = simulate(cfg, cfg.train.batch_size, target="cuda")
    assert pred["peak_bytes"] < 22 * 2**30


def _model(cfg):
    from vlastack.models.vla import build_model

    with torch.device("meta"):
        return build_model(cfg.model)


def test_simulation_allocates_nothing():
    cfg = micro_cfg("model.vision.image_size=64", "train.batch_size=64")
    from vlastack.diagnostics.memory import cpu_allocator_peak

    box = {}
    held = cpu_allocator_peak(lambda: box.update(r=simulate(cfg, 64)))
    assert box["r"]["peak_bytes"] > 50 * held  # the fake run holds (almost) no real memory


def test_derived_knobs_shrink_the_right_categories():
    cfg = micro_cfg()
    sim = simulate(cfg, 4)
    opt8 = derive(sim, cfg, optimizer_8bit=True)
    assert opt8["categories"]["optimizer_state"] < 0.3 * sim["categories"]["optimizer_state"]
    fsdp = derive(sim, cfg, fsdp=4)
    assert fsdp["categories"]["parameters"] == sim["categories"]["parameters"] // 4
    assert fsdp["categories"]["activations"] == sim["categories"]["activations"]


@pytest.mark.integration
def test_config_that_does_not_fit_gets_the_cheapest_fix():
    cfg = micro_cfg("train.batch_size=16", "model.vision.image_size=64")  # activations dominate
    base = simulate(cfg, 16)["peak_bytes"]
    p = plan(cfg, int(base * 0.85), infer=False)
    assert not p["fits"] and p["fix"] is not None
    assert p["fix"]["peak_bytes"] <= base * 0.85
    assert 1 <= p["largest_batch"] < 16
    # the fix is the first (cheapest) single change that fits
    fitting = [r["variant"] for r in p["train"][1:] if r["fits"]]
    assert p["fix"]["change"] == fitting[0]
    # nothing fits 64 KiB: no fix, exit status 1
    p = plan(cfg, 64 * 1024, infer=False)
    assert not p["fits"] and p["largest_batch"] == 0 and p["fix"] is None


def test_micro_batch_fix_keeps_the_effective_batch(monkeypatch):
    """Issue #34 item 15: with 61 samples fitting and an effective batch of 128 the fix is 32 x 4,
    not 61 x 3 = 183."""
    from vlastack.diagnostics import plan as plan_mod

    cfg = micro_cfg("train.batch_size=128")
    monkeypatch.setattr(plan_mod, "largest_batch", lambda *a, **k: 61)
    monkeypatch.setattr(plan_mod, "_predict", lambda c, v, b, cache, target="cpu": {"peak_bytes": b})
    fix = plan_mod.cheapest_fix(cfg, 10**9, [{"fits": False}], {})
    assert fix["overrides"] == ["train.batch_size=32", "train.grad_accum=4"] and fix["effective_batch"] == 128
    assert "same effective batch (128 = 32 x 4)" in fix["change"]


@pytest.mark.integration
def test_vla_plan_cli(capsys, tmp_path):
    args = ["plan", *micro_cfg_args(), "--batch-sizes", "1,2", "--json", str(tmp_path / "p.json")]
    assert main([*args, "--memory", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert "the config fits as it is" in out and "largest batch" in out and "inference peak" in out
    assert "CPU training process peak RSS" in out and "baseline" in out
    assert json.loads((tmp_path / "p.json").read_text())["fits"] is True
    assert main(["plan", "--memory", "lots"]) == 2


def micro_cfg_args():
    from tests.diagnostics.helpers import MICRO

    return MICRO


def test_parse_and_format_bytes():
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("24GB") == 24 * 10**9
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes(1000) == 1000
    with pytest.raises(ValueError, match="80GiB"):
        parse_bytes("eighty")
    assert fmt_bytes(3 * 2**30) == "3.00 GiB"


def test_process_rss_counts_baseline_prefetch_and_preload(monkeypatch):
    """Issue #34 item 15: the CPU process RSS is the tensor peak plus what a process holds besides
    tensors: the measured interpreter/library baseline, the batches the loader prefetches, and a
    preloaded dataset (once: it is filled in place)."""
    import vlastack.diagnostics.rss as rss
    from vlastack.config import load_config

    monkeypatch.setattr(rss, "_baseline_for", lambda cfg, data: 300)
    monkeypatch.setattr(rss, "sample_bytes", lambda cfg, data: (10, 7))
    cfg = load_config("tiny", overrides=["data.num_workers=2", "data.prefetch_factor=3"])
    cats = {"parameters": 100, "gradients": 50, "optimizer_state": 200, "activations": 600, "inputs": 5,
            "temporaries": 45}  # fmt: skip
    r = rss.predict_rss(cfg, cats)
    # what stays counts once; what every step allocates and frees, CHURN_SLACK times
    assert r["parts"] == {"baseline": 300, "persistent_tensors": 350, "transient_tensors": int(650 * rss.CHURN_SLACK),
                          "prefetched_batches": 2 * 3 * 5, "trainer_state": rss.TRAINER_STATE_BYTES,
                          "preloaded_data": 0}  # fmt: skip
    assert r["rss_bytes"] == sum(r["parts"].values())
    pre = load_config("tiny", overrides=["train.preload=true"])
    r = rss.predict_rss(pre, {"inputs": 5}, data="somewhere")
    assert r["parts"]["preloaded_data"] == 70 and r["parts"]["prefetched_batches"] == 0
    assert r["rss_bytes"] == 300 + 70 + int(5 * rss.CHURN_SLACK) + rss.TRAINER_STATE_BYTES  # filled in place
    assert "pass --data" in rss.predict_rss(pre, {"inputs": 5})["notes"][0]
    # glibc with a fixed mmap threshold gives freed big blocks back: no churn slack (measured 1.0)
    monkeypatch.setenv(rss.MMAP_THRESHOLD_ENV, "131072")
    r = rss.predict_rss(cfg, cats)
    assert r["parts"]["transient_tensors"] == 650 and rss.MMAP_THRESHOLD_ENV in r["notes"][0]


def test_process_rss_baseline_is_a_real_interpreter():
    from vlastack.diagnostics.rss import baseline_bytes

    assert 50 * 2**20 < baseline_bytes(threads=1) < 4 * 2**30


def test_cpu_peak_memory_is_the_process_own_not_its_launchers():
    """`train/peak_mem_mb` on CPU: ru_maxrss survives execve on Linux, so a run started from a big
    process reported its parent's peak; VmHWM belongs to the new address space."""
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("VmHWM is Linux's")
    ballast = torch.ones(600 * 2**20 // 4)  # the launcher holds 600 MiB more than the child will
    ballast.add_(1)
    code = "from vlastack.train.logs import peak_memory_mb; print(peak_memory_mb())"
    child = float(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    with open("/proc/self/status") as f:
        mine = next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) / 2**10
    assert child < mine - 400, (child, mine)
    del ballast


def test_auto_precision_plans_what_training_would_take(monkeypatch):
    """``train.precision=auto`` is planned as the precision the trainer would measure and take."""
    from vlastack.train import precision as prec

    monkeypatch.setattr(prec, "measure", lambda shapes: (1.0, 12.0))  # an AVX2-only CPU
    p = plan(micro_cfg("train.precision=auto"), infer=False)
    assert p["precision"] == "fp32"
    if not torch.cuda.is_available():
        assert prec.resolve_auto(micro_cfg("train.precision=auto"), "cuda")[0].train.precision == "bf16"
