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
