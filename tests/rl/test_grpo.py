"""``vla rl`` (GRPO on action tokens): the log-probabilities are those of the distribution the
decoder sampled from, the advantages and the clipped loss are GRPO's, and a run resumed from its
checkpoint ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

import vlastack.rl.runner as runner
from tests.models.test_token_head import make, micro, train
from vlastack.batch import dummy_batch
from vlastack.config import ConfigError, load_config, save_yaml
from vlastack.models import build_model
from vlastack.models.heads.flow.rl import flow_logprobs, flow_sample
from vlastack.models.heads.tokens.rl import sampled_logits, token_logprobs
from vlastack.rl.grpo import clipped_loss, group_advantages
from vlastack.rl.rollout import progress
from vlastack.rl.runner import RLRun, episode_rewards, rl_config


@pytest.fixture(scope="module", params=["fast", "bins"])
def trained(request):
    kw = {"max_action_tokens": 10} if request.param == "fast" else {}
    m, b = make(micro(tokenizer=request.param, **kw))
    train(m, b, 30, 1e-2)
    return m.eval(), b


def test_greedy_tokens_are_the_argmax_of_the_sampled_logits(trained):
    """The teacher-forced pass with pick's restrictions (FAST: pieces that still fit, the end id
    exactly when the chunk is full) reproduces the cached decoder's choices at every position."""
    m, b = trained
    with torch.no_grad():
        ids, _ = m.head.generate(m, b)
        logits, mask = sampled_logits(m, b, ids)
    assert mask[:, 0].all()
    assert torch.equal(logits.argmax(-1)[mask], ids[mask])
    logp, _ = token_logprobs(m, b, ids, 1.0)
    assert torch.isfinite(logp).all() and (logp[~mask] == 0).all()


def test_logprobs_match_the_sampling_frequencies(trained):
    """Samples at temperature 1.5 of the first two tokens, counted, against exp(logp)."""
    m, b = trained
    n = 3000
    big = {k: v[:1].expand(n, *v.shape[1:]).contiguous() for k, v in b.items()}
    with torch.no_grad():
        ids, _ = m.head.generate(m, big, temperature=1.5, generator=torch.Generator().manual_seed(0))
        logp, _ = token_logprobs(m, big, ids, 1.5)
    for pos in range(2):
        prefix = ids[:, :pos]
        # condition on the most common prefix (position 0: none)
        rows = torch.ones(n, dtype=torch.bool)
        if pos:
            common = torch.mode(prefix[:, 0]).values
            rows = prefix[:, 0] == common
        got = ids[rows, pos]
        vals, counts = got.unique(return_counts=True)
        freq = counts.float() / rows.sum()
        first = {
            int(t): float(lp) for t, lp in zip(got.tolist(), logp[rows, pos].exp().tolist(), strict=True)
        }
        prob = torch.tensor([first[int(v)] for v in vals])
        assert 0.5 * (freq - prob).abs().sum() + 0.5 * (1 - prob.sum()) < 0.06, (pos, freq, prob)


def test_group_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    adv, informative = group_advantages(r, g)
    assert informative.tolist() == [True] * 4 + [False, False, True, True]
    assert torch.allclose(adv[:4], torch.tensor([3.0, -1.0, -1.0, -1.0]) / 3**0.5, atol=1e-4)
    assert adv[4:6].eq(0).all() and torch.allclose(adv[6:], torch.tensor([-1.0, 1.0]), atol=1e-4)


def test_clipped_loss_is_the_policy_gradient_until_clipped():
    logp = torch.log(torch.tensor([[0.5, 0.2], [0.3, 0.9]])).requires_grad_()
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([1.0, -2.0])
    loss, st = clipped_loss(logp, logp.detach(), adv, mask, 0.2, 0.28)
    loss.backward()
    # ratio 1: d loss / d logp = -A / (sampled tokens), and 0 where nothing was sampled
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0], [2.0, 0.0]]) / 3)
    assert st["clip_fraction"] == 0 and st["ratio_dev"] == 0
    # a token whose ratio passed 1 + clip_high with a positive advantage gets no gradient
    new = (logp.detach() + torch.tensor([[0.5, 0.0], [0.0, 0.0]])).requires_grad_()
    loss, st = clipped_loss(new, logp.detach(), adv, mask, 0.2, 0.28)
    loss.backward()
    assert new.grad[0, 0] == 0 and new.grad[0, 1] != 0 and st["clip_fraction"] > 0
    ref = logp.detach() - 0.1
    _, st = clipped_loss(logp.detach(), logp.detach(), adv, mask, 0.2, 0.28, ref, 0.1)
    assert st["kl"] > 0


def test_progress_shapes_failures_below_any_success():
    assert progress(0.2, 0.05, False) == pytest.approx(0.75) and progress(0.2, 0.3, False) == 0.0
    assert progress(0.2, 0.3, True) == 1.0 and progress(None, 0.1, False) is None
    eps = [{"task": "push", "success": True, "progress": 1.0}, {"task": "push", "success": False, "progress": 0.5},
           {"task": "push", "success": False, "progress": 0.0}]  # fmt: skip
    assert episode_rewards(eps, 0.0).tolist() == [1.0, 0.0, 0.0]
    assert episode_rewards(eps, 0.4).tolist() == pytest.approx([1.0, 0.2, 0.0])
    # all failures, different progress: the group now carries a signal
    _, informative = group_advantages(episode_rewards(eps[1:], 0.4), torch.tensor([0, 0]))
    assert informative.all()
    with pytest.raises(ValueError, match="progress_reward=0"):
        episode_rewards([{"task": "x", "success": False, "progress": None}], 0.4)


def test_config_checks():
    for bad in ("rl.group_size=1", "rl.temperature=0", "rl.method=ppo", "rl.clip_low=1.5", "rl.iterations=0",
                "rl.progress_reward=1", "rl.progress_reward=-0.1", "rl.imitation_coef=-1",
                "rl.imitation_coef=0.5", "rl.imitation_batch=0"):  # fmt: skip
        with pytest.raises(ConfigError):
            load_config("tiny", None, [bad])


# ----------------------------------------------------------------------------- the loop


@pytest.fixture(params=["tokens", "flow"])
def rl_policy(request, tmp_path):
    """A micro policy for the built-in suite (state 5, action 4), identity statistics: bins tokens,
    or the tiny flow head cut to one layer per part."""
    if request.param == "tokens":
        mcfg = replace(micro(tokenizer="bins"), state_dim=5, action_dim=4, camera_names=("scene",))
        m, _ = make(mcfg)
    else:
        over = ["model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1", "model.vision.patch_size=16",
                "model.head_options.num_denoise_steps=3", "model.state_dim=5", "model.action_dim=4",
                "model.camera_names=[scene]"]  # fmt: skip
        mcfg = load_config("tiny", None, over).model
        torch.manual_seed(0)
        m = build_model(mcfg)
    path = tmp_path / "policy"
    m.save_pretrained(path)
    cfg = load_config("tiny")
    cfg = replace(cfg, model=mcfg, eval=replace(cfg.eval, steps_per_chunk=2, max_steps=6))
    save_yaml(cfg, path / "config.yaml")
    return path


def _reward_from_samples(monkeypatch):
    """Success = the parity of a number read off the episode's first sample (the sum of its token
    ids, or of its trajectory x 1000): a reward that depends on what was sampled (so groups
    disagree and the update runs) and costs no real task."""
    real = runner.collect

    def collect(*a, **kw):
        ro = real(*a, **kw)
        first = {}
        for d in ro.decisions:
            total = float(d.sample.double().sum())
            first.setdefault(
                d.episode, int(abs(total) * 1000) if d.sample.is_floating_point() else int(total)
            )
        for i, ep in enumerate(ro.episodes):
            ep["success"] = first[i] % 2 == 0
        return ro

    monkeypatch.setattr(runner, "collect", collect)


def _run(policy, out, iterations, resume=False):
    over = [f"rl.iterations={iterations}", "rl.groups=2", "rl.group_size=3", "rl.minibatch=16",
            "rl.epochs=2", "rl.lr=1e-3", "rl.kl_coef=0.1", "rl.tasks=[reach,push]", "rl.eval_every=2",
            "rl.eval_episodes=2"]  # fmt: skip
    return RLRun(policy, rl_config(policy, over), out, resume=resume).fit()


def test_resume_equals_uninterrupted(rl_policy, tmp_path, monkeypatch):
    _reward_from_samples(monkeypatch)
    _run(rl_policy, tmp_path / "a", 2)
    _run(rl_policy, tmp_path / "b", 1)
    _run(rl_policy, tmp_path / "b", 2, resume=True)
    wa, wb = (load_file(tmp_path / r / "final" / "model.safetensors") for r in ("a", "b"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    w0 = load_file(rl_policy / "model.safetensors")
    assert any(not torch.equal(w0[k], wa[k]) for k in wa)  # it did learn something

    def rows(r):
        out = [json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in x.items() if not k.endswith("_s")} for x in out]

    assert rows("a") == rows("b") and [r["iteration"] for r in rows("a")] == [0, 1]
    assert "val_success" in rows("a")[1] and set(rows("a")[1]["val_by_task"]) == {"reach", "push"}
    # the start on the same validation seeds, once per run (not again on resume)
    starts = [json.loads((tmp_path / r / "validation_start.json").read_text()) for r in ("a", "b")]
    assert starts[0] == starts[1] and set(starts[0]["val_by_task"]) == {"reach", "push"}
    assert rows("a")[0]["decisions_used"] > 0 and rows("a")[0]["ratio_dev"] > 0  # epoch 2 moved it
    assert not (tmp_path / "a" / "final" / "train_state").exists()
    assert "RL: success per iteration" in (tmp_path / "a" / "report.html").read_text()
    assert (tmp_path / "a" / "checkpoints" / "step_0000002" / "train_state").is_dir()


@pytest.mark.parametrize("rl_policy", ["tokens"], indirect=True)
def test_a_task_named_twice_gets_twice_the_groups(rl_policy, tmp_path):
    over = ["rl.iterations=1", "rl.groups=3", "rl.group_size=2", "rl.tasks=[reach,reach,push]",
            "rl.eval_every=1", "rl.eval_episodes=2"]  # fmt: skip
    cfg = rl_config(rl_policy, over)
    assert [t for t, _, g in runner.iteration_jobs(cfg.rl, cfg.rl.tasks, 0)][::2] == [
        "reach",
        "reach",
        "push",
    ]
    RLRun(rl_policy, cfg, tmp_path).fit()
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["success_by_task"].keys() == row["val_by_task"].keys() == {"reach", "push"}


@pytest.mark.parametrize("rl_policy", ["tokens"], indirect=True)
def test_resume_trains_at_the_changed_lr(rl_policy, tmp_path, monkeypatch):
    """The optimizer's saved state holds the first run's lr; a resume with rl.lr=... uses its own."""
    _reward_from_samples(monkeypatch)
    over = ["rl.groups=2", "rl.group_size=2", "rl.tasks=[reach]", "rl.lr=1e-3", "rl.weight_decay=0.0"]
    RLRun(rl_policy, rl_config(rl_policy, ["rl.iterations=1", *over]), tmp_path).fit()
    more = [*over, "rl.iterations=2", "rl.lr=5e-3", "rl.weight_decay=0.1"]
    run = RLRun(rl_policy, rl_config(rl_policy, more), tmp_path, resume=True)
    assert run.start == 1 and run.opt.state  # the optimizer's moments were loaded ...
    assert all(g["lr"] == 5e-3 and g["weight_decay"] == 0.1 for g in run.opt.param_groups)  # ... not its lr
    run.pool.close()


@pytest.mark.parametrize("rl_policy", ["tokens"], indirect=True)  # the reward is the loop's, not the head's
def test_progress_reward_trains_on_all_failure_groups(rl_policy, tmp_path):
    """The untrained micro policy fails every real episode: the sparse reward leaves nothing to
    learn from, the shaped one ranks the failures by how close they came."""
    over = ["rl.iterations=1", "rl.groups=2", "rl.group_size=3", "rl.tasks=[reach]", "rl.minibatch=16"]
    rows = {}
    for w in (0.0, 0.5):
        RLRun(rl_policy, rl_config(rl_policy, [*over, f"rl.progress_reward={w}"]), tmp_path / str(w)).fit()
        rows[w] = json.loads((tmp_path / str(w) / "metrics.jsonl").read_text().splitlines()[0])
    assert rows[0.0]["success"] == rows[0.5]["success"] == 0.0
    assert rows[0.0]["decisions_used"] == 0 and "reward" not in rows[0.0]
    assert rows[0.5]["informative_groups"] == 2 and rows[0.5]["decisions_used"] == rows[0.5]["decisions"]
    assert 0 < rows[0.5]["reward"] < 0.5


@pytest.mark.parametrize("rl_policy", ["flow"], indirect=True)
def test_imitation_anchor_adds_the_training_loss_on_demonstrations(rl_policy, tmp_path, monkeypatch):
    """rl.imitation_coef: every gradient step adds the policy's training loss on demonstration
    frames, drawn per (iteration, step) so a resume draws the same; without it the same rollouts
    train other weights."""
    from vlastack.sim.generate import generate

    demos = tmp_path / "demos"
    generate(demos, tasks=("reach",), episodes=2, workers=0, seed=0, progress=False, resumable=False,
             video_quality="lossless")  # fmt: skip
    _reward_from_samples(monkeypatch)
    over = ["rl.iterations=1", "rl.groups=2", "rl.group_size=3", "rl.tasks=[reach]", "rl.minibatch=4",
            f"rl.imitation_data={demos}", "rl.imitation_batch=4"]  # fmt: skip
    for coef in (0.0, 1.0):
        RLRun(
            rl_policy, rl_config(rl_policy, [*over, f"rl.imitation_coef={coef}"]), tmp_path / str(coef)
        ).fit()
    rows = {c: json.loads((tmp_path / str(c) / "metrics.jsonl").read_text()) for c in (0.0, 1.0)}
    assert rows[0.0]["gradient_steps"] > 0 and "imitation_loss" not in rows[0.0]
    assert rows[1.0]["imitation_loss"] > 0
    w = {c: load_file(tmp_path / str(c) / "final" / "model.safetensors") for c in (0.0, 1.0)}
    assert any(not torch.equal(w[0.0][k], w[1.0][k]) for k in w[0.0])
    run = RLRun(rl_policy, rl_config(rl_policy, [*over, "rl.imitation_coef=1"]), tmp_path / "again")
    model = run.policy.model
    with torch.no_grad():
        a, b, c = (run.anchor.loss(model, it, s) for it, s in ((3, 1), (3, 1), (3, 2)))
    assert torch.equal(a, b) and not torch.equal(a, c)
    run.pool.close()
    with pytest.raises(ValueError, match="no such dataset"):
        RLRun(rl_policy, rl_config(rl_policy, [*over[:-2], "rl.imitation_coef=1",
                                               f"rl.imitation_data={tmp_path / 'none'}"]), tmp_path / "x")  # fmt: skip


@pytest.mark.parametrize("rl_policy", ["tokens"], indirect=True)  # the choice is the loop's, not the head's
def test_best_is_the_best_validated_iteration_across_a_resume(rl_policy, tmp_path, monkeypatch):
    """Validation scores 0.5, 0.8, 0.8 (scripted; the start 0.9, validated once per run and never
    a candidate): best/ holds iteration 2's weights (the earliest on a tie, not the final ones),
    and a run resumed after iteration 2 keeps it."""
    _reward_from_samples(monkeypatch)
    scores = iter([0.9, 0.5, 0.8, 0.8, 0.9, 0.5, 0.8, 0.8])
    monkeypatch.setattr(RLRun, "validate", lambda self: {"val_success": next(scores), "val_by_task": {}})
    over = ["rl.groups=2", "rl.group_size=3", "rl.minibatch=16", "rl.tasks=[reach]", "rl.eval_every=1",
            "rl.keep_last=1", "rl.lr=1e-3"]  # fmt: skip
    RLRun(rl_policy, rl_config(rl_policy, ["rl.iterations=3", *over]), tmp_path / "a").fit()
    RLRun(rl_policy, rl_config(rl_policy, ["rl.iterations=2", *over]), tmp_path / "b").fit()
    RLRun(rl_policy, rl_config(rl_policy, ["rl.iterations=3", *over]), tmp_path / "b", resume=True).fit()
    weights = {r: load_file(tmp_path / r / "best" / "model.safetensors") for r in ("a", "b")}
    for r in ("a", "b"):
        assert json.loads((tmp_path / r / "best.json").read_text()) == {"iteration": 2, "val_success": 0.8}
        assert all(torch.equal(weights["a"][k], v) for k, v in weights[r].items())
    final = load_file(tmp_path / "a" / "final" / "model.safetensors")
    assert any(not torch.equal(weights["a"][k], final[k]) for k in final)
    assert (tmp_path / "a" / "best" / "config.yaml").is_file()
    assert not (tmp_path / "a" / "best" / "train_state").exists()
    assert json.loads((tmp_path / "b" / "validation_start.json").read_text())["val_success"] == 0.9


@pytest.mark.parametrize(
    "overrides", [["model.head=oft"], ["model.head=tokens", "model.head_options.decoding=parallel"]]
)
def test_refuses_heads_it_cannot_train(tmp_path, overrides):
    """A head whose serving class has no RL sampler (OFT), or a token head decoding in parallel."""
    cfg = load_config("tiny", None, overrides)
    build_model(cfg.model).save_pretrained(tmp_path / "p")
    save_yaml(cfg, tmp_path / "p" / "config.yaml")
    with pytest.raises(ValueError, match="samples no per-token or per-step distribution"):
        RLRun(tmp_path / "p", rl_config(tmp_path / "p", []), tmp_path / "out")


def test_flow_logprobs_are_those_of_the_noisy_sampler():
    """The batched uncached pass gives each step's Gaussian log-density of what the cached noisy
    sampler drew: the standardized residual is exactly the noise it added."""
    over = [
        "model.vision.depth=1",
        "model.vlm.depth=1",
        "model.expert.depth=1",
        "model.head_options.noise_scale=1.0",
    ]
    cfg = load_config("tiny", None, over).model
    torch.manual_seed(0)
    m = build_model(cfg).eval()
    b = dummy_batch(cfg, 3)
    sigma, n = 0.3, cfg.head_options.num_denoise_steps
    with torch.no_grad():
        _, traj = flow_sample(m, b, sigma, torch.Generator().manual_seed(1))
        logp, mask = flow_logprobs(m, b, traj, sigma, real_dims=cfg.action_dim)
        first2 = flow_logprobs(m, b, traj, sigma, real_dims=cfg.action_dim, horizon=2)[0]
    g = torch.Generator().manual_seed(1)
    shape = traj[:, 0].shape
    torch.randn(shape, generator=g)  # x_0
    eps = torch.stack([torch.randn(shape, generator=g) for _ in range(n)], dim=1)  # [B, n, H, A]
    std = sigma * (1.0 / n) ** 0.5
    want = (-0.5 * eps.pow(2) - math.log(std) - 0.5 * math.log(2 * math.pi)).sum((-1, -2))
    assert mask.all() and logp.shape == (3, n)
    assert torch.allclose(logp, want, atol=1e-3, rtol=1e-4), (logp - want).abs().max()
    # rl.flow_logp_steps = 2: only the chunk's first two actions (the executed ones) are credited
    want2 = (-0.5 * eps[:, :, :2].pow(2) - math.log(std) - 0.5 * math.log(2 * math.pi)).sum((-1, -2))
    assert torch.allclose(first2, want2, atol=1e-3, rtol=1e-4), (first2 - want2).abs().max()


def test_flow_logp_steps_is_checked():
    with pytest.raises(ValueError, match="flow_logp_steps"):
        load_config("tiny", None, ["rl.flow_logp_steps=-1"])
    h = load_config("tiny", None, []).model.action_horizon
    with pytest.raises(ValueError, match="flow_logp_steps"):
        load_config("tiny", None, [f"rl.flow_logp_steps={h + 1}"])
