"""Parity with the real `lerobot` 0.6.1 ``pi0_fast`` on a tiny policy (no lerobot here).

tests/fixtures/lerobot/pi0_fast/ is a LeRobot ``pretrained_model`` folder (+ its FAST processor in
``fast_tokenizer/``) and what LeRobot produced from three raw observations: prompt tokens, the FAST
tokens of two target chunks, the greedily decoded token ids and the actions (written by
scripts/make_pi0_fast_fixture.py; see its docstring). Rows 0-1 were fitted, so they decode to
"Action: <FAST> |"; row 2 (an unseen prompt) decodes to a sequence that is not a full chunk, which
LeRobot pads (relaxed decoding) and vlastack flags invalid.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vlastack.infer.importer import import_checkpoint
from vlastack.infer.obs import Obs
from vlastack.infer.policy import Policy
from vlastack.infer.preprocess import ACTION_KEY
from vlastack.infer.readers import load_parts

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "pi0_fast"
META = json.loads((FOLDER / "io.json").read_text())
IO = load_file(str(FOLDER / "io.safetensors"))
FITTED = META["fitted_rows"]


@pytest.fixture(scope="module")
def parts():
    return load_parts(FOLDER, META["overrides"])


def _obs() -> list[Obs]:
    imgs = (IO["raw.image"] * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    cam = META["cameras_present"][0].removeprefix("observation.images.")
    return [Obs({cam: imgs[i]}, IO["raw.state"][i].numpy(), p) for i, p in enumerate(META["prompts"])]


def _until_end(ids: torch.Tensor, end: int) -> list[list[int]]:
    """Each row up to and including its first end id (LeRobot stops there; later slots differ)."""
    out = []
    for row in ids.tolist():
        out.append(row[: row.index(end) + 1] if end in row else row)
    return out


def test_config_and_pipeline_match_lerobot(parts):
    c = parts.model.cfg
    assert parts.kind == "pi0_fast" and c.head == "tokens" and c.head_options.sequence == "pi0_fast"
    assert (c.action_horizon, c.head_options.max_decode_steps, c.head_options.constrained) == (5, 32, False)
    head = parts.model.head
    assert head.num_steps == 32 and head.tokenizer.kind == "pi_fast"
    assert head.prefix_ids == parts.tokenizer.encode("Action: ", bos=False) and head.bos_id == 2
    batch = parts.pipeline.build_batch(_obs(), parts.tokenizer)
    assert torch.equal(batch["tokens"], IO["pre.tokens"])
    assert torch.equal(batch["token_mask"], IO["pre.token_mask"])
    assert (batch["images"][:, 0] - IO["pre.image"]).abs().max() <= 1e-6
    assert batch["image_mask"].tolist() == [[True, False]] * 3


def test_fast_tokens_of_the_targets_match_lerobot(parts):
    """LeRobot's ActionTokenizerProcessorStep: <bos> "Action: " FAST(placed) "|" <eos>, zero-padded."""
    head = parts.model.head
    norm = parts.normalizer.normalize(ACTION_KEY, IO["raw.target_actions"])
    fast = head.tokenizer.encode_batch(norm.numpy())
    for i, ids in enumerate(fast):
        want = IO["pre.action_tokens"][i][IO["pre.action_token_mask"][i]].tolist()
        got = [head.bos_id, *head.prefix_ids, *ids.tolist(), head.end_id, parts.tokenizer.eos_id]
        assert got == want


@torch.no_grad()
def test_decoded_tokens_and_actions_match_lerobot(parts):
    model, head = parts.model, parts.model.head
    batch = parts.pipeline.build_batch(_obs(), parts.tokenizer)
    ids, lengths = head.generate(model, batch)
    assert _until_end(ids, head.end_id) == _until_end(IO["out.tokens"], head.end_id)  # all 3 rows
    actions, valid = head.decode_actions(ids, lengths)
    assert valid.tolist() == [True] * FITTED + [False]
    want = IO["out.normalized_actions"]
    assert (actions[:FITTED, :, :7] - want[:FITTED]).abs().max() <= 1e-5
    assert (actions[FITTED:] == 0).all() and want[FITTED:].abs().max() > 0.1  # LeRobot's relaxed pad
    # Constrained decoding (FAST ids, "Action: " and "|" only) agrees where the model is sure.
    cfg = head.cfg
    head.cfg = replace(cfg, head_options=replace(cfg.head_options, constrained=True))
    try:
        again, _ = head.generate(model, batch)
    finally:
        head.cfg = cfg
    assert _until_end(again[:FITTED], head.end_id) == _until_end(ids[:FITTED], head.end_id)


def test_policy_end_to_end_matches_lerobot(tmp_path):
    """Raw observations -> final actions via Policy.from_pretrained on the LeRobot folder and on
    the folder `vla import` writes (tokenizers saved in action_tokenizer/)."""
    want = IO["out.actions"].numpy()
    for source in (FOLDER, import_checkpoint(FOLDER, tmp_path / "imported", META["overrides"])):
        overrides = tuple(META["overrides"]) if source == FOLDER else ()
        replies = Policy.from_pretrained(source, overrides=overrides).infer_results(_obs())
        assert [r["valid"] for r in replies] == [True] * FITTED + [False]
        got = np.stack([r["actions"] for r in replies])
        assert got.shape == want.shape
        assert np.abs(got[:FITTED] - want[:FITTED]).max() <= 1e-4
    assert (tmp_path / "imported" / "action_tokenizer" / "pi_fast_bpe.json").is_file()


# ----------------------------------------------------------------------------- loading is never silent


def _copy(tmp_path: Path) -> Path:
    out = tmp_path / "ckpt"
    shutil.copytree(FOLDER, out)
    return out


def test_missing_or_unexpected_tensors_are_errors(tmp_path):
    out = _copy(tmp_path)
    state = load_file(str(out / "model.safetensors"))
    state.pop("model.paligemma_with_expert.paligemma.lm_head.weight")
    state["model.action_in_proj.weight"] = torch.zeros(2, 2)
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(
        ValueError, match=r"1 missing: head\.lm_head\.weight.*1 unexpected: model\.action_in_proj"
    ):
        load_parts(out, META["overrides"])


def test_fast_tokenizer_is_found_or_named(tmp_path, monkeypatch):
    out = _copy(tmp_path)
    shutil.move(out / "fast_tokenizer", tmp_path / "fast")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ValueError, match=r"no FAST action tokenizer.*lerobot/fast-action-tokenizer"):
        load_parts(out, META["overrides"])
    snap = tmp_path / "hub" / "models--lerobot--fast-action-tokenizer" / "snapshots" / "abc"
    shutil.copytree(tmp_path / "fast", snap)
    assert load_parts(out, META["overrides"]).model.head.tokenizer.bpe_vocab_size == 120
    (snap / "processor_config.json").write_text(
        json.dumps({"scale": 10, "min_token": -28, "time_horizon": 9})
    )
    with pytest.raises(ValueError, match="time_horizon=9 but the checkpoint predicts 5"):
        load_parts(out, META["overrides"])


@torch.no_grad()
def test_first_token_logits_match_lerobot(parts):
    batch = parts.pipeline.build_batch(_obs(), parts.tokenizer)
    _, logits, _, _ = parts.model.head.prefill(parts.model, batch)
    assert (logits - IO["out.first_logits"]).abs().max() <= 1e-4


@torch.no_grad()
def _perturb(model: torch.nn.Module, seed: int, scale: float) -> None:
    """scripts/make_pi0_fast_fixture.py's ``perturb``: a stand-in for fine-tuning."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=g) * scale)


def test_export_lerobot_reproduces_our_decoding_in_lerobot(tmp_path):
    """import -> perturb -> `vla export-lerobot`: the real lerobot loaded that folder strictly (and
    our FAST processor files); its logits, tokens and actions (export_io.safetensors) equal ours;
    re-importing the export is lossless."""
    from vlastack.cli import main
    from vlastack.models.vla import VLA

    ours = import_checkpoint(FOLDER, tmp_path / "ours", META["overrides"])
    model = VLA.from_pretrained(ours)
    _perturb(model, META["export"]["perturb_seed"], META["export"]["perturb_scale"])
    model.save_pretrained(ours)
    want = load_file(str(FOLDER / "export_io.safetensors"))
    policy = Policy.from_pretrained(ours)
    batch = policy.preprocess.build_batch(_obs(), policy.tokenizer)
    with torch.no_grad():
        _, logits, _, _ = model.head.prefill(model, batch)
        ids, _ = model.head.generate(model, batch)
    assert (logits - want["out.first_logits"]).abs().max() <= 1e-4
    end = model.head.end_id
    assert _until_end(ids, end) == _until_end(want["out.tokens"], end)
    replies = policy.infer_results(_obs())
    ok = [r["valid"] for r in replies]
    assert ok[:FITTED] == [True] * FITTED  # the small perturbation kept the fitted rows decodable
    got = np.stack([r["actions"] for r in replies])
    assert np.abs(got[:FITTED] - want["out.actions"][:FITTED].numpy()).max() <= 1e-4
    assert main(["export-lerobot", str(ours), "--out", str(tmp_path / "exported")]) == 0
    back = load_parts(tmp_path / "exported", META["overrides"])
    for k, v in model.state_dict().items():
        assert torch.equal(v, back.model.state_dict()[k]), k
    again = Policy.from_pretrained(tmp_path / "exported", overrides=tuple(META["overrides"]))
    assert np.abs(again.infer_checked(_obs())[:FITTED] - got[:FITTED]).max() <= 1e-6


def test_fine_tune_from_imported_pi0_fast(tmp_path):
    """`vla import` writes train.yaml; training starts from the imported weights and keeps the
    checkpoint's FAST tokenizer and sequence ("Action: " FAST "|"), and the result loads as a policy."""
    from tests.train.train_helpers import FakeDataset
    from vlastack.config import apply_overrides, load_yaml
    from vlastack.train.trainer import Trainer

    out = import_checkpoint(FOLDER, tmp_path / "imported", META["overrides"])
    cfg = load_yaml(out / "train.yaml")
    ov = ["train.steps=2", "train.batch_size=2", "train.precision=fp32", "train.warmup_steps=1",
          "train.save_every=100", "train.num_threads=2", "data.num_workers=0"]  # fmt: skip
    cfg = apply_overrides(cfg, ov)
    data = FakeDataset(cfg, n=4)
    data.b["action_dim_mask"][:, 7:] = False  # the checkpoint's 7 action dims
    tr = Trainer(cfg, run_dir=tmp_path / "run", dataset=data)
    head = tr.model.head
    assert head.tokenizer.kind == "pi_fast" and head.prefix_ids == [6, 7, 8]
    batch = next(iter(torch.utils.data.DataLoader(data, batch_size=2)))
    ids, weight, _ = head.targets(batch)
    assert ids[:, :3].tolist() == [[6, 7, 8]] * 2 and (ids[:, 3:][weight[:, 3:] > 0] != 5).sum() > 0
    tr.fit()
    policy = Policy.from_pretrained(tmp_path / "run" / "final")
    obs = {"images": {"base_0_rgb": np.zeros((24, 40, 3), np.uint8)}, "state": np.zeros(32, np.float32),
           "prompt": "pick up the red block"}  # fmt: skip
    assert policy.infer(obs)["actions"].shape == (5, 32)


def test_prefix_rule_follows_validate_action_token_prefix(parts):
    """LeRobot asserts that a sequence starts with "Action: " (validate_action_token_prefix, default
    true): without it we flag the row; with the check off the prefix is only removed, as LeRobot does."""
    head = parts.model.head
    row = _until_end(IO["out.tokens"][:1], head.end_id)[0]
    bare = torch.tensor([row[3:] + [head.end_id] * 3])
    n = torch.tensor([len(row) - 4])
    _, valid = head.decode_actions(bare, n)
    assert head.require_prefix and not valid.any()
    head.require_prefix = False
    try:
        actions, valid = head.decode_actions(bare, n)
    finally:
        head.require_prefix = True
    assert valid.all() and (actions[0, :, :7] - IO["out.normalized_actions"][0]).abs().max() <= 1e-5
