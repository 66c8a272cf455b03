"""Parity with `transformers` through our real import code (tiny random PaliGemma on disk)."""

from dataclasses import replace

import pytest
import torch

from tests.models.hf_tiny import make_tiny_paligemma
from vlastack.config import tiny
from vlastack.models import build_model
from vlastack.models.hf import config_from_paligemma, export_paligemma, load_paligemma
from vlastack.nn.attention import block_causal_mask

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = make_tiny_paligemma(tmp_path_factory.mktemp("pg"))
    hf = transformers.PaliGemmaForConditionalGeneration.from_pretrained(folder).eval()
    cfg = replace(config_from_paligemma(folder, tiny().model), camera_names=("cam",), max_text_len=6)
    ours = build_model(cfg).eval()
    untouched = load_paligemma(ours, folder)
    return folder, hf, ours, untouched


def test_import_leaves_only_expert_and_head(pair):
    _, _, _, untouched = pair
    assert untouched and all(
        k.startswith(("head.", "decoder.expert_norm")) or ".expert." in k for k in untouched
    )


def test_siglip_parity(pair):
    _, hf, ours, _ = pair
    img = torch.rand(3, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        ref = hf.model.vision_tower(pixel_values=img).last_hidden_state
        torch.testing.assert_close(ours.vision(img), ref, atol=1e-5, rtol=1e-5)
        feat = hf.model.get_image_features(pixel_values=img)
        feat = getattr(feat, "pooler_output", feat)
        torch.testing.assert_close(ours.projector(ours.vision(img)), feat, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_gemma_text_parity(pair, causal):
    _, hf, ours, _ = pair
    ids = torch.randint(0, 290, (2, 6))
    tt = torch.full_like(ids, int(causal))  # HF PaliGemma: token_type 1 = causal suffix, 0 = prefix
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=tt).logits
        mask = block_causal_mask(torch.ones(2, 6, dtype=torch.bool), torch.full((6,), causal))
        h = ours.decoder([ours.decoder.embed(ids), None], torch.arange(6)[None].expand(2, -1), mask).vlm
        torch.testing.assert_close(ours.decoder.logits(h), ref, atol=2e-5, rtol=1e-4)


def test_paligemma_prefix_parity(pair):
    """Image + text prefix, bidirectional, through embed_prefix: same logits as HF PaliGemma."""
    _, hf, ours, _ = pair
    img = torch.rand(2, 3, 32, 32) * 2 - 1
    ids = torch.randint(0, 290, (2, 6))
    n = ours.vision.num_patches
    hf_ids = torch.cat([torch.full((2, n), hf.config.image_token_index), ids], 1)
    batch = {
        "images": img[:, None],
        "image_mask": torch.ones(2, 1, dtype=torch.bool),
        "tokens": ids,
        "token_mask": torch.ones(2, 6, dtype=torch.bool),
    }
    with torch.no_grad():
        ref = hf(
            input_ids=hf_ids,
            pixel_values=img,
            attention_mask=torch.ones_like(hf_ids),
            token_type_ids=torch.zeros_like(hf_ids),
        ).logits
        prefix, pad = ours.embed_prefix(batch)
        mask = block_causal_mask(pad, torch.zeros(pad.shape[1], dtype=torch.bool))
        h = ours.decoder([prefix, None], pad.long().cumsum(-1) - 1, mask).vlm
        torch.testing.assert_close(ours.decoder.logits(h), ref, atol=2e-5, rtol=1e-4)


def test_export_round_trip_loads_in_transformers(pair, tmp_path):
    _, hf, ours, _ = pair
    out = tmp_path / "exported"
    export_paligemma(ours, out)
    hf2 = transformers.PaliGemmaForConditionalGeneration.from_pretrained(out).eval()
    ids = torch.randint(0, 290, (1, 6))
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        b = hf2(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(a, b)


def test_import_rejects_shape_mismatch(pair):
    folder, _, _, _ = pair
    cfg = replace(config_from_paligemma(folder, tiny().model), camera_names=("cam",))
    bad = build_model(replace(cfg, vlm=replace(cfg.vlm, mlp_dim=96), expert=replace(cfg.expert)))
    with pytest.raises(ValueError, match="shape"):
        load_paligemma(bad, folder)


def test_padded_vocab_is_accepted(tmp_path):
    folder = make_tiny_paligemma(tmp_path / "pg", vocab=320)
    cfg = replace(config_from_paligemma(folder, tiny().model), camera_names=("cam",))
    cfg = replace(cfg, vlm=replace(cfg.vlm, vocab_size=300))  # like 257152 vs the padded 257216
    model = build_model(cfg)
    load_paligemma(model, folder)
    assert model.decoder.embed_tokens.weight.shape[0] == 300
