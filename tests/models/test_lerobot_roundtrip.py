"""Issue #36 item 6: `vla export-lerobot` then `vla import` rebuilds the same model offline with no
overrides (head counts and the byte tokenizer travel in ``vlastack_config.json``), and importing
weights whose shapes are not the standard ones says what head counts it assumed."""

from __future__ import annotations

import pytest
import torch

from vlastack.config import load_config
from vlastack.infer.export_lerobot import export_lerobot
from vlastack.infer.importer import import_checkpoint
from vlastack.models.convert.lerobot import VLASTACK_SIDECAR
from vlastack.models.vla import VLA, build_model

MICRO = ["model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1"]


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_export_lerobot_then_import_is_the_same_model(tmp_path, variant):
    torch.manual_seed(0)
    # A policy trained on absolute targets says so after the round trip (issue 38): its chunks must
    # not run as deltas once it has been through LeRobot's format.
    rep = "absolute" if variant == "pi0" else "delta"
    cfg = load_config(
        "tiny",
        overrides=[*MICRO, f"model.head_options.variant={variant}", f"model.action_representation={rep}"],
    ).model
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
    assert back.cfg.tokenizer == "byte" and back.cfg.action_representation == rep
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


def test_a_recap_policy_does_not_export_without_its_indicator(tmp_path):
    cfg = load_config(
        "tiny", overrides=[*MICRO, "model.advantage_conditioning=true", "model.max_text_len=45"]
    )
    build_model(cfg.model).save_pretrained(tmp_path / "policy")
    with pytest.raises(ValueError, match="Advantage: positive"):
        export_lerobot(tmp_path / "policy", tmp_path / "lerobot")
    assert not (tmp_path / "lerobot").exists()


@pytest.mark.parametrize("fmt", ["pi0", "pi05", "pi0_fast", "vlastack"])
def test_policy_loading_reads_each_file_of_the_folder_once(tmp_path, monkeypatch, fmt):
    """Issue #36: the loader walk enters each room once. ``Policy.from_pretrained`` locates the
    folder once (resolved, config.json read, format detected), then its format's reader derives the
    config, pipeline, tokenizers and weights, and every file is opened once: config.json used to be
    read twice, pi0_fast's FAST processor twice, and model.safetensors once per tensor."""
    import builtins
    import io
    import json
    import os
    from collections import Counter
    from pathlib import Path

    import vlastack.infer.readers as ext
    from vlastack.infer.policy import Policy

    if fmt == "vlastack":
        torch.manual_seed(0)
        folder = tmp_path / "p"
        build_model(load_config("tiny", overrides=MICRO).model).save_pretrained(folder)
        overrides: tuple[str, ...] = ()
    else:
        folder = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / fmt
        overrides = tuple(json.loads((folder / "io.json").read_text()).get("overrides", []))
    opened: Counter = Counter()
    real_open, real_os_open = io.open, os.open

    def counting_open(file, *a, **k):
        opened[Path(file).resolve()] += 1
        return real_open(file, *a, **k)

    def counting_os_open(file, *a, **k):
        opened[Path(file).resolve()] += 1
        return real_os_open(file, *a, **k)

    located = []
    real_locate = ext.locate
    monkeypatch.setattr(ext, "locate", lambda p: located.append(p) or real_locate(p))
    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(os, "open", counting_os_open)
    Policy.from_pretrained(folder, overrides=overrides)
    monkeypatch.undo()
    mine = {p.relative_to(folder.resolve()).as_posix(): n for p, n in opened.items()
            if p.is_relative_to(folder.resolve())}  # fmt: skip
    assert len(located) == 1
    assert "config.json" in mine and any(k.endswith(".safetensors") for k in mine), mine
    # an imported model.safetensors: its header, then one descriptor shared by every tensor read
    at_most = {"model.safetensors": 2}
    assert {k: n for k, n in mine.items() if n > at_most.get(k, 1)} == {}, mine
