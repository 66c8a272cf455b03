"""The policies kept in bench/results/policies/ (behind published rows, and the MT10 heads whose
test seeds are scored in later sessions) load from the repository alone and answer an observation:
a folder missing its tokenizer, norm stats or weights would only show hours into an evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vlastack.infer.policy import Policy

KEPT = Path(__file__).resolve().parents[2] / "bench" / "results" / "policies"
FOLDERS = sorted(p.parent for p in KEPT.rglob("model.safetensors"))


def test_every_kept_policy_is_found():
    names = {str(p.relative_to(KEPT)) for p in FOLDERS}
    assert {"mt10_hindsight_ema", "mt10_fast/final/ema", "mt10_oft/final/ema"} <= names


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(KEPT)))
def test_a_kept_policy_loads_and_answers(folder):
    policy = Policy.from_pretrained(folder, seed=0)
    meta = policy.metadata
    rng = np.random.default_rng(0)
    obs = {
        f"observation/{c}": rng.integers(0, 256, (480, 480, 3), dtype=np.uint8) for c in meta["camera_names"]
    }
    obs |= {"observation/state": np.zeros(meta["state_dim"], np.float32), "prompt": "Push the puck to a goal"}
    out = policy.infer(obs)
    assert out["actions"].shape == (meta["action_horizon"], meta["action_dim"])
    assert np.isfinite(out["actions"]).all()
    if (folder.parent.parent / "cpu_ledger.json").is_file():  # a run record: what `record` reads
        ledger = json.loads((folder.parent.parent / "cpu_ledger.json").read_text())
        assert ledger and all(r["rc"] == 0 for r in ledger)
        assert (folder.parent / "config.yaml").is_file() and (folder.parent / "train_seeds.json").is_file()
