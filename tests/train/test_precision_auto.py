"""``train.precision: auto``: measured once at start, recorded in the run, kept on resume."""

from __future__ import annotations

import re

import pytest
from train_helpers import FakeDataset, tiny_cfg

from vlastack.config import load_yaml
from vlastack.train import precision as prec
from vlastack.train.precision import resolve_auto
from vlastack.train.step import autocast_ctx
from vlastack.train.trainer import Trainer

OV = ("train.steps=4", "train.save_every=2", "train.precision=auto")


def _timer(bf16_over_fp32: float):
    return lambda shapes: (1.0, bf16_over_fp32)


@pytest.mark.parametrize(("ratio", "want"), [(0.4, "bf16"), (12.0, "fp32")])
def test_auto_takes_the_measured_precision(ratio, want):
    cfg, why = resolve_auto(tiny_cfg("train.precision=auto"), "cpu", timer=_timer(ratio))
    assert cfg.train.precision == want
    assert why.startswith(f"train.precision=auto -> {want}: ") and f"{ratio:.2f}x" in why
    # anything concrete is left alone and nothing is measured
    same, none = resolve_auto(tiny_cfg("train.precision=bf16"), "cpu", timer=pytest.fail)
    assert same.train.precision == "bf16" and none is None
    # a resumed run keeps what it trained in, whatever this CPU would pick
    kept, why = resolve_auto(tiny_cfg("train.precision=auto"), "cpu", previous="bf16", timer=pytest.fail)
    assert kept.train.precision == "bf16" and "resumed" in why


def test_unresolved_auto_is_refused_where_it_would_run():
    with pytest.raises(ValueError, match="resolve_auto"):
        autocast_ctx("cpu", "auto")
    with pytest.raises(ValueError, match=re.escape("must be fp32|bf16|fp16|auto, got 'fp8'")):
        tiny_cfg("train.precision=fp8")


def test_trainer_records_and_resumes_the_choice(tmp_path, monkeypatch):
    monkeypatch.setattr(prec, "measure", _timer(12.0))  # an AVX2-only CPU: fp32
    cfg = tiny_cfg(*OV)
    ds = FakeDataset(cfg, n=16)
    tr = Trainer(cfg, run_dir=tmp_path / "r", dataset=ds)
    assert tr.cfg.train.precision == "fp32" and "12.00x" in tr.precision_reason
    tr.fit(stop_after=2)
    assert load_yaml(tmp_path / "r" / "config.yaml").train.precision == "fp32"
    # Resumed on a CPU that would now pick bf16: the run continues in fp32, with no changed-settings warning.
    monkeypatch.setattr(prec, "measure", _timer(0.4))
    rest = Trainer(cfg, run_dir=tmp_path / "r", dataset=ds, resume=True)
    assert rest.cfg.train.precision == "fp32" and "resumed" in rest.precision_reason
    assert not any("changed settings" in w for w in rest.warnings)
    assert rest.fit()["steps"] == 4
    assert load_yaml(tmp_path / "r" / "final" / "config.yaml").train.precision == "fp32"
    # A fresh run on that CPU takes bf16.
    assert Trainer(cfg, run_dir=tmp_path / "s", dataset=ds).cfg.train.precision == "bf16"
