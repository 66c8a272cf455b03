"""The Pi0 flow-matching VLA: sampler invariances, masking, gradients, compile, overfitting."""

import pytest
import torch

from vlastack.batch import dummy_batch, validate_batch
from vlastack.config import pi0, tiny
from vlastack.models import VLA, build_model
from vlastack.models.heads.flow.head import sample_time, sincos_time_embedding


@pytest.fixture(scope="module")
def cfg():
    return tiny().model


@pytest.fixture(scope="module")
def model(cfg):
    torch.manual_seed(0)
    return build_model(cfg).eval()


def _noise(cfg, b, seed=1):
    return torch.randn(b, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed))


def test_cached_sampling_equals_uncached_reference(model, cfg):
    batch = dummy_batch(cfg, 3)
    noise = _noise(cfg, 3)
    cached = model.sample_actions(batch, noise=noise)
    with torch.no_grad():
        ref = model.head.sample_uncached(model, batch, noise)
    assert cached.shape == (3, cfg.action_horizon, cfg.action_dim)
    torch.testing.assert_close(cached, ref, atol=1e-5, rtol=1e-5)


def test_reused_cache_equals_fresh_cache(model, cfg):
    """A cache kept across calls (for CUDA graphs) holds nothing over from the previous batch."""
    cache = model.head.new_cache(model, 2, torch.float32, "cpu")
    for seed in (0, 1, 0):
        batch = dummy_batch(cfg, 2, train=False, seed=seed)
        noise = _noise(cfg, 2, seed=seed)
        torch.testing.assert_close(
            model.sample_actions(batch, noise=noise, cache=cache), model.sample_actions(batch, noise=noise)
        )
    with pytest.raises(ValueError, match="batch 2"):
        model.sample_actions(dummy_batch(cfg, 3, train=False), cache=cache)


def test_sampling_is_deterministic_given_noise(model, cfg):
    batch = dummy_batch(cfg, 2)
    noise = _noise(cfg, 2)
    torch.testing.assert_close(
        model.sample_actions(batch, noise=noise), model.sample_actions(batch, noise=noise)
    )


def test_noise_scale_is_the_sampling_temperature(model, cfg):
    """noise_scale=0 ignores the noise (the deterministic path); 0.5 equals halving the noise."""
    batch = dummy_batch(cfg, 2)
    cold = VLA(cfg.with_head_options(noise_scale=0.0)).eval()
    half = VLA(cfg.with_head_options(noise_scale=0.5)).eval()
    for m in (cold, half):
        m.load_state_dict(model.state_dict())
    a, b = _noise(cfg, 2, seed=1), _noise(cfg, 2, seed=2)
    torch.testing.assert_close(cold.sample_actions(batch, noise=a), cold.sample_actions(batch, noise=b))
    torch.testing.assert_close(cold.sample_actions(batch, noise=a), model.sample_actions(batch, noise=0 * a))
    torch.testing.assert_close(half.sample_actions(batch, noise=a), model.sample_actions(batch, noise=a / 2))
    with torch.no_grad():
        ref = half.head.sample_uncached(half, batch, a)
    torch.testing.assert_close(half.sample_actions(batch, noise=a), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="noise_scale"):
        cfg.with_head_options(noise_scale=-1.0)


@pytest.mark.parametrize("key", ["images", "tokens", "state"])
def test_inputs_are_not_silently_ignored(model, cfg, key):
    batch = dummy_batch(cfg, 2)
    noise = _noise(cfg, 2)
    base = model.sample_actions(batch, noise=noise)
    changed = dict(batch)
    if key == "images":
        changed["images"] = 255 - batch["images"]
    elif key == "tokens":
        changed["tokens"] = torch.where(batch["token_mask"], (batch["tokens"] + 7) % 250 + 4, batch["tokens"])
    else:
        changed["state"] = batch["state"] + 1.0
    out = model.sample_actions(changed, noise=noise)
    # Sample 0 has a present camera and real tokens: its actions must move.
    assert (out[0] - base[0]).abs().max() > 1e-4, f"changing {key} did not change the actions"


def test_masked_padding_does_not_change_output(model, cfg):
    batch = dummy_batch(cfg, 2)
    noise = _noise(cfg, 2)
    base = model.sample_actions(batch, noise=noise)
    junk = dict(batch)
    junk["tokens"] = torch.where(
        batch["token_mask"], batch["tokens"], torch.randint(4, 250, batch["tokens"].shape)
    )
    missing = ~batch["image_mask"]
    assert missing.any()
    noise_img = torch.randint(0, 256, batch["images"].shape, dtype=torch.uint8)
    junk["images"] = torch.where(missing[:, :, None, None, None], noise_img, batch["images"])
    torch.testing.assert_close(model.sample_actions(junk, noise=noise), base, atol=1e-5, rtol=1e-5)
    # The loss ignores padded action steps and dims. At t=1, x_t = eps does not depend on the
    # actions, so changing padded targets may only change the (excluded) padded errors.
    b = dummy_batch(cfg, 2)
    t = torch.ones(2)
    eps = _noise(cfg, 2)
    l1 = model(b, noise=eps, time=t)["loss"]
    b2 = dict(b)
    pad = b["action_is_pad"][:, :, None] | ~b["action_dim_mask"][:, None, :]
    b2["actions"] = torch.where(pad, torch.randn_like(b["actions"]) * 100, b["actions"])
    torch.testing.assert_close(model(b2, noise=eps, time=t)["loss"], l1)
    b3 = dict(b)
    b3["actions"] = torch.where(pad, b["actions"], b["actions"] + 1.0)
    assert (model(b3, noise=eps, time=t)["loss"] - l1).abs() > 1e-3


def test_gradients_reach_every_trainable_parameter(cfg):
    torch.manual_seed(0)
    m = build_model(cfg)
    m(dummy_batch(cfg, 2))["loss"].backward()
    dead = [
        n for n, p in m.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)
    ]
    assert not dead, f"no gradient reached: {dead}"


def test_denoise_step_has_no_graph_breaks(model, cfg):
    import torch._dynamo as dynamo

    batch = dummy_batch(cfg, 1, train=False)
    with torch.no_grad():
        cache, positions, mask, state = model.head.prefill(model, batch)
        x, t = _noise(cfg, 1), torch.full((1,), 0.7)

        def step(x, t):
            return model.head.denoise_step(model, cache, state, x, t, positions, mask)

        dynamo.reset()
        explain = dynamo.explain(step)(x, t)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1


@pytest.mark.integration
def test_full_sampler_has_no_graph_breaks(cfg):
    import torch._dynamo as dynamo

    small = cfg.with_head_options(num_denoise_steps=2)
    m = build_model(small).eval()
    batch = dummy_batch(small, 1, train=False)
    dynamo.reset()
    explain = dynamo.explain(m.sample_actions)(batch, noise=_noise(small, 1))
    assert explain.graph_break_count == 0, explain.break_reasons


def test_pi0_preset_parameter_count_on_meta():
    with torch.device("meta"):
        m = VLA(pi0().model)
    n = m.num_params()
    # SigLIP So400m (~413M) + Gemma-2B (~2.51B incl. 527M embeddings) + expert (~311M) + heads.
    assert n == 3_238_048_528
    assert 3.2e9 < n < 3.35e9


def test_init_is_lecun_normal_for_weights_and_small_for_embeddings(model):
    """Linear/conv weights start at std 1/sqrt(fan_in), so small inputs (8-dim state and actions,
    patch pixels) enter at unit gain; embeddings at 0.02; biases at zero."""
    head, vis, emb = model.head, model.vision, model.decoder.embed_tokens
    for w in (head.state_proj.weight, head.action_in_proj.weight, vis.patch_embedding.weight):
        assert abs(float(w.std()) * w[0].numel() ** 0.5 - 1.0) < 0.15, (tuple(w.shape), float(w.std()))
    assert abs(float(emb.weight.std()) - 0.02) < 0.002
    assert float(head.state_proj.bias.abs().max()) == 0.0


def test_time_sampling_and_embedding():
    t = sample_time(100_000, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert t.min() >= 0.001 and t.max() <= 1.0
    # Beta(1.5, 1) mean = 0.6, scaled: 0.6 * 0.999 + 0.001
    assert abs(t.mean().item() - (0.6 * 0.999 + 0.001)) < 5e-3
    e = sincos_time_embedding(torch.tensor([0.0, 0.5]), 64, 4e-3, 4.0)
    assert e.shape == (2, 64) and e.dtype == torch.float32
    torch.testing.assert_close(e[0, :32], torch.zeros(32))
    torch.testing.assert_close(e[0, 32:], torch.ones(32))


def test_validate_batch_names_the_bad_key(cfg):
    b = dummy_batch(cfg, 2)
    b["state"] = torch.zeros(2, cfg.state_dim + 1)
    with pytest.raises(ValueError, match="state"):
        validate_batch(b, cfg, train=True)


def test_save_and_load_round_trip(model, cfg, tmp_path):
    model.save_pretrained(tmp_path / "m")
    loaded = VLA.from_pretrained(tmp_path / "m").eval()
    batch, noise = dummy_batch(cfg, 2), _noise(cfg, 2)
    torch.testing.assert_close(
        loaded.sample_actions(batch, noise=noise), model.sample_actions(batch, noise=noise)
    )
    assert loaded.cfg == cfg


def test_overfits_one_batch(cfg):
    torch.manual_seed(0)
    m = build_model(cfg)
    batch = dummy_batch(cfg, 2, seed=3)
    opt = torch.optim.AdamW(m.parameters(), lr=2e-3)
    noise = torch.randn(2, cfg.action_horizon, cfg.action_dim)
    t = torch.rand(2) * 0.9 + 0.05
    losses = []
    for _ in range(100):
        loss = m(batch, noise=noise, time=t)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])


@pytest.mark.integration
def test_compiled_decoding_equals_eager(cfg):
    """``FlowHead.compile_decoding`` (prefix pass and denoise step compiled apart, as `bench/latency.py
    --modes step` and the CUDA-graph sampler use it) gives the eager actions, on a second batch too."""
    torch.manual_seed(0)
    m = build_model(cfg).eval()  # its own model: compiling overrides the head's methods in place
    batches = [dummy_batch(cfg, 2, train=False, seed=s) for s in (0, 1)]
    noise = _noise(cfg, 2)
    eager = [m.sample_actions(b, noise=noise) for b in batches]
    torch._dynamo.reset()
    m.head.compile_decoding()
    for b, ref in zip(batches, eager, strict=True):
        torch.testing.assert_close(m.sample_actions(b, noise=noise), ref, atol=1e-5, rtol=1e-5)
