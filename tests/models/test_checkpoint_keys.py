"""Checkpoints written before the backbone/heads split still load: every head variant's state-dict
keys, their order and shapes, and which parameters are frozen equal the ones recorded from the
code at 8a28ae9 (tests/models/data/state_dict_keys.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vlastack.config import load_config
from vlastack.models import VLA

GOLDEN = json.loads((Path(__file__).parent / "data" / "state_dict_keys.json").read_text())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_state_dict_keys_unchanged(name):
    g = GOLDEN[name]
    with torch.device("meta"):
        m = VLA(load_config("tiny", overrides=g["overrides"]).model)
    keys = [f"{k} {'x'.join(map(str, v.shape))}" for k, v in m.state_dict().items()]
    assert keys == g["keys"]
    assert sorted(n for n, p in m.named_parameters() if not p.requires_grad) == g["frozen"]
