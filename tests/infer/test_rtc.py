"""Real-time chunking in the model and the policy: guided inpainting, clean-prefix sampling, the
training-time RTC loss, and the edge cases of the ``action_prefix`` request (missing or long
delay, action-dim order and padding, wrong heads), also through ``vla serve``."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
import torch

from tests.infer.conftest import ACTION_DIM, STATE_DIM, make_obs, micro_config
from vlastack.data.stats import Normalizer
from vlastack.infer.obs import ObsError
from vlastack.infer.policy import Policy
from vlastack.models import build_model
from vlastack.models.heads.flow.head import flow_mse
from vlastack.models.heads.flow.rtc import guidance_weight, guided_sample, prefix_sample, prefix_weights

H = 16


def per_dim_normalizer() -> Normalizer:
    """Different statistics per action dim, so a prefix in the wrong dim order shows."""
    stats = {
        "observation.state": {"mean": np.zeros(STATE_DIM), "std": np.ones(STATE_DIM)},
        "action": {"mean": np.arange(ACTION_DIM) * 3.0, "std": np.arange(1, ACTION_DIM + 1) * 0.5},
    }
    return Normalizer(stats, {"observation.state": "mean_std", "action": "mean_std"})


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    model = build_model(micro_config().with_head_options(num_denoise_steps=8))
    return Policy(model, per_dim_normalizer(), seed=0)


def committed(policy, obs, n=8, seed=0):
    """Actions a previous chunk committed: plausible values in env units, [n, A_env]."""
    rng = np.random.default_rng(seed)
    mean, std = np.arange(ACTION_DIM) * 3.0, np.arange(1, ACTION_DIM + 1) * 0.5
    return (mean + std * rng.uniform(-1, 1, (n, ACTION_DIM))).astype(np.float32)


def test_prefix_weights_and_guidance_weight():
    w = prefix_weights(H, 3, 10)
    assert w.shape == (H,) and (w[:3] == 1).all() and (w[10:] == 0).all()
    assert (w[3:10] > 0).all() and (w[3:10] < 1).all() and (torch.diff(w[2:11]) < 0).all()
    assert torch.equal(prefix_weights(H, 20, 10)[:10], torch.ones(10))  # delay clipped to the overlap
    assert (prefix_weights(H, 0, 0) == 0).all()
    with pytest.raises(ValueError, match="overlap"):
        prefix_weights(H, 2, H + 1)
    assert guidance_weight(1.0, 5.0) == 5.0 and guidance_weight(0.0, 5.0) == 5.0
    assert guidance_weight(0.5, 5.0) == pytest.approx(2.0) and guidance_weight(0.9, 5.0) == 5.0


@pytest.mark.parametrize("delay", [0, 2, 5])
def test_guided_inpainting_keeps_the_committed_actions(policy, delay):
    obs = make_obs()
    y = committed(policy, obs)
    plain = policy.infer(obs)["actions"]
    guided = policy.infer({**obs, "action_prefix": y, "inference_delay": delay})["actions"]
    assert guided.shape == (H, ACTION_DIM)
    scale = np.arange(1, ACTION_DIM + 1) * 0.5  # compare in normalized units, per dim
    err = np.abs(guided[:8] - y) / scale
    base = np.abs(plain[:8] - y) / scale
    if delay:
        assert err[:delay].mean() < 0.15 * base[:delay].mean()
    assert err[delay:8].mean() < 0.8 * base[delay:8].mean()  # the soft region is pulled too


@pytest.mark.parametrize("delay", [0, 3])
def test_identity_guidance_keeps_the_committed_actions_without_a_backward_pass(policy, delay):
    """``guidance="identity"`` (LeRobot's RTCProcessor form): the weighted error itself, no VJP.
    It pulls the committed actions in like the VJP form, equals plain sampling where every weight
    is 0, and runs under a caller's inference mode (it needs no autograd)."""
    model, c = policy.model, policy.cfg
    obs = make_obs(2)
    y = committed(policy, obs, seed=2)
    plain = policy.infer(obs)["actions"]
    policy.serving.guidance = "identity"
    try:
        with torch.inference_mode():
            guided = policy.infer({**obs, "action_prefix": y, "inference_delay": delay})["actions"]
    finally:
        policy.serving.guidance = "vjp"
    scale = np.arange(1, ACTION_DIM + 1) * 0.5
    err, base = np.abs(guided[:8] - y) / scale, np.abs(plain[:8] - y) / scale
    if delay:
        assert err[:delay].mean() < 0.15 * base[:delay].mean()
    assert err[delay:8].mean() < 0.8 * base[delay:8].mean()
    batch = policy.model_batch([policy.check(obs)])
    noise = torch.randn(1, H, c.action_dim, generator=torch.Generator().manual_seed(0))
    zero, target = torch.zeros(1, H, c.action_dim), torch.randn(1, H, c.action_dim)
    a = guided_sample(model.head, model, batch, target, zero, noise, guidance="identity")
    b = guided_sample(model.head, model, batch, target, zero, noise, guidance="vjp")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # no weight: both are plain Euler sampling
    with pytest.raises(ValueError, match="guidance"):
        guided_sample(model.head, model, batch, target, zero, noise, guidance="jacobian")


def test_guided_sample_ignores_targets_where_the_weight_is_zero(policy):
    model, c = policy.model, policy.cfg
    trainable = [p.requires_grad for p in model.parameters()]
    batch = policy.model_batch([policy.check(make_obs())])
    noise = torch.randn(1, H, c.action_dim, generator=torch.Generator().manual_seed(0))
    w = (prefix_weights(H, 2, 8)[:, None] * (torch.arange(c.action_dim) < ACTION_DIM).float())[None]
    target = torch.randn(1, H, c.action_dim)
    other = target.clone()
    other[:, 8:] = 100.0  # past the overlap
    other[:, :, ACTION_DIM:] = -100.0  # the model's padded dims: never a (zero) target
    a = guided_sample(model.head, model, batch, target, w, noise)
    b = guided_sample(model.head, model, batch, other, w, noise)
    torch.testing.assert_close(a, b)
    assert [p.requires_grad for p in model.parameters()] == trainable  # restored after sampling


@pytest.mark.parametrize("where", ["policy", "sampler"])
def test_guidance_works_under_a_callers_inference_mode(policy, where):
    """A robot loop often runs the policy under ``torch.inference_mode()``; guidance needs autograd
    (LeRobot's RTC failed there). The result is the same as outside it."""
    obs = make_obs(3)
    y = committed(policy, obs, seed=3)
    if where == "policy":
        req = {**obs, "action_prefix": y, "inference_delay": 2}
        policy.generator.manual_seed(7)
        outside = policy.infer(req)["actions"]
        policy.generator.manual_seed(7)
        with torch.inference_mode():
            inside = policy.infer(req)["actions"]
        np.testing.assert_allclose(inside, outside, rtol=1e-5, atol=1e-5)
        return
    model, c = policy.model, policy.cfg
    w = (prefix_weights(H, 2, 8)[:, None] * (torch.arange(c.action_dim) < ACTION_DIM).float())[None]
    noise = torch.randn(1, H, c.action_dim, generator=torch.Generator().manual_seed(0))
    target = torch.randn(1, H, c.action_dim, generator=torch.Generator().manual_seed(1))
    outside = guided_sample(model.head, model, policy.model_batch([policy.check(obs)]), target, w, noise)
    with torch.inference_mode():  # every input made inside it: inference tensors
        batch = policy.model_batch([policy.check(obs)])
        inside = guided_sample(model.head, model, batch, target.clone(), w.clone(), noise.clone())
    torch.testing.assert_close(inside, outside)


def test_training_time_rtc_sampling_keeps_the_prefix_exactly(policy):
    obs = make_obs(1)
    y = committed(policy, obs, seed=1)
    out = policy.infer({**obs, "action_prefix": y, "inference_delay": 3, "rtc_method": "rtc_training"})
    np.testing.assert_allclose(out["actions"][:3], y[:3], rtol=1e-5, atol=1e-4)  # dims in env order
    model, c = policy.model, policy.cfg
    batch = policy.model_batch([policy.check(obs)])
    noise = torch.randn(1, H, c.action_dim, generator=torch.Generator().manual_seed(0))
    zero = prefix_sample(model.head, model, batch, torch.zeros(1, H, c.action_dim), torch.tensor([0]), noise)
    torch.testing.assert_close(zero, model.sample_actions(batch, noise=noise))  # d = 0: plain sampling


def test_bid_keeps_the_candidate_closest_to_the_leftover(policy):
    """Bidirectional decoding (backward coherence): of K plain chunks sampled from the policy's
    generator, the one with the smallest weighted distance to the leftover is returned, in env
    units; with K = 1 it is plain sampling with that noise."""
    obs = make_obs(1)
    y = committed(policy, obs, n=6, seed=2)
    req = {**obs, "action_prefix": y, "inference_delay": 2, "rtc_method": "bid"}
    model, c, k = policy.model, policy.cfg, 5
    batch = policy.model_batch([policy.check(obs)])
    policy.serving.bid_samples = k
    try:
        policy.generator.manual_seed(11)
        got = policy.infer(req)["actions"]
        gen = torch.Generator().manual_seed(11)
        noise = torch.randn(k, H, c.action_dim, generator=gen)
        many = {key: v.repeat_interleave(k, 0) for key, v in batch.items()}
        with torch.inference_mode():
            cand = model.sample_actions(many, noise=noise, noise_scale=policy.serving.bid_noise_scale)
        env = policy.normalizer.unnormalize("action", cand[:, :, :ACTION_DIM].numpy())
        w = prefix_weights(H, 2, 6).numpy()
        target = policy.normalizer.normalize("action", y)
        dist = [
            (w[:6, None] * (policy.normalizer.normalize("action", e[:6]) - target) ** 2).sum() for e in env
        ]
        np.testing.assert_allclose(got, env[int(np.argmin(dist))], rtol=1e-5, atol=1e-5)
        assert len({round(float(d), 6) for d in dist}) == k  # the candidates differ
    finally:
        policy.serving.bid_samples = 8


def test_bid_samples_candidates_even_when_the_recipe_samples_its_mode():
    """The demo's recipe samples at noise_scale 0 (its mode): K candidates drawn at that
    temperature would be one chunk K times, and BID would be plain sampling."""
    torch.manual_seed(0)
    model = build_model(micro_config().with_head_options(num_denoise_steps=4, noise_scale=0.0))
    policy = Policy(model, per_dim_normalizer(), seed=0, bid_samples=4)
    obs = make_obs(1)
    req = {**obs, "action_prefix": committed(policy, obs, n=6), "inference_delay": 2, "rtc_method": "bid"}
    plain = policy.infer(obs)["actions"]
    np.testing.assert_array_equal(plain, policy.infer(obs)["actions"])  # the mode: deterministic
    assert not np.allclose(policy.infer(req)["actions"], plain)


def test_missing_and_long_delays_are_handled_and_logged(policy, caplog):
    obs = make_obs(2)
    y = committed(policy, obs, n=4)
    policy._warned.clear()
    with caplog.at_level(logging.WARNING, logger="vlastack.infer.policy"):
        a = policy.infer({**obs, "action_prefix": y})["actions"]  # no delay: soft guidance only
        b = policy.infer({**obs, "action_prefix": y, "inference_delay": 9})["actions"]  # > prefix
        c = policy.infer({**obs, "action_prefix": y, "rtc_method": "rtc_training"})["actions"]
    assert np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(c).all()
    assert "no inference_delay" in caplog.text and "exceeds the 4-action prefix" in caplog.text


def test_rtc_requests_are_micro_batched_per_method(policy):
    """A mixed batch (plain, guided, training-time, guided) gives each row what it gets alone,
    with one sampling pass per method: the same noise rows, the same actions."""
    model, c = policy.model, policy.cfg
    obs = [make_obs(i) for i in range(4)]
    reqs = [
        obs[0],
        {**obs[1], "action_prefix": committed(policy, obs[1], n=6), "inference_delay": 2},
        {
            **obs[2],
            "action_prefix": committed(policy, obs[2], n=5),
            "inference_delay": 3,
            "rtc_method": "rtc_training",
        },
        {**obs[3], "action_prefix": committed(policy, obs[3], n=8)},  # no delay: soft guidance only
    ]
    checked = [policy.check(r) for r in reqs]
    noise = torch.randn(4, H, c.action_dim, generator=torch.Generator().manual_seed(0))
    alone = [policy._run_rtc([checked[i]], noise[i : i + 1])[0] for i in (1, 2, 3)]
    guided = policy._run_rtc([checked[1], checked[3]], noise[[1, 3]])
    trained = policy._run_rtc([checked[2]], noise[2:3])
    np.testing.assert_allclose(guided[0], alone[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(guided[1], alone[2], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(trained[0], alone[1], rtol=1e-5, atol=1e-6)
    calls = []
    run_rtc = policy._run_rtc
    policy._run_rtc = lambda part, noise=None: calls.append(len(part)) or run_rtc(part, noise)
    try:
        out = policy.infer_batch(reqs)
    finally:
        del policy._run_rtc
    assert (
        sorted(calls) == [1, 2] and len(out) == 4 and all(o["actions"].shape == (H, ACTION_DIM) for o in out)
    )
    assert model.training is False


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"action_prefix": np.zeros((4, ACTION_DIM - 1), np.float32)}, "env's action dims"),
        ({"action_prefix": np.zeros((H + 1, ACTION_DIM), np.float32)}, "1 <= n <= 16"),
        ({"action_prefix": np.full((2, ACTION_DIM), np.nan, np.float32)}, "NaN"),
        ({"action_prefix": [[0.0] * ACTION_DIM]}, "float array"),
        ({"action_prefix": np.zeros((2, ACTION_DIM), np.float32), "inference_delay": -1}, "inference_delay"),
        ({"action_prefix": np.zeros((2, ACTION_DIM), np.float32), "inference_delay": 1.5}, "inference_delay"),
        ({"inference_delay": 2}, "needs 'action_prefix'"),
        ({"action_prefix": np.zeros((2, ACTION_DIM), np.float32), "rtc_method": "bidi"}, "rtc_method"),
    ],
)
def test_bad_rtc_requests_are_refused(policy, extra, match):
    with pytest.raises(ObsError, match=match):
        policy.check({**make_obs(), **extra})


def test_token_head_refuses_a_prefix(tmp_path):
    from vlastack.config import TokenHeadConfig

    cfg = replace(micro_config(), head="tokens", head_options=TokenHeadConfig())
    torch.manual_seed(0)
    pol = Policy(build_model(cfg), per_dim_normalizer(), seed=0)
    with pytest.raises(ValueError, match="needs a head that denoises"):
        pol.infer({**make_obs(), "action_prefix": np.zeros((2, ACTION_DIM), np.float32)})


def _flow_batch(cfg, b=3):
    g = torch.Generator().manual_seed(1)
    return {
        "images": torch.rand(b, 2, 3, 64, 64, generator=g) * 2 - 1,
        "image_mask": torch.ones(b, 2, dtype=torch.bool),
        "state": torch.randn(b, cfg.state_dim, generator=g),
        "tokens": torch.randint(0, 250, (b, cfg.max_text_len), generator=g),
        "token_mask": torch.ones(b, cfg.max_text_len, dtype=torch.bool),
        "actions": torch.randn(b, cfg.action_horizon, cfg.action_dim, generator=g),
        "action_is_pad": torch.zeros(b, cfg.action_horizon, dtype=torch.bool),
        "action_dim_mask": torch.arange(cfg.action_dim)[None].expand(b, -1) < 6,
    }


def test_training_time_rtc_loss_masks_the_committed_prefix():
    cfg = micro_config()
    torch.manual_seed(0)
    model = build_model(cfg)
    batch = _flow_batch(cfg)
    g = torch.Generator().manual_seed(2)
    noise = torch.randn(3, H, cfg.action_dim, generator=g)
    t = torch.tensor([0.3, 0.7, 0.95])
    d = torch.tensor([0, 4, 9])
    base = model(batch, noise=noise, time=t)["loss"]
    torch.testing.assert_close(
        model(batch, noise=noise, time=t, prefix_len=torch.zeros(3, dtype=torch.long))["loss"], base
    )
    loss = model(batch, noise=noise, time=t, prefix_len=d)["loss"]
    # The committed steps are given clean: their noise cannot matter, and they are not scored.
    noise2 = noise.clone()
    noise2[1, :4] += 5.0
    noise2[2, :9] -= 3.0
    torch.testing.assert_close(model(batch, noise=noise2, time=t, prefix_len=d)["loss"], loss)
    # The same loss by hand: per-token time (0 on the prefix), pads on the prefix.
    committed = torch.arange(H)[None] < d[:, None]
    tt = torch.where(committed, 0.0, t[:, None])
    a = batch["actions"]
    x_t = tt[..., None] * noise + (1 - tt[..., None]) * a
    prefix, pad = model.embed_prefix(batch)
    v = model.head.velocity_full(model, prefix, pad, batch["state"], x_t, tt)
    ref = flow_mse(v, noise - a, {**batch, "action_is_pad": committed})["loss"]
    torch.testing.assert_close(loss, ref)


def test_per_token_time_equal_to_the_sample_time_changes_nothing():
    cfg = micro_config()
    torch.manual_seed(0)
    model = build_model(cfg)
    batch = _flow_batch(cfg, 2)
    x = torch.randn(2, H, cfg.action_dim)
    t = torch.tensor([0.2, 0.8])
    prefix, pad = model.embed_prefix(batch)
    a = model.head.velocity_full(model, prefix, pad, batch["state"], x, t)
    b = model.head.velocity_full(model, prefix, pad, batch["state"], x, t[:, None].expand(-1, H))
    torch.testing.assert_close(a, b)
    pi05 = build_model(replace(cfg, max_text_len=88).with_head_options(variant="pi05"))
    with pytest.raises(ValueError, match="pi0"):
        pi05.head.embed_suffix(batch["state"], x, t[:, None].expand(-1, H))


def test_rtc_request_through_vla_serve_and_the_openpi_client(policy):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from vlastack.infer.server import PolicyServer, ServerThread

    obs = make_obs(3)
    y = committed(policy, obs, n=6, seed=3)
    req = {**obs, "action_prefix": y, "inference_delay": 2, "rtc_method": "rtc_training"}
    local = policy.infer(req)["actions"]
    with ServerThread(PolicyServer(policy, port=0)) as srv:
        client = WebsocketClientPolicy("127.0.0.1", srv.port)
        assert client.get_server_metadata()["rtc_methods"] == ["rtc_inference", "rtc_training", "bid"]
        out = client.infer(req)["actions"]
        with pytest.raises(RuntimeError, match="action_prefix"):
            client.infer({**obs, "action_prefix": y[:, :2]})
    np.testing.assert_allclose(out[:2], y[:2], rtol=1e-5, atol=1e-4)
    assert out.shape == local.shape == (H, ACTION_DIM)  # (the noise differs between the two calls)


def test_execution_config_checks_the_guidance_mode():
    from vlastack.config import ExecutionConfig

    assert ExecutionConfig(method="rtc_inference", guidance="identity").guidance == "identity"
    with pytest.raises(ValueError, match="guidance"):
        ExecutionConfig(method="rtc_inference", guidance="jacobian")


def test_vla_serve_takes_the_guidance_mode_and_metadata_reports_it(policy, monkeypatch):
    import vlastack.infer.server as server_mod
    from vlastack.cli import main

    seen: dict = {}

    def fake_load(cls, path, **kw):
        seen.update(kw)
        return policy

    monkeypatch.setattr(Policy, "from_pretrained", classmethod(fake_load))
    monkeypatch.setattr(server_mod, "PolicyServer", lambda p, **kw: p)
    monkeypatch.setattr(server_mod, "run", lambda server: None)
    assert main(["serve", "--policy", "any", "--guidance", "identity", "--guidance-max", "2"]) == 0
    assert seen["guidance"] == "identity" and seen["guidance_max"] == 2.0
    with pytest.raises(SystemExit):
        main(["serve", "--policy", "any", "--guidance", "jacobian"])
    assert policy.metadata["rtc_guidance"] == {"mode": "vjp", "max": 5.0}
