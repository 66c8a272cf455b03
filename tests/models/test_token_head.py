"""The discrete action-token head: masking, gradients, cached decoding, compile, overfitting, FAST."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from vlastack.batch import dummy_batch
from vlastack.config import ConfigError, TokenHeadConfig, tiny
from vlastack.models import VLA, build_model
from vlastack.models.action_tokens.fast import fast_error_bound
from vlastack.models.heads.tokens.head import hold_last_step


def micro(**tokens):
    """A very small tokens-head VLA: 2 cameras of 4 patches, 8 text tokens, H=4, A=4 (2 real dims)."""
    c = tiny().model
    d = replace(c.vlm, width=64, depth=2, heads=2, kv_heads=1, head_dim=32, mlp_dim=128)
    v = replace(c.vision, image_size=16, patch_size=8, width=32, depth=1, heads=2, mlp_dim=64)
    return replace(
        c,
        vision=v,
        vlm=d,
        expert=replace(d, width=32, mlp_dim=64, vocab_size=1),
        head="tokens",
        action_horizon=4,
        action_dim=4,
        state_dim=3,
        max_text_len=8,
        head_options=TokenHeadConfig(**{"placement": "new_rows", **tokens}),
    )


def smooth(n: int, h: int = 4, a: int = 4, seed: int = 0) -> torch.Tensor:
    """[n, h, a] slow sines in [-0.8, 0.8]."""
    g = np.random.default_rng(seed)
    t = np.linspace(0, 1, h)[None, :, None]
    x = g.uniform(0.2, 0.8, (n, 1, a)) * np.sin(
        2 * np.pi * g.uniform(0.1, 0.6, (n, 1, a)) * t + g.uniform(0, 6, (n, 1, a))
    )
    return torch.from_numpy(x).float()


def make(cfg, batch=None, fit_seed=0):
    torch.manual_seed(0)
    m = build_model(cfg)
    b = dummy_batch(cfg, 2) if batch is None else batch
    b["actions"] = b["actions"].clamp(-1, 1)
    if cfg.head_options.tokenizer == "fast":
        b["actions"] = smooth(2, seed=7) * b["action_dim_mask"][:, None]
        m.head.fit_tokenizer(smooth(300, seed=fit_seed), action_dim_mask=b["action_dim_mask"][0])
    else:
        m.head.fit_tokenizer(b["actions"], b["action_is_pad"], b["action_dim_mask"])
    return m, b


def train(m, b, steps: int, lr: float) -> list[float]:
    opt = torch.optim.Adam(m.parameters(), lr=lr)
    m.train()
    hist = []
    for _ in range(steps):
        out = m(b)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        hist.append(float(out["ce"].detach()))
    return hist


def generate_uncached(m, b) -> torch.Tensor:
    """Greedy reference decoder that recomputes the whole sequence every step. -> ids [B, steps]."""
    h = m.head
    ids = torch.zeros(2, 0, dtype=torch.long)
    done = torch.zeros(2, dtype=torch.bool)
    for _ in range(h.num_steps):
        hidden = h._run(m, b, h.embed_ids(m, ids), causal=True)
        written = h.piece_len[ids].sum(-1) if h.length_constrained else None  # FAST symbols so far
        tok = h.pick(h.logits(m, hidden[:, -1]), 0.0, written=written)
        if h.end_id is not None:
            tok = torch.where(done, torch.full_like(tok, h.end_id), tok)
            done = done | (tok == h.end_id)
        ids = torch.cat([ids, tok[:, None]], dim=1)
    return ids


def test_hold_last_step_and_config_checks():
    x = torch.arange(8.0).view(1, 4, 2)
    pad = torch.tensor([[False, False, True, True]])
    torch.testing.assert_close(hold_last_step(x, pad)[0, 2:], x[0, 1:2].expand(2, 2))
    with pytest.raises(ConfigError, match="decoding"):
        TokenHeadConfig(tokenizer="fast", decoding="parallel")
    with pytest.raises(ConfigError, match="regression_head"):
        TokenHeadConfig(regression_head=True)
    with pytest.raises(ValueError, match="new_rows"):  # 1024 FAST ids do not fit a 260-token vocab
        build_model(
            replace(micro(tokenizer="fast"), head_options=TokenHeadConfig(tokenizer="fast"))
        ).head.fit_tokenizer(smooth(10))


@pytest.mark.parametrize("tokenizer", ["bins", "fast"])
def test_loss_masks_prompt_padding_and_padded_actions(tokenizer):
    cfg = micro(tokenizer=tokenizer, max_action_tokens=16)
    m, b = make(cfg)
    m.eval()
    base = m(b)["loss"]
    c = {k: v.clone() for k, v in b.items()}
    c["tokens"] = torch.where(c["token_mask"], c["tokens"], torch.full_like(c["tokens"], 77))
    c["images"][~c["image_mask"]] = 123
    c["actions"][c["action_is_pad"]] = 0.9  # padded steps
    c["actions"][:, :, 2:] = -0.7  # padded dims
    assert (~b["token_mask"]).any() and (~b["image_mask"]).any() and b["action_is_pad"].any()
    torch.testing.assert_close(m(c)["loss"], base, atol=1e-6, rtol=1e-6)
    c["actions"][1, 0, 0] = -c["actions"][1, 0, 0] - 0.5  # a real value: the loss must move
    assert abs(float(m(c)["loss"]) - float(base)) > 1e-4


@pytest.mark.parametrize(
    "tokens",
    [{}, {"decoding": "parallel", "regression_head": True, "state_input": "discrete"}],
    ids=["autoregressive", "parallel-l1-discrete-state"],
)
def test_gradients_reach_every_parameter(tokens):
    m, b = make(micro(**tokens))
    m(b)["loss"].backward()
    dead = [
        n for n, p in m.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)
    ]
    assert not dead, dead


@pytest.mark.parametrize("tokenizer", ["bins", "fast"])
def test_cached_greedy_decoding_equals_uncached(tokenizer):
    m, b = make(micro(tokenizer=tokenizer, max_action_tokens=10))
    m.eval()
    with torch.no_grad():
        ids, _ = m.head.generate(m, b, temperature=0.0)
        ref = generate_uncached(m, b)
    assert ids.shape == (2, m.head.num_steps)
    assert torch.equal(ids, ref)
    assert m.head.allowed_ids[ids].all()  # only action ids (+ end) are ever emitted
    assert len(torch.unique(ids)) > 1
    torch.manual_seed(3)
    hot, _ = m.head.generate(m, b, temperature=5.0)
    assert m.head.allowed_ids[hot].all() and not torch.equal(hot, ids)


@pytest.mark.parametrize("tokenizer", ["bins", "fast"])
def test_decode_step_has_no_graph_breaks(tokenizer):
    import torch._dynamo as dynamo

    m, b = make(micro(tokenizer=tokenizer))
    m.eval()
    h = m.head
    with torch.no_grad():
        cache, logits, pad, n_valid = h.prefill(m, b)
        tok = h.pick(logits, 0.0)
        done = torch.zeros_like(tok, dtype=torch.bool)
        dynamo.reset()
        explain = dynamo.explain(h.decode_step)(m, cache, tok, done, torch.tensor(0), pad, n_valid, 0.0)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1


def test_bins_overfit_then_greedy_reproduces_tokens():
    m, b = make(micro())
    hist = train(m, b, 30, 1e-2)
    assert hist[-1] < 0.1 * hist[0], hist[::10]
    m.eval()
    ids, weight, _ = m.head.targets(b)
    with torch.no_grad():
        out, _ = m.head.generate(m, b)
        actions, valid = m.sample(b)
    real = weight > 0
    assert torch.equal(out[real], ids[real])
    assert valid.all()
    # Bin centers: within half a bin of the data on real steps/dims; padded dims decode to 0.
    keep = (~b["action_is_pad"])[:, :, None] & b["action_dim_mask"][:, None]
    assert (actions - b["actions"]).abs()[keep].max() <= 1 / 256 + 1e-5
    assert (actions[:, :, 2:] == 0).all()


def test_fast_end_to_end_fit_train_sample_save_load(tmp_path):
    cfg = micro(tokenizer="fast", max_action_tokens=12)
    m, b = make(cfg)
    tok = m.head.tokenizer
    assert tok.kind == "fast" and tok.action_dim == 2 and m.head.end_id == 2
    hist = train(m, b, 30, 1e-2)
    assert hist[-1] < 0.1 * hist[0], hist[::10]
    m.eval()
    actions, valid = m.sample(b)
    assert actions.shape == (2, 4, 4) and actions.dtype == torch.float32
    assert valid.dtype == torch.bool and valid.all()
    ids, lengths = m.head.generate(m, b)
    assert (lengths < m.head.num_steps).all()  # stopped at the end token, later slots masked
    assert (ids[0, lengths[0] :] == m.head.end_id).all()
    keep = (~b["action_is_pad"])[:, :, None] & b["action_dim_mask"][:, None]
    err = (actions - b["actions"]).abs()[keep].max()
    assert err <= fast_error_bound(4, cfg.head_options.fast_scale) + 1e-5
    assert (actions[:, :, 2:] == 0).all()
    # An invalid sequence is flagged, never a silent zero action.
    bad, valid = m.head.decode_actions(torch.full_like(ids, 40), torch.full_like(lengths, 3))
    assert not valid.any() and (bad == 0).all()
    m.save_pretrained(tmp_path)
    assert (tmp_path / "action_tokenizer" / "fast_bpe.json").is_file()
    m2 = VLA.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(m2.sample_actions(b), actions)
    assert (
        m2.head.tokenizer.encode(b["actions"][0, :, :2].numpy()).tolist()
        == tok.encode(b["actions"][0, :, :2].numpy()).tolist()
    )


@pytest.mark.integration
def test_parallel_decoding_overfits_with_l1_head():
    m, b = make(micro(decoding="parallel", regression_head=True, state_input="discrete"))
    hist = train(m, b, 200, 5e-3)
    assert hist[-1] < 0.1 * hist[0], hist[::10]
    m.eval()
    ids, weight, _ = m.head.targets(b)
    with torch.no_grad():
        l1 = float(m(b)["l1"])
        actions, valid = m.sample(b)
        h = m.head._run(m, b, m.head.action_queries.weight[: ids.shape[1]][None].expand(2, -1, -1), False)
        pred = m.head.pick(m.head.logits(m, h[:, 1:]), 0.0)
    assert l1 < 0.05
    assert torch.equal(pred[weight > 0], ids[weight > 0])
    keep = (~b["action_is_pad"])[:, :, None] & b["action_dim_mask"][:, None]
    assert (actions - b["actions"]).abs()[keep].max() < 0.15
    assert valid.all()


def test_fast_host_inputs_give_the_same_loss():
    """FAST's BPE ids, computed before the step (``host_inputs``), give the loss computed inside."""
    m, b = make(micro(tokenizer="fast", max_action_tokens=10))
    extra = m.head.host_inputs(b)
    assert set(extra) == {"action_token_ids", "action_token_weight"}
    torch.manual_seed(0)
    inside = m(b)["loss"]
    torch.manual_seed(0)
    before = m({**b, **extra})["loss"]
    assert torch.equal(inside, before)
    mb, bb = make(micro(tokenizer="bins"))
    assert mb.head.host_inputs(bb) == {}  # bins tokenize in torch, inside the graph


@pytest.mark.slow
def test_fast_training_forward_compiles_fullgraph():
    """With its host inputs, the FAST head's training forward is one graph (train.compile)."""
    m, b = make(micro(tokenizer="fast", max_action_tokens=10))
    b = {**b, **m.head.host_inputs(b)}
    torch.manual_seed(0)
    eager = m(b)["loss"]
    compiled = torch.compile(m.forward, fullgraph=True, dynamic=False)
    torch.manual_seed(0)
    assert torch.allclose(compiled(b)["loss"], eager, atol=1e-5)
