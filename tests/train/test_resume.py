"""Checkpoints: bit-exact resume, atomic layout, keep-last, refusal of incompatible resumes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import FakeDataset, tiny_cfg

from vlastack.models.vla import VLA
from vlastack.train import checkpoint as ck
from vlastack.train.logs import read_metrics
from vlastack.train.trainer import Trainer

OV = ("train.steps=6", "train.save_every=2", "train.keep_last=2", "train.ema_decay=0.9", "train.preload=true")


def _losses(run):
    return [r["train/loss"] for r in read_metrics(run / "metrics.jsonl")]


def test_resume_is_bit_exact(tmp_path):
    cfg = tiny_cfg(*OV)
    ds = FakeDataset(cfg, n=24)  # 6 micro-batches of 4 per epoch: the run crosses an epoch
    a, b = tmp_path / "a", tmp_path / "b"
    full = Trainer(cfg, run_dir=a, dataset=ds).fit()
    Trainer(cfg, run_dir=b, dataset=ds).fit(stop_after=3)  # "killed" after step 3 (saved at 3)
    assert ck.latest_checkpoint(b).name == "step_0000003"
    rest = Trainer(cfg, run_dir=b, dataset=ds, resume=True).fit()
    assert rest["steps"] == 6 and len(rest["losses"]) == 3
    assert _losses(a) == _losses(b) == full["losses"]  # identical loss sequence, floats compared exactly
    for sub in ("", "ema/"):
        wa, wb = (
            load_file(str(a / "final" / sub / "model.safetensors")),
            load_file(str(b / "final" / sub / "model.safetensors")),
        )
        assert wa.keys() == wb.keys()
        assert all(torch.equal(wa[k], wb[k]) for k in wa), sub
    # the weights did change, and the EMA differs from the raw weights
    w0 = load_file(str(a / "final" / "model.safetensors"))
    we = load_file(str(a / "final" / "ema" / "model.safetensors"))
    assert any(not torch.equal(w0[k], we[k]) for k in w0)


def test_resume_applies_changed_lr_and_weight_decay(tmp_path):
    """The saved optimizer and scheduler hold the lr the run started with; a resume that changes
    train.lr or train.weight_decay trains with the new values from its first step (it used to warn
    "changed settings" and keep the old lr)."""
    cfg = tiny_cfg(*OV, "train.warmup_steps=0")
    ds = FakeDataset(cfg, n=24)
    Trainer(cfg, run_dir=tmp_path, dataset=ds).fit(stop_after=2)
    new = tiny_cfg(*OV, "train.warmup_steps=0", f"train.lr={cfg.train.lr * 3}", "train.weight_decay=0.5")
    tr = Trainer(new, run_dir=tmp_path, dataset=ds, resume=True)
    fresh = Trainer(new, run_dir=tmp_path / "fresh", dataset=ds)
    fresh.scheduler.last_epoch = 2  # the uninterrupted schedule of the new settings at step 2
    expected = fresh.scheduler.get_lr()
    assert [g["lr"] for g in tr.optimizer.param_groups] == expected
    assert [g["weight_decay"] for g in tr.optimizer.param_groups] == [
        g["weight_decay"] for g in fresh.optimizer.param_groups
    ] and any(g["weight_decay"] == 0.5 for g in tr.optimizer.param_groups)
    assert tr.scheduler.base_lrs == [g["initial_lr"] for g in fresh.optimizer.param_groups]
    tr.fit()
    row = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 3)
    assert row["train/lr"] == expected[0]  # the first resumed step ran at the new lr


def test_checkpoint_layout_and_keep_last(tmp_path):
    cfg = tiny_cfg(*OV)
    Trainer(cfg, run_dir=tmp_path, dataset=FakeDataset(cfg)).fit()
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_0000004", "step_0000006"]
    assert (root / "latest").read_text().strip() == "step_0000006"
    c = root / "step_0000006"
    for f in (
        "model.safetensors",
        "config.json",
        "config.yaml",
        "ema/model.safetensors",
        "train_state/state.json",
    ):
        assert (c / f).exists(), f
    state = json.loads((c / "train_state" / "state.json").read_text())
    assert "__dict__" in state  # JSON skeleton, tensors live in safetensors
    assert not list(tmp_path.rglob(".tmp-*"))
    m = VLA.from_pretrained(tmp_path / "final")  # the final policy folder loads without training code
    assert m.cfg == cfg.model
    assert (tmp_path / "loss_curve.png").stat().st_size > 0 and (tmp_path / "metrics.jsonl").exists()
    assert list((tmp_path / "tb").iterdir())


def test_incompatible_resume_is_refused(tmp_path):
    cfg = tiny_cfg(*OV)
    Trainer(cfg, run_dir=tmp_path, dataset=FakeDataset(cfg)).fit(stop_after=2)
    other = tiny_cfg(*OV, "model.vlm.depth=2", "model.expert.depth=2")
    with pytest.raises(ValueError, match=r"model\.vlm\.depth is 1 in the checkpoint but 2 now"):
        Trainer(other, run_dir=tmp_path, dataset=FakeDataset(other), resume=True)
    with pytest.raises(ValueError, match="EMA is on in one run and off"):
        Trainer(tiny_cfg(*OV, "train.ema_decay=0"), run_dir=tmp_path, dataset=FakeDataset(cfg), resume=True)
    with pytest.raises(ValueError, match="no checkpoint"):
        Trainer(cfg, run_dir=tmp_path / "empty", dataset=FakeDataset(cfg), resume=True)
