"""Issue #65: a new head is one folder plus one registry entry. The mixture-density head of
``tests/models/mdn_head/`` (written against docs/adding-a-head.md, nothing edited outside it) is
registered here as the one entry, then trained, saved, loaded, served and refused what it lacks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.mdn_head import MDNOptions
from tests.train.train_helpers import FakeDataset, tiny_cfg
from vlastack.config import HEAD_SPECS, HeadSpec

MDN_SPEC = HeadSpec(cls="tests.models.mdn_head:MDNHead", options_cls=MDNOptions)


@pytest.fixture
def mdn(monkeypatch):
    monkeypatch.setitem(HEAD_SPECS, "mdn", MDN_SPEC)  # the one registry entry


def test_a_head_in_its_own_folder_trains_serves_and_reloads(mdn, tmp_path):
    from vlastack.infer.policy import Policy
    from vlastack.train.trainer import Trainer

    cfg = tiny_cfg(
        "model.head=mdn", "model.head_options.components=3", "train.steps=3", "train.save_every=100"
    )
    assert cfg.model.head_options == MDNOptions(components=3)
    out = Trainer(cfg, run_dir=tmp_path, dataset=FakeDataset(cfg)).fit()
    assert np.isfinite(out["losses"]).all()
    policy = Policy.from_pretrained(tmp_path / "final", seed=0)
    assert policy.cfg == cfg.model  # its options survived config.json
    s = cfg.model.vision.image_size
    obs = {
        "images": {cfg.model.camera_names[0]: np.zeros((s, s, 3), np.uint8)},
        "state": np.zeros(cfg.model.state_dim, np.float32),
        "prompt": "pick up the red cube",
    }
    assert policy.infer(obs)["actions"].shape == (cfg.model.action_horizon, policy.action_dim)
    assert policy.metadata["rtc_methods"] == []  # what it lacks is refused, not silently skipped
    with pytest.raises(ValueError, match="does not take 'fast'"):
        Policy.from_pretrained(tmp_path / "final", fast=True)
    with pytest.raises(ValueError, match="needs a head that denoises"):
        policy.infer(
            {**obs, "action_prefix": np.zeros((2, policy.action_dim), np.float32), "inference_delay": 1}
        )
    with pytest.raises(ValueError, match="components"):
        tiny_cfg("model.head=mdn", "model.head_options.components=0")
