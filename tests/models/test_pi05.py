"""Pi0.5 (``model.head_options.variant=pi05``): adaptive RMSNorm on the flow time, no state token, the state in
the prompt (binning goldens checked against LeRobot 0.6.1), sampler parity, compile, training,
and the public shapes' parameter count."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlastack.batch import dummy_batch
from vlastack.config import ConfigError, load_config, pi05
from vlastack.models import VLA, build_model
from vlastack.models.prompt import discretize_state, pi05_prompt, tokenize_prompt
from vlastack.models.tokenizer import load_tokenizer
from vlastack.nn.norms import AdaRMSNorm, RMSNorm


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny", overrides=["model.head_options.variant=pi05"]).model


@pytest.fixture(scope="module")
def model(cfg):
    torch.manual_seed(0)
    m = build_model(cfg).eval()
    with torch.no_grad():  # open the zero-initialised adaptive norms, as training would
        for mod in m.modules():
            if isinstance(mod, AdaRMSNorm):
                mod.dense.weight.normal_(0, 0.05), mod.dense.bias.normal_(0, 0.5)
    return m


def _noise(cfg, b, seed=1):
    return torch.randn(b, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed))


def test_adarms_at_init_is_rmsnorm_with_closed_gates():
    torch.manual_seed(0)
    x, c = torch.randn(2, 5, 16), torch.randn(2, 8)
    y, gate = AdaRMSNorm(16, 8, eps=1e-6)(x, c)
    torch.testing.assert_close(y, RMSNorm(16, 1e-6)(x))
    assert gate.shape == (2, 1, 16) and (gate == 0).all()


def test_structure(model, cfg):
    names = dict(model.named_parameters())
    assert "head.state_proj.weight" not in names and "head.action_time_mlp_in.weight" not in names
    assert names["head.time_mlp_in.weight"].shape == (cfg.expert.width, cfg.expert.width)
    d = cfg.expert.width
    assert names["decoder.layers.0.expert.input_layernorm.dense.weight"].shape == (3 * d, d)
    assert names["decoder.expert_norm.dense.bias"].shape == (3 * d,)
    assert "decoder.layers.0.expert.input_layernorm.weight" not in names
    assert "decoder.layers.0.vlm.input_layernorm.weight" in names  # the VLM's norms stay plain
    assert model.head.suffix_len == cfg.action_horizon


def test_cached_sampling_equals_uncached(model, cfg):
    batch = dummy_batch(cfg, 3)
    with torch.no_grad():
        ref = model.head.sample_uncached(model, batch, _noise(cfg, 3))
    torch.testing.assert_close(model.sample_actions(batch, noise=_noise(cfg, 3)), ref, atol=1e-5, rtol=1e-5)


def test_the_state_reaches_the_model_only_through_the_prompt(model, cfg):
    batch = dummy_batch(cfg, 2)
    other = {**batch, "state": batch["state"] + 3.0}
    a = model.sample_actions(batch, noise=_noise(cfg, 2))
    torch.testing.assert_close(model.sample_actions(other, noise=_noise(cfg, 2)), a)
    prompt = {**batch, "tokens": torch.where(batch["token_mask"], (batch["tokens"] + 1) % 200 + 4, 0)}
    assert (model.sample_actions(prompt, noise=_noise(cfg, 2)) - a).abs().max() > 1e-4


def test_time_conditions_the_expert(model, cfg):
    """With the same x_t, the velocity changes with t: the time enters through the adaptive norms."""
    batch = dummy_batch(cfg, 2)
    cache, positions, mask, state = model.head.prefill(model, batch)
    x = _noise(cfg, 2)
    with torch.no_grad():
        v1 = model.head.denoise_step(model, cache, state, x, torch.full((2,), 0.9), positions, mask)
        v2 = model.head.denoise_step(model, cache, state, x, torch.full((2,), 0.1), positions, mask)
    assert (v1 - v2).abs().max() > 1e-3


def test_tiny_pi05_trains_on_a_fixed_batch(cfg):
    torch.manual_seed(0)
    m = build_model(cfg)
    batch = dummy_batch(cfg, 4)
    noise, time = _noise(cfg, 4), torch.tensor([0.2, 0.4, 0.6, 0.8])
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    losses = []
    for _ in range(25):
        loss = m(batch, noise=noise, time=time)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses[::5]
    assert all(p.grad is not None for n, p in m.named_parameters() if "dense" in n)  # the norms learn


@pytest.mark.integration
def test_compiled_decoding_equals_eager(cfg):
    torch.manual_seed(0)
    m = build_model(cfg).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, AdaRMSNorm):
                mod.dense.weight.normal_(0, 0.05)
    batches = [dummy_batch(cfg, 2, train=False, seed=s) for s in (0, 1)]
    eager = [m.sample_actions(b, noise=_noise(cfg, 2)) for b in batches]
    torch._dynamo.reset()
    m.head.compile_decoding()
    for b, ref in zip(batches, eager, strict=True):
        torch.testing.assert_close(m.sample_actions(b, noise=_noise(cfg, 2)), ref, atol=1e-5, rtol=1e-5)


def test_save_load_roundtrip(model, cfg, tmp_path):
    model.save_pretrained(tmp_path)
    m2 = VLA.from_pretrained(tmp_path).eval()
    assert m2.cfg.head_options.variant == "pi05" and m2.cfg.adarms and m2.cfg.state_in_prompt
    batch = dummy_batch(cfg, 2)
    torch.testing.assert_close(
        m2.sample_actions(batch, noise=_noise(cfg, 2)), model.sample_actions(batch, noise=_noise(cfg, 2))
    )


# Golden values produced by LeRobot 0.6.1's Pi05PrepareStateTokenizerProcessorStep on this input.
STATE = np.array([-1.5, -1.0, -0.99, -1e-9, 0.0, 0.5, 0.999, 1.0, 2.0], dtype=np.float32)
BINS = [-1, 0, 1, 127, 128, 192, 255, 255, 255]
PROMPT = "Task: pick up the cube, State: -1 0 1 127 128 192 255 255 255;\nAction: "


def test_state_binning_goldens():
    assert discretize_state(STATE).tolist() == BINS  # no clipping: -1 below the range
    assert pi05_prompt(" pick_up the\ncube ", STATE) == PROMPT


def test_tokenize_prompt():
    tok = load_tokenizer("byte")
    ids, mask = tokenize_prompt(tok, "pick_up the\ncube", STATE, 100, state_in_prompt=True)
    assert tok.decode(ids[mask].tolist()) == PROMPT and ids[0] == tok.bos_id
    short, smask = tokenize_prompt(tok, "pick_up the\ncube", STATE, 10, state_in_prompt=True)
    assert smask.all() and short.tolist() == ids[:10].tolist()
    plain, _ = tokenize_prompt(tok, "pick_up the\ncube", None, 100, state_in_prompt=False)
    assert plain.tolist() == tok.tokenize("pick_up the\ncube", 100)[0].tolist()


def test_the_variant_is_a_flow_head_option():
    """``variant`` lives in the flow head's options; the spelling from before (``model.variant``,
    in overrides and in every saved config) still selects it, and the tiny preset's Pi0.5 still
    gets room for the state in its prompt either way."""
    new = load_config("tiny", overrides=["model.head_options.variant=pi05"])
    assert new == load_config("tiny", overrides=["model.variant=pi05"])
    assert new.model.max_text_len == 88 and new.model.adarms
    assert not load_config("tiny", overrides=["model.head=tokens"]).model.state_in_prompt


def test_config_checks():
    with pytest.raises(ConfigError, match="variant"):
        load_config("tiny", overrides=["model.head_options.variant=pi06"])
    with pytest.raises(ConfigError, match="variant"):
        load_config("tiny", overrides=["model.head_options.variant=pi05", "model.head=tokens"])
    with pytest.raises(ConfigError, match="variant: is an option of head 'flow'"):
        load_config("tiny", overrides=["model.variant=pi05", "model.head=tokens"])
    with pytest.raises(ConfigError, match="grounding"):
        load_config("tiny", overrides=["model.head_options.variant=pi05", "model.grounding.points=2"])


# LeRobot 0.6.1 PI05Pytorch (the PI05Policy's model) on the meta device: 4,143,404,816 parameters,
# of which its two LM heads (PaliGemma 257152x2048 and the expert's 257152x1024) are untied copies
# that Pi0.5 never reads (the checkpoint's lm_head equals embed_tokens; the expert has no embedding).
LEROBOT_PI05_PARAMS = 4_143_404_816
LEROBOT_LM_HEADS = 257_152 * 2048 + 257_152 * 1024


def test_pi05_preset_matches_lerobot_parameter_count():
    c = pi05()
    assert c.model.max_text_len == 200 and c.model.head_options.variant == "pi05"
    with torch.device("meta"):
        m = VLA(c.model)
    assert m.num_params() == LEROBOT_PI05_PARAMS - LEROBOT_LM_HEADS
    assert m.num_params() - sum(p.numel() for n, p in m.named_parameters() if n.startswith("head.")) == (
        LEROBOT_PI05_PARAMS - LEROBOT_LM_HEADS - 33_792 - 32_800 - 2 * 1_049_600
    )
