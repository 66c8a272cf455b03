"""The token head with the grounding add-on (models/heads/tokens/grounded.py), the token training
options (bin_sigma, label_smoothing, l1_weight, first_step_weight) and the demo_tokens recipe. Tiny, fp32, fixed seeds."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.models.test_token_head import generate_uncached, make, micro
from vlastack.config import ConfigError, GroundingConfig, TokenHeadConfig, load_config
from vlastack.models import VLA
from vlastack.models.heads import GroundedTokenHead, head_class
from vlastack.models.heads.grounding import predict_grounding


def grounded(attend: float = 0.2, **tokens):
    return replace(micro(**tokens), grounding=GroundingConfig(points=2, weight=0.5, attend_weight=attend))


def test_demo_tokens_recipe_loads():
    cfg = load_config("tiny", "demo_tokens")
    m = cfg.model
    assert (m.head, m.head_options.tokenizer, m.head_options.decoding, m.grounding.points) == (
        "tokens",
        "bins",
        "autoregressive",
        2,
    )
    assert cfg.data.norm.action == "quantiles" and cfg.eval.steps_per_chunk == 1
    assert head_class(m) is GroundedTokenHead
    with pytest.raises(ConfigError, match="state_input"):
        load_config("tiny", "demo_tokens", ["model.head_options.state_input=discrete"])


@pytest.mark.parametrize(
    "tokens",
    [{}, {"tokenizer": "fast", "max_action_tokens": 12}, {"decoding": "parallel", "regression_head": True}],
    ids=["bins-ar", "fast-ar", "bins-parallel-l1"],
)
def test_grounded_token_head_trains_one_step(tokens):
    m, b = make(grounded(**tokens))
    assert isinstance(m.head, GroundedTokenHead)
    out = m(b)
    torch.testing.assert_close(
        out["loss"], out["token_loss"] + 0.5 * out["grounding_loss"] + 0.2 * out["attend_loss"]
    )
    out["loss"].backward()
    # (an L1 bias gradient can cancel to exactly 0 on 2 samples: only require that one exists)
    dead = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    assert not dead, dead
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    torch.optim.SGD(m.parameters(), lr=0.1).step()
    assert any(
        not torch.equal(before[n], p) for n, p in m.named_parameters() if n.startswith("head.grounding")
    )


def test_training_feeds_the_recorded_positions():
    """Teacher forcing: the token loss moves with env_state (the state token reads it)."""
    m, b = make(grounded())
    torch.manual_seed(1)
    a = m(b)["token_loss"]
    torch.manual_seed(1)
    c = m(dict(b, env_state=b["env_state"] + 3.0))["token_loss"]
    assert (a - c).abs() > 1e-4


@pytest.mark.parametrize("tokenizer", ["bins", "fast"])
def test_grounded_cached_decoding_equals_uncached(tokenizer):
    m, b = make(grounded(tokenizer=tokenizer, max_action_tokens=10))
    m.eval()
    with torch.no_grad():
        ids, _ = m.head.generate(m, b, temperature=0.0)
        ref = generate_uncached(m, b)
    assert torch.equal(ids, ref)


def test_grounding_prediction_steers_the_tokens_and_roundtrips(tmp_path):
    m, b = make(grounded(attend=0.0, decoding="parallel", regression_head=True))
    m.eval()
    a = m.sample_actions(b)
    assert predict_grounding(m, b).shape == (2, 6)
    with torch.no_grad():
        m.head.grounding.value.bias.add_(2.0)
        shifted = m.sample_actions(b)
        m.head.grounding.value.bias.sub_(2.0)
    assert (a - shifted).abs().max() > 1e-4
    m.save_pretrained(tmp_path)
    m2 = VLA.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(m2.sample_actions(b), a)


def test_bin_sigma_soft_targets():
    """bin_sigma -> 0 is the one-hot CE; with it a near miss costs less than a far one."""
    m, _ = make(micro())
    h = m.head
    ids = h.internal_to_lm[torch.tensor([[10, 200]])]
    logits = torch.randn(1, 2, h.allowed_ids.numel(), generator=torch.Generator().manual_seed(0))
    hard = h.token_ce(logits, ids)
    h.cfg = replace(h.cfg, head_options=replace(h.cfg.head_options, bin_sigma=1e-3))
    torch.testing.assert_close(h.token_ce(logits, ids), hard)
    h.cfg = replace(h.cfg, head_options=replace(h.cfg.head_options, bin_sigma=2.0))
    peak = torch.full_like(logits, -20.0)
    near, far = peak.clone(), peak.clone()
    near[0, 0, h.internal_to_lm[11]] = 20.0  # one bin off
    far[0, 0, h.internal_to_lm[60]] = 20.0  # fifty bins off
    assert h.token_ce(near, ids)[0, 0] < h.token_ce(far, ids)[0, 0] - 5


def test_l1_weight_and_smoothing_options():
    m, b = make(micro(decoding="parallel", regression_head=True, l1_weight=0.25))
    out = m(b)
    torch.testing.assert_close(out["loss"], out["ce"] + 0.25 * out["l1"])
    m2, b2 = make(micro(label_smoothing=0.1))
    assert float(m2(b2)["ce"]) > 0
    for bad in (
        {"bin_sigma": -1.0},
        {"label_smoothing": 1.0},
        {"l1_weight": -0.5},
        {"first_step_weight": 0.0},
        {"first_step_weight": 2.0, "tokenizer": "fast"},
    ):
        with pytest.raises(ConfigError, match=r"bin_sigma|label_smoothing|l1_weight|first_step_weight"):
            TokenHeadConfig(**bad)


def test_first_step_weight():
    """first_step_weight w: the chunk's first step (ids [:A], step-major) counts w times in the
    token CE (and the L1), every later step once; w = 1 is the plain mean."""
    m, b = make(micro(decoding="parallel", regression_head=True))
    h = m.head
    seen: list[torch.Tensor] = []
    plain_ce = h.token_ce
    h.token_ce = lambda logits, ids: seen.append(plain_ce(logits, ids)) or seen[-1]
    base = m(b)
    ce, (_, weight, _) = seen[-1], h.targets(b)
    torch.testing.assert_close(base["ce"], (ce * weight).sum() / weight.sum())
    a = h.tokenizer.action_dim
    h.cfg = replace(h.cfg, head_options=replace(h.cfg.head_options, first_step_weight=5.0))
    out = m(b)
    step = torch.ones(ce.shape[1])
    step[:a] = 5.0
    torch.testing.assert_close(out["ce"], (ce * weight * step).sum() / (weight * step).sum())
    torch.testing.assert_close(seen[-1], ce)  # the same logits: only the weighting moved
    assert not torch.allclose(out["l1"], base["l1"])
    # The accuracy stays the plain mean over tokens: a diagnostic, not a loss.
    torch.testing.assert_close(out["token_accuracy"], base["token_accuracy"])


def test_bin_sigma_on_fast_without_merges():
    """FAST whose BPE vocabulary is its alphabet has one id per quantized DCT coefficient: ordinal
    ids, so bin_sigma spreads the target over neighbouring coefficient values; the end id's target
    stays one-hot. With merges the ids have no order: bin_sigma warns that it does nothing."""
    m, b = make(micro(tokenizer="fast", fast_vocab_size=41, bin_sigma=2.0))  # H=4, scale 10: 41 symbols
    h = m.head
    values = h.tokenizer.ordinal_values()
    assert sorted(values.tolist()) == list(range(-20, 21))
    zero = int(h.internal_to_lm[int(values.tolist().index(0.0))])
    near = int(h.internal_to_lm[int(values.tolist().index(1.0))])
    far = int(h.internal_to_lm[int(values.tolist().index(15.0))])
    logits = torch.full((1, 1, h.allowed_ids.numel()), -20.0)
    hit_near, hit_far = logits.clone(), logits.clone()
    hit_near[0, 0, near], hit_far[0, 0, far] = 20.0, 20.0
    target = torch.tensor([[zero]])
    assert h.token_ce(hit_near, target)[0, 0] < h.token_ce(hit_far, target)[0, 0] - 5
    end = torch.tensor([[h.end_id]])
    free = torch.randn(1, 1, h.allowed_ids.numel(), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        h.token_ce(free, end)[0, 0], -free.log_softmax(-1)[0, 0, h.end_id]
    )  # one-hot at the end id
    out = m(b)
    out["loss"].backward()
    assert torch.isfinite(out["loss"])
    with pytest.warns(UserWarning, match="bin_sigma=2.0 has no effect"):
        merged, _ = make(micro(tokenizer="fast", fast_vocab_size=64, bin_sigma=2.0))
    assert merged.head.tokenizer.ordinal_values() is None
