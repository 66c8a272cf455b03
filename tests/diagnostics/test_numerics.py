"""Numerics: the first module that produces a NaN is named; bf16 drift; the training anomaly guard."""

from __future__ import annotations

import json

import pytest
import torch

from tests.diagnostics.helpers import SlowDataset, micro_cfg
from vlastack.batch import dummy_batch
from vlastack.diagnostics.numerics import (
    AnomalyDetected,
    NumericsInspector,
    anomaly_stop,
    inspect,
    tensor_stats,
)
from vlastack.models.vla import build_model

LAYER = "decoder.layers.0.expert.mlp"  # (the last VLM block's MLP never runs in the flow loss)


def _poison(model, name=LAYER):
    """Seeded fault: one NaN in the weights of one layer."""
    mod = model.get_submodule(name)
    p = next(p for p in mod.parameters() if p.ndim == 2)
    with torch.no_grad():
        p.view(-1)[0] = float("nan")
    return mod


def test_stats_ignore_non_finite_values_and_count_them():
    s = tensor_stats(torch.tensor([1.0, 3.0, float("nan"), float("inf")]))
    assert s["mean"] == 2.0 and s["max_abs"] == 3.0 and s["nonfinite"] == 0.5


def test_injected_nan_names_its_layer():
    cfg = micro_cfg()
    model = build_model(cfg.model)
    names = [n for n, _ in model.named_modules()]
    assert any(n.startswith(LAYER) for n in names), names[:40]
    _poison(model)
    r = inspect(model, dummy_batch(cfg.model, 2), drift=False)
    first = r["first_nonfinite"]
    assert first["module"].startswith(LAYER), first["module"]
    assert all(s["nonfinite"] == 0 for s in first["inputs"])  # it was born there
    assert any(p["nonfinite"] > 0 for p in first["parameters"])
    assert r["loss"] != r["loss"]  # NaN


def test_healthy_model_is_finite_with_grads_and_small_bf16_drift():
    cfg = micro_cfg()
    model = build_model(cfg.model)
    r = inspect(model, dummy_batch(cfg.model, 2))
    assert r["first_nonfinite"] is None
    rows = {x["module"]: x for x in r["modules"]}
    assert rows["projector"]["grad"] is not None and rows["projector"]["forward"]["std"] > 0
    drift = {d["module"]: d["rel_error"] for d in r["drift"]}
    assert "loss" in drift and any(k.startswith("decoder.layers.") for k in drift)
    assert all(0 <= v < 0.2 for v in drift.values()), drift
    assert all(p.grad is None for p in model.parameters())  # gradients cleared


def test_inspector_removes_its_hooks():
    cfg = micro_cfg()
    model = build_model(cfg.model)
    with NumericsInspector(model):
        pass
    assert not any(m._forward_hooks for m in model.modules())


def test_anomaly_guard_stops_with_step_module_and_batch(tmp_path):
    from vlastack.train.trainer import Trainer

    cfg = micro_cfg("train.anomaly_guard=true", "train.steps=6", "train.save_every=2", "train.log_every=1")
    with pytest.raises(ValueError, match="anomaly_guard=true needs its handler"):
        Trainer(cfg, run_dir=tmp_path / "x", dataset=SlowDataset(cfg), verbose=False)
    tr = Trainer(cfg, run_dir=tmp_path, dataset=SlowDataset(cfg), verbose=False, on_anomaly=anomaly_stop)

    def poison_at_step_3(mod, args):
        if tr.step == 2:  # steps 1-2 are good (checkpointed at 2); step 3 goes bad
            _poison(tr.model)

    tr.model.decoder.register_forward_pre_hook(poison_at_step_3)
    with pytest.raises(AnomalyDetected, match="step 3") as e:
        tr.fit()
    info = e.value.info
    assert info["module"].startswith(LAYER) and info["reproduced"]
    assert info["batch_position"] == 2 and info["last_good_checkpoint"].endswith("step_0000002")
    assert (tmp_path / "anomaly" / "batch.safetensors").exists()
    assert json.loads((tmp_path / "anomaly" / "report.json").read_text())["step"] == 3
    assert LAYER in str(e.value)
