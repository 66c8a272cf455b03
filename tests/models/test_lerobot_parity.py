"""Parity with the real `lerobot` 0.6.1 on tiny random-weight PI0 / PI05 policies.

The fixtures (tests/fixtures/lerobot/<kind>/) are LeRobot ``pretrained_model`` folders plus the
inputs and outputs LeRobot produced, written by scripts/make_lerobot_fixtures.py (see its
docstring; lerobot is not installed here). Batch 2, two prompts of different lengths, camera
``left_wrist_0_rgb`` absent, raw images 24x40 (resize-with-pad to 32x32).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vlastack.infer.importer import import_checkpoint
from vlastack.infer.obs import Obs
from vlastack.infer.policy import Policy
from vlastack.infer.preprocess import Pipeline
from vlastack.infer.readers import find_tokenizer, load_parts
from vlastack.models.convert.lerobot import checkpoint_to_ours, config_from_checkpoint, load_checkpoint
from vlastack.models.tokenizer import SentencePieceTokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
KINDS = ["pi0", "pi05"]


def _available(kind: str) -> bool:
    try:
        load_parts(FIXTURES / kind, json.loads((FIXTURES / kind / "io.json").read_text())["overrides"])
    except ValueError as e:
        if "Pi0.5" in str(e):
            return False
        raise
    return True


def kinds():
    return [
        pytest.param(k, marks=pytest.mark.skipif(not _available(k), reason="no Pi0.5 head yet"))
        for k in KINDS
    ]


def _load(kind: str):
    folder = FIXTURES / kind
    meta = json.loads((folder / "io.json").read_text())
    return folder, meta, load_file(str(folder / "io.safetensors"))


def _obs(io: dict, meta: dict) -> list[Obs]:
    """The fixture's raw observations as a user sends them: uint8 HWC, state, prompt."""
    imgs = (io["raw.image"] * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    cam = meta["cameras_present"][0].removeprefix("observation.images.")
    return [Obs({cam: imgs[i]}, io["raw.state"][i].numpy(), meta["prompts"][i]) for i in range(imgs.shape[0])]


@pytest.mark.parametrize("kind", KINDS)
def test_preprocess_matches_lerobot(kind):
    """Cameras, resize-with-pad, normalization, prompt (pi05: the state's bins) and tokens; no model."""
    folder, meta, io = _load(kind)
    cfg, got_kind, ckpt = config_from_checkpoint(folder, meta["overrides"])
    assert got_kind == kind
    pipe = Pipeline.from_lerobot(folder, kind, ckpt, cfg)
    tok = SentencePieceTokenizer(find_tokenizer(folder))
    batch = pipe.build_batch(_obs(io, meta), tok)
    assert torch.equal(batch["tokens"], io["pre.tokens"])
    assert torch.equal(batch["token_mask"], io["pre.token_mask"])
    assert batch["token_mask"].sum(1).tolist()[0] != batch["token_mask"].sum(1).tolist()[1]
    assert (batch["images"][:, 0] - io["pre.image"]).abs().max() <= 1e-6
    assert batch["image_mask"].tolist() == [[True, False]] * 2
    if kind == "pi0":
        assert (batch["state"][:, :6] - io["pre.state"]).abs().max() <= 1e-6
        assert (batch["state"][:, 6:] == 0).all()


def _lerobot_batch(io: dict) -> dict:
    """LeRobot's own preprocessed tensors as our batch (isolates the model from the pipeline)."""
    img = torch.stack([io["pre.image"], torch.full_like(io["pre.image"], -1.0)], dim=1)
    state = torch.nn.functional.pad(io["pre.state"], (0, 32 - io["pre.state"].shape[1]))
    return {"images": img, "image_mask": torch.tensor([[True, False]] * 2), "tokens": io["pre.tokens"],
            "token_mask": io["pre.token_mask"], "state": state}  # fmt: skip


@pytest.mark.parametrize("kind", kinds())
@torch.no_grad()
def test_velocity_and_actions_match_lerobot(kind):
    folder, meta, io = _load(kind)
    model = load_parts(folder, meta["overrides"]).model
    batch = _lerobot_batch(io)
    cache, pos, mask, state = model.head.prefill(model, batch)
    v = model.head.denoise_step(model, cache, state, io["x_t"], io["t"], pos, mask)
    assert (v - io["out.velocity"]).abs().max() <= 1e-5
    a = model.sample_actions(batch, noise=io["noise"], num_steps=meta["num_steps"])
    d = io["out.normalized_actions"].shape[-1]
    assert (a[..., :d] - io["out.normalized_actions"]).abs().max() <= 1e-5


@pytest.mark.parametrize("kind", kinds())
def test_policy_end_to_end_matches_lerobot(kind, tmp_path):
    """Raw observation -> final actions, via Policy.from_pretrained on the LeRobot folder and on
    the folder `vla import` writes."""
    folder, meta, io = _load(kind)
    policy = Policy.from_pretrained(folder, overrides=tuple(meta["overrides"]))
    assert policy.metadata["camera_names"] == ["base_0_rgb", "left_wrist_0_rgb"]
    got = policy.infer_checked(_obs(io, meta), noise=io["noise"])
    assert np.abs(got - io["out.actions"].numpy()).max() <= 1e-4
    out = import_checkpoint(folder, tmp_path / "imported", meta["overrides"])
    again = Policy.from_pretrained(out).infer_checked(_obs(io, meta), noise=io["noise"])
    assert np.abs(again - io["out.actions"].numpy()).max() <= 1e-4


def test_openpi_layout_loads_the_same_weights(tmp_path):
    """openpi's PyTorch layout: no ``model.`` prefix, variant names in config.json, norm stats in
    assets/<id>/norm_stats.json (openpi's eps 1e-6 formulas)."""
    folder, meta, _ = _load("pi0")
    state = {k.removeprefix("model."): v for k, v in load_file(str(folder / "model.safetensors")).items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    keep = (
        "paligemma_variant",
        "action_expert_variant",
        "chunk_size",
        "num_inference_steps",
        "input_features",
    )
    (tmp_path / "config.json").write_text(json.dumps({k: cfg[k] for k in keep}))
    (tmp_path / "assets" / "robot").mkdir(parents=True)
    stats = {"state": {"mean": [0.5] * 6, "std": [2.0] * 6}, "actions": {"mean": [1.0] * 7, "std": [3.0] * 7}}
    (tmp_path / "assets" / "robot" / "norm_stats.json").write_text(json.dumps({"norm_stats": stats}))
    shutil.copy(folder / "tokenizer.model", tmp_path / "tokenizer.model")
    parts = load_parts(tmp_path, meta["overrides"])
    ref = load_parts(folder, meta["overrides"])
    for k, v in ref.model.state_dict().items():
        assert torch.equal(v, parts.model.state_dict()[k]), k
    n = parts.normalizer
    assert np.allclose(n.normalize("observation.state", np.full(6, 2.5, np.float32)), 2.0 / (2.0 + 1e-6))
    assert np.allclose(n.unnormalize("action", np.ones((1, 7), np.float32)), 1.0 + 3.0 + 1e-6)
    # openpi's pi0 prompt: cleaned, then "\n" tokenized on its own
    obs = Obs({"base_0_rgb": np.zeros((8, 8, 3), np.uint8)}, np.zeros(6, np.float32), " open_the drawer\n")
    tok = parts.tokenizer
    want = tok.encode("open the drawer") + tok.encode("\n", bos=False)
    got = parts.pipeline.build_batch([obs], tok)["tokens"][0, : len(want)].tolist()
    assert got == want and parts.pipeline.camera_names == ("base_0_rgb", "left_wrist_0_rgb")


# ----------------------------------------------------------------------------- loading is never silent


def _variant(tmp_path: Path, edit) -> Path:
    folder = FIXTURES / "pi0"
    out = tmp_path / "ckpt"
    shutil.copytree(folder, out)
    state = load_file(str(out / "model.safetensors"))
    edit(state)
    save_file(state, str(out / "model.safetensors"))
    return out


def test_missing_tensor_is_an_error_listing_it(tmp_path):
    key = "model.paligemma_with_expert.gemma_expert.model.layers.1.mlp.up_proj.weight"
    out = _variant(tmp_path, lambda s: s.pop(key))
    with pytest.raises(ValueError, match=r"1 missing: decoder\.layers\.1\.expert\.mlp\.up_proj\.weight"):
        load_checkpoint(out, ["vision.heads=4"])


def test_unexpected_and_misshaped_tensors_are_errors(tmp_path):
    def edit(s):
        for i in range(12):
            s[f"model.extra_{i}.weight"] = torch.zeros(2)
        k = "model.action_out_proj.bias"
        s[k] = torch.zeros(5)

    out = _variant(tmp_path, edit)
    with pytest.raises(ValueError, match=r"12 unexpected: model\.extra_0\.weight.* \.\.\..*1 mis-shaped"):
        load_checkpoint(out, ["vision.heads=4"])


def test_strict_false_prints_what_was_left_out(tmp_path, capsys):
    key = "model.state_proj.bias"
    out = _variant(tmp_path, lambda s: s.pop(key))
    model, _, _ = load_checkpoint(out, ["vision.heads=4"], strict=False)
    assert "1 missing: head.state_proj.bias" in capsys.readouterr().out
    assert model.head.state_proj.bias.device.type == "cpu"


def test_missing_files_are_named(tmp_path):
    out = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "pi0", out)
    (out / "policy_postprocessor.json").unlink()
    with pytest.raises(ValueError, match=r"missing policy_postprocessor\.json"):
        load_parts(out, ["vision.heads=4"])
    (out / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"missing model\.safetensors"):
        load_parts(out, ["vision.heads=4"])


def test_every_lerobot_key_has_a_place():
    from vlastack.models.convert.safetensors_io import read_folder_header

    for kind in KINDS:
        for key in read_folder_header(FIXTURES / kind):
            checkpoint_to_ours(key)  # raises KeyError for an unknown key


def test_hub_cache_id_resolves_offline(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--lerobot--pi0_tiny" / "snapshots" / "abc"
    shutil.copytree(FIXTURES / "pi0", snap)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    parts = load_parts("lerobot/pi0_tiny", ["vision.heads=4"])
    assert parts.folder == snap
    with pytest.raises(ValueError, match="nor in the local Hugging Face cache"):
        import_checkpoint("lerobot/nothing_here", tmp_path / "x")


def test_vla_import_cli(tmp_path, capsys):
    from vlastack.cli import main

    rc = main(
        ["import", str(FIXTURES / "pi0"), "--out", str(tmp_path / "p"), "--set", "model.vision.heads=4"]
    )
    assert rc == 0 and (tmp_path / "p" / "lerobot_pipeline.json").exists()
    assert main(["import", str(tmp_path / "nowhere"), "--out", str(tmp_path / "q")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_fine_tune_from_imported_checkpoint(tmp_path):
    """`vla import` writes train.yaml (train.init_from = the folder); training starts from the
    imported weights and its result loads as a policy."""
    from tests.train.train_helpers import FakeDataset
    from vlastack.config import apply_overrides, load_yaml
    from vlastack.train.trainer import Trainer

    out = import_checkpoint(FIXTURES / "pi0", tmp_path / "imported", ["vision.heads=4"])
    cfg = load_yaml(out / "train.yaml")
    ov = ["train.steps=2", "train.batch_size=2", "train.precision=fp32", "train.warmup_steps=1",
          "train.save_every=100", "train.num_threads=2", "data.num_workers=0"]  # fmt: skip
    cfg = apply_overrides(cfg, ov)
    tr = Trainer(cfg, run_dir=tmp_path / "run", dataset=FakeDataset(cfg, n=4))
    ref = load_parts(out).model.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in tr.model.state_dict().items())
    tr.fit()
    policy = Policy.from_pretrained(tmp_path / "run" / "final")
    obs = {"images": {"base_0_rgb": np.zeros((24, 40, 3), np.uint8)}, "state": np.zeros(32, np.float32),
           "prompt": "pick up the red block"}  # fmt: skip
    assert policy.infer(obs)["actions"].shape == (5, 32)


@torch.no_grad()
def _perturb(model: torch.nn.Module, seed: int) -> None:
    """The same stand-in for fine-tuning as scripts/make_lerobot_fixtures.py's ``perturb``."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=g) * 0.05)


@pytest.mark.parametrize("kind", kinds())
def test_export_lerobot_reproduces_our_actions_in_lerobot(kind, tmp_path):
    """import -> perturb -> `vla export-lerobot`: the real lerobot loaded that folder strictly and its
    actions (frozen in export_io.safetensors) equal ours; re-importing the export is lossless."""
    from vlastack.cli import main
    from vlastack.models.vla import VLA

    folder, meta, io = _load(kind)
    ours = import_checkpoint(folder, tmp_path / "ours", meta["overrides"])
    model = VLA.from_pretrained(ours)
    _perturb(model, meta["export"]["perturb_seed"])
    model.save_pretrained(ours)
    lerobot_out = load_file(str(folder / "export_io.safetensors"))
    got = Policy.from_pretrained(ours).infer_checked(_obs(io, meta), noise=io["noise"])
    assert np.abs(got - lerobot_out["out.actions"].numpy()).max() <= 1e-4
    assert main(["export-lerobot", str(ours), "--out", str(tmp_path / "exported")]) == 0
    back = load_parts(tmp_path / "exported", meta["overrides"])
    for k, v in model.state_dict().items():
        assert torch.equal(v, back.model.state_dict()[k]), k
    again = Policy.from_pretrained(tmp_path / "exported", overrides=tuple(meta["overrides"]))
    assert np.abs(again.infer_checked(_obs(io, meta), noise=io["noise"]) - got).max() <= 1e-6


def test_imported_checkpoint_is_served_to_the_openpi_client(tmp_path):
    """`vla import` output behind `vla serve`'s server, queried by the real openpi client."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from vlastack.infer.server import PolicyServer, ServerThread

    kind = "pi05" if _available("pi05") else "pi0"
    folder, meta, _ = _load(kind)
    out = import_checkpoint(folder, tmp_path / "imported", meta["overrides"])
    srv = PolicyServer(Policy.from_pretrained(out, seed=0), port=0)
    with ServerThread(srv) as s:
        client = WebsocketClientPolicy("127.0.0.1", s.port)
        assert client.get_server_metadata()["camera_names"] == ["base_0_rgb", "left_wrist_0_rgb"]
        state_dim = json.loads((folder / "config.json").read_text())["input_features"]["observation.state"]
        obs = {
            "images": {"base_0_rgb": np.full((24, 40, 3), 128, np.uint8)},  # the wrist camera absent
            "state": np.zeros(state_dim["shape"][0], np.float32),
            "prompt": "pick up the cube",
        }
        actions = client.infer(obs)["actions"]
    assert actions.dtype == np.float32 and actions.ndim == 2 and np.isfinite(actions).all()
