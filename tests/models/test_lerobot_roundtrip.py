"""Issue #36 item 6: `vla export-lerobot` then `vla import` rebuilds the same model offline with no
overrides (head counts and the byte tokenizer travel in ``vlastack_config.json``), and importing
weights whose shapes are not the standard ones says what head counts it assumed."""

from __future__ import annotations

import pytest
import torch

from vlastack.config import load_config
from vlastack.infer.export_lerobot import export_lerobot
from vlastack.infer.external import import_checkpoint
from vlastack.models.convert.lerobot import VLASTACK_SIDECAR
from vlastack.models.vla import VLA, build_model

MICRO = ["model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1"]


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_export_lerobot_then_import_is_the_same_model(tmp_path, variant):
    torch.manual_seed(0)
    cfg = load_config("tiny", overrides=[*MICRO, f"model.variant={variant}"]).model
    assert cfg.vision.heads == 4 and cfg.vlm.heads == 4  # not So400m's 16, not gemma_2b's 8
    build_model(cfg).save_pretrained(tmp_path / "policy")
    exported = export_lerobot(tmp_path / "policy", tmp_path / "lerobot")
    assert (exported / VLASTACK_SIDECAR).exists() and not (exported / "tokenizer.model").exists()
    back = VLA.from_pretrained(import_checkpoint(exported, tmp_path / "back"))
    ours = VLA.from_pretrained(tmp_path / "policy")
    assert (
        back.cfg.vision == ours.cfg.vision
        and back.cfg.vlm == ours.cfg.vlm
        and back.cfg.expert == ours.cfg.expert
    )
    assert back.cfg.tokenizer == "byte"
    for k, v in ours.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v, rtol=0, atol=0, msg=k)
    # Without the sidecar the head counts are guesses from the variant names: said, not silent.
    (exported / VLASTACK_SIDECAR).unlink()
    from vlastack.models.convert.lerobot import config_from_checkpoint

    with pytest.warns(UserWarning, match=r"assumed SigLIP heads=16.*vlm heads=8"):
        config_from_checkpoint(exported)
    import warnings

    with warnings.catch_warnings(record=True) as rec:  # head counts given: nothing left to guess
        warnings.simplefilter("always")
        given = ["vision.heads=4", "vlm.heads=4", "vlm.head_dim=32", "expert.heads=4", "expert.head_dim=32"]
        guessed, _, _ = config_from_checkpoint(exported, given)
    assert guessed.vision.heads == 4 and guessed.vlm.head_dim == 32 and not rec


def test_policy_loading_detects_the_format_once_and_reads_each_part_once(tmp_path, monkeypatch):
    """Issue #36 item 7: ``Policy.from_pretrained`` detects the format once, then one reader per
    format builds the config, weights, pipeline and tokenizer, each once (the config used to be
    derived twice and the format detected twice)."""
    from pathlib import Path

    import vlastack.infer.external as ext
    import vlastack.models.convert.lerobot as lr
    from vlastack.infer.policy import Policy

    calls: dict[str, int] = {}

    def counting(mod, name):
        real = getattr(mod, name)

        def wrapper(*a, **k):
            calls[name] = calls.get(name, 0) + 1
            return real(*a, **k)

        monkeypatch.setattr(mod, name, wrapper)

    for name in ("detect_format", "config_from_checkpoint", "build_from_checkpoint", "resolve_checkpoint"):
        counting(ext, name)
    counting(lr, "read_folder_header")
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "pi0"
    import json

    Policy.from_pretrained(
        fixture, overrides=tuple(json.loads((fixture / "io.json").read_text())["overrides"])
    )
    assert calls == {"resolve_checkpoint": 1, "detect_format": 1, "config_from_checkpoint": 1,
                     "build_from_checkpoint": 1}, calls  # fmt: skip
    calls.clear()
    torch.manual_seed(0)
    build_model(load_config("tiny", overrides=MICRO).model).save_pretrained(tmp_path / "p")
    Policy.from_pretrained(tmp_path / "p")
    assert calls == {"resolve_checkpoint": 1, "detect_format": 1}, calls
