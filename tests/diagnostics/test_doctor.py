"""vla doctor on seeded faults: a slow loader (data-bound), a .item() in the loop (syncs located),
and the report files; a slow test opens report.html in headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.diagnostics.helpers import MICRO, SlowDataset, micro_cfg
from vlastack.cli import main
from vlastack.diagnostics import steptime
from vlastack.diagnostics.doctor import DoctorOptions, run_doctor

QUICK = DoctorOptions(steps=3, warmup=1, profile_steps=1)


def test_slow_loader_with_no_workers_is_data_bound(tmp_path):
    cfg = micro_cfg()
    ds = SlowDataset(cfg, delay=0.1)  # 0.4 s per batch of 4, decoded in the training process
    r = run_doctor(cfg, tmp_path, QUICK, dataset=ds, log=lambda s: None)
    assert r["bottleneck"] == "data-bound", r["evidence"]
    assert r["data_wait_fraction"] > 0.25
    recs = {x["id"]: x for x in r["recommendations"]}
    assert recs["num_workers"]["applies"] and recs["num_workers"]["overrides"][0].startswith(
        "data.num_workers="
    )
    assert recs["preload"]["applies"]


def _sync_every_step(trainer):
    """Seeded fault: a forward hook that reads a value back to the host every step."""

    def log_activation(mod, args, out):
        log_activation.last = out.abs().mean().item()  # the sync the doctor must find

    trainer.model.projector.register_forward_hook(log_activation)


def test_item_in_the_loop_is_found_and_located(tmp_path):
    cfg = micro_cfg()
    r = run_doctor(cfg, tmp_path, QUICK, prepare=_sync_every_step, log=lambda s: None)
    locs = r["profiled"]["host_syncs"]["locations"]
    mine = [x for x in locs if x["where"].startswith("tests/diagnostics/test_doctor.py")]
    assert len(mine) == 1 and mine[0]["count_per_step"] == 1, locs
    assert ".item()" in mine[0]["code"] and "log_activation" in mine[0]["where"]
    assert r["host_syncs_per_step"] >= 2  # + the training step's own loss read
    rec = next(x for x in r["recommendations"] if x["id"] == "host_syncs")
    assert rec["applies"] and "test_doctor.py" in rec["why"]

    # the report files, and the documented keys of report.json
    for f in ("report.json", "report.html", "trace.json"):
        assert (tmp_path / f).stat().st_size > 0
    data = json.loads((tmp_path / "report.json").read_text())
    for key in ("bottleneck", "step_time_s", "data_wait_fraction", "kernels_per_step", "memory", "recommendations",
                "breakdown_s", "host_syncs_per_step", "gpu_busy_fraction"):  # fmt: skip
        assert key in data
    assert data["gpu_busy_fraction"] is None  # n/a on CPU, not faked
    cats = data["memory"]["categories"]
    assert cats["parameters"] > 0 and cats["optimizer_state"] > 0
    assert sum(cats.values()) == data["memory"]["peak_bytes"]
    assert abs(data["plan_check"]["error"]) <= 0.10
    html = (tmp_path / "report.html").read_text()
    assert html.count("<svg") == 3 and "log_activation" in html
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def test_step_split_by_model_part(tmp_path):
    """The split by part follows the compute: a 4-layer 64 px vision tower over a 1-layer decoder
    is the largest part, backward included; the parts and the rest add up to the step."""
    cfg = micro_cfg("model.vision.depth=4", "model.vision.image_size=64")
    r = run_doctor(cfg, tmp_path, QUICK, log=lambda s: None)
    parts = r["parts_s"]
    for p in (*steptime.PARTS, "optimizer", "data", "python_and_other"):
        assert p in parts and parts[p] >= 0, parts
    model_parts = {k: parts[k] for k in steptime.PARTS}
    assert max(model_parts, key=model_parts.get) == "vision_encoder", parts
    assert parts["vlm_decoder"] > 0 and parts["action_expert"] > 0 and parts["joint_attention"] > 0
    assert sum(parts.values()) == pytest.approx(r["step_time_s"], rel=0.02)
    # forward and backward both counted: the parts cover most of the forward + backward phases
    fwd_bwd = r["breakdown_s"]["forward"] + r["breakdown_s"]["backward"]
    assert sum(model_parts.values()) > 0.6 * fwd_bwd, (parts, r["breakdown_s"])


def test_diverging_gradients_are_reported(tmp_path):
    """Issue #34 item 14: with train.lr=1e6 the activations stay finite while every gradient after
    the first step is non-finite; the doctor names the step, the first module in backward order
    and the learning rate to change."""
    cfg = micro_cfg("train.lr=1e6")
    r = run_doctor(cfg, tmp_path, QUICK, log=lambda s: None)
    h = r["training_health"]
    assert h["diverging"] and h["first_nonfinite_step"]["step"] <= 3, h
    assert h["nonfinite_steps"] >= h["steps"] - 2
    n = r["numerics"]  # inspected automatically once the run diverges
    assert n["first_nonfinite_grad"] and n["modules_nonfinite_grad"] > n["modules_with_grad"] // 2
    rec = next(x for x in r["recommendations"] if x["id"] == "diverging")
    assert rec["applies"] and rec["overrides"] == ["train.lr=0.001"] and "train.lr=1e+06" in rec["expected"]
    ok = run_doctor(micro_cfg(), tmp_path / "ok", QUICK, log=lambda s: None)
    assert not ok["training_health"]["diverging"] and "numerics" not in ok


def test_part_of_module_names():
    p = steptime.part_of_module
    assert p("vision.layers.0.mlp.fc1") == p("projector") == "vision_encoder"
    assert p("decoder.layers.1.expert.mlp.up_proj") == p("decoder.expert_norm") == "action_expert"
    assert p("decoder.layers.1.vlm.self_attn.q_proj") == p("decoder.embed_tokens") == "vlm_decoder"
    assert p("decoder.layers.1") == p("decoder.rope") == "joint_attention"
    assert p("") == p("head.action_in_proj") == p("head.grounding.norm") == "head_and_loss"


def test_vla_doctor_cli_with_infer_and_numerics(tmp_path, capsys):
    out = tmp_path / "doc"
    args = ["doctor", "--out", str(out), "--steps", "2", "--warmup", "1", "--profile-steps", "1"]
    assert main([*args, "--infer", "--numerics", *MICRO]) == 0
    text = capsys.readouterr().out
    assert "bottleneck:" in text and "inference:" in text and "numerics: all activations finite" in text
    r = json.loads((out / "report.json").read_text())
    assert r["inference"]["latency_s"] > 0 and r["numerics"]["drift"]
    assert main(["doctor", "--steps", "0"]) == 2


@pytest.mark.slow
def test_try_reruns_the_applicable_fixes(tmp_path):
    cfg = micro_cfg()
    ds = SlowDataset(cfg, delay=0.25)
    opts = DoctorOptions(steps=4, warmup=1, profile_steps=1, try_recs=True)
    r = run_doctor(cfg, tmp_path, opts, dataset=ds, log=lambda s: None)
    tried = {t["id"]: t for t in r["tried"]}
    assert "preload" in tried and tried["preload"]["data_wait_fraction"] < r["data_wait_fraction"]


@pytest.mark.slow
def test_video_loader_with_no_workers_waits_on_data(tmp_path):
    """The real loader decoding 224x224 video in the training process, for a model that sees 16x16
    images: a large share of the step is data wait and more workers are recommended. (On the
    2-core test machine this measured ~27% data wait: at the data-bound threshold, so the
    assertion is on the share and the advice, not on the verdict.)"""
    from vlastack.sim.generate import generate

    data = tmp_path / "data"
    generate(data, episodes=3, workers=0, seed=0, image_size=224)
    r = run_doctor(micro_cfg(), tmp_path / "doc", QUICK, data=data, log=lambda s: None)
    assert r["data_wait_fraction"] > 0.1, r["evidence"]
    rec = next(x for x in r["recommendations"] if x["id"] == "num_workers")
    assert rec["applies"] and not r["synthetic_data"]


@pytest.mark.slow
def test_report_html_opens_in_headless_chromium(tmp_path):
    exe = next(
        (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None
    )
    if exe is None:
        pytest.skip("no Chromium (apt-get install -y chromium)")
    run_doctor(micro_cfg(), tmp_path, QUICK, log=lambda s: None)
    shot = tmp_path / "shot.png"
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1200,2400",
           (tmp_path / "report.html").as_uri()]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000
    dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          (tmp_path / "report.html").as_uri()], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "vla doctor" in dom.stdout and dom.stdout.count("<svg") == 3
