"""Where ``vla rl``'s envs live changes nothing: rollouts through worker processes (or Ray actors)
equal rollouts in this process, episode for episode and sample for sample; a worker's error comes
back with its message."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.models.test_token_head import make, micro
from vlastack.config import ConfigError, load_config, save_yaml
from vlastack.infer.policy import Policy
from vlastack.rl.envs import EnvWorkers, make_pool
from vlastack.rl.rollout import collect

ENV_KW = {"suite": "builtin", "image_size": 32, "cameras": ("scene",), "max_steps": 8}
JOBS = [("reach", 5, 0), ("reach", 5, 0), ("push", 6, 1), ("push", 6, 1), ("reach", 7, 2)]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """A micro bins-token policy for the built-in suite (state 5, action 4)."""
    mcfg = replace(micro(tokenizer="bins"), state_dim=5, action_dim=4, camera_names=("scene",))
    model, _ = make(mcfg)
    path = tmp_path_factory.mktemp("policy")
    model.save_pretrained(path)
    cfg = load_config("tiny")
    save_yaml(replace(cfg, model=mcfg, eval=replace(cfg.eval, steps_per_chunk=2)), path / "config.yaml")
    return Policy.from_pretrained(path)


def _rollouts(policy, pool, iterations=2):
    """Two iterations through the same pool (the second reuses its envs), sampled at temperature 1."""
    rl = load_config("tiny").rl
    out = []
    try:
        for it in range(iterations):
            gen = torch.Generator().manual_seed(it)
            out.append(collect(policy, pool, JOBS, 2, lambda b, g=gen: policy.serving.rl_sample(b, rl, g)))
    finally:
        pool.close()
    return out


def _same(a, b):
    for ra, rb in zip(a, b, strict=True):
        assert ra.episodes == rb.episodes and ra.invalid_chunks == rb.invalid_chunks
        assert len(ra.decisions) == len(rb.decisions)
        for da, db in zip(ra.decisions, rb.decisions, strict=True):
            assert da.episode == db.episode and torch.equal(da.sample, db.sample)
            assert all((da.obs.images[k] == db.obs.images[k]).all() for k in da.obs.images)
            assert (da.obs.state == db.obs.state).all()


def test_worker_processes_roll_out_what_this_process_does(policy):
    local = _rollouts(policy, make_pool(ENV_KW))
    assert {e["steps"] for r in local for e in r.episodes} != {0}
    _same(local, _rollouts(policy, make_pool(ENV_KW, workers=2)))


def test_a_worker_error_comes_back_with_its_message(policy):
    pool = EnvWorkers(ENV_KW, 2)
    try:
        with pytest.raises(RuntimeError, match=r"rl env worker 0 failed(.|\n)*no_such_task"):
            pool.reset([(("no_such_task", 0), 0)])
    finally:
        pool.close()


@pytest.mark.slow
def test_ray_actors_roll_out_what_this_process_does(policy):
    ray = pytest.importorskip("ray")
    try:
        ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
        _same(_rollouts(policy, make_pool(ENV_KW)), _rollouts(policy, make_pool(ENV_KW, 2, "auto")))
    finally:
        ray.shutdown()


@pytest.mark.parametrize(
    "over, msg", [(["rl.env_workers=-1"], "env_workers"), (["rl.ray_address=auto"], "rl.env_workers > 0")]
)
def test_config_checks(over, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config("tiny", None, over)
