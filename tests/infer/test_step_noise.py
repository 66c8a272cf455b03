"""A flow head serving with per-step noise (``model.head_options.step_noise``, `--decode
step_noise=...`): the stochastic sampler `vla rl` trains, and the paths that cannot honour it
refuse instead of silently sampling without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.infer.conftest import make_obs, micro_config
from vlastack.config import ConfigError
from vlastack.infer.policy import Policy
from vlastack.models import build_model
from vlastack.models.heads.flow.rl import flow_sample
from vlastack.models.heads.serving import parse_decoding


def test_serving_samples_what_rl_trained(policy_dir):
    """Same generator seed: the policy's sampler with step_noise=s draws exactly vla rl's noisy
    sampler at rl.flow_sigma=s (the same draws in the same order); 0 stays deterministic."""
    p = Policy.from_pretrained(policy_dir, decoding={"step_noise": "0.3"})
    assert p.cfg.head_options.step_noise == 0.3 and p.model.head.cfg is p.cfg
    batch = p.model_batch([p.check(make_obs(0)), p.check(make_obs(1))])
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    with torch.no_grad():
        served = p.model.sample(batch, generator=g1).actions
        trained, _ = flow_sample(p.model, batch, 0.3, g2)
    torch.testing.assert_close(served, trained, rtol=0, atol=1e-6)
    plain = Policy.from_pretrained(policy_dir)
    noise = torch.randn(served.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = plain.model.sample(batch, noise=noise, generator=torch.Generator().manual_seed(2)).actions
        b = plain.model.sample(batch, noise=noise, generator=torch.Generator().manual_seed(3)).actions
        c = p.model.sample(batch, noise=noise, generator=torch.Generator().manual_seed(3)).actions
    assert torch.equal(a, b) and not torch.allclose(b, c)  # only the step noise differs


def test_step_noise_is_refused_where_it_cannot_apply(policy_dir, tmp_path):
    from vlastack.infer.export import export_policy

    assert parse_decoding(["step_noise=0.3", "temperature=0.5"]) == {
        "step_noise": "0.3",
        "temperature": "0.5",
    }
    with pytest.raises(ValueError, match="--decode takes KEY=VALUE"):
        parse_decoding(["beam=4"])
    with pytest.raises(ConfigError, match="step_noise"):
        Policy.from_pretrained(policy_dir, decoding={"step_noise": "-1"})
    with pytest.raises(ValueError, match=r"unknown decoding option.*'temperature'"):
        Policy.from_pretrained(policy_dir, decoding={"temperature": "0.5"})  # a token head's key
    with pytest.raises(ValueError, match="fast path's static sampler is deterministic"):
        Policy.from_pretrained(policy_dir, decoding={"step_noise": "0.3"}, fast=True)
    p = Policy.from_pretrained(policy_dir, decoding={"step_noise": "0.3"})
    assert p.serving.rtc_methods == () and p.metadata["rtc_methods"] == []
    obs = {**make_obs(0), "action_prefix": np.zeros((4, 7), np.float32), "rtc_method": "rtc_inference"}
    with pytest.raises(ValueError, match="serve it with step_noise=0"):
        p.serving.answer_prefix([p.check(obs)], p.model_batch([p.check(obs)]))
    with pytest.raises(ValueError, match="export it with step_noise=0"):
        export_policy(p, "onnx", tmp_path / "export")
    oft = micro_config()
    from dataclasses import replace

    oft_model = build_model(replace(oft, head="oft", head_options=None))
    oft_model.save_pretrained(tmp_path / "oft")
    with pytest.raises(ValueError, match="does not take 'decoding'"):
        Policy.from_pretrained(tmp_path / "oft", decoding={"step_noise": "0.3"})


def test_lerobot_export_refuses_step_noise(tmp_path):
    from vlastack.config import apply_overrides, tiny
    from vlastack.infer.export_lerobot import export_lerobot

    cfg = apply_overrides(tiny(), ["model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1",
                                   "model.head_options.step_noise=0.2"])  # fmt: skip
    build_model(cfg.model).save_pretrained(tmp_path / "policy")
    with pytest.raises(ValueError, match=r"step_noise=0\.2"):
        export_lerobot(tmp_path / "policy", tmp_path / "lerobot")
    assert not (tmp_path / "lerobot").exists()
