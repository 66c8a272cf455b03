"""Token-head decoding options: greedy, temperature and top-p sampling (seeded), the hard cap on
generated tokens, the invalid-decode policy, and the decode step compiled with no graph breaks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tests.models.test_token_head import make, micro, train
from vlastack.config import ConfigError, TokenHeadConfig
from vlastack.infer.policy import Policy


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def fast_model():
    """A FAST head fitted to two chunks (its greedy decodes are valid)."""
    m, b = make(micro(tokenizer="fast", max_action_tokens=10))
    train(m, b, 30, 1e-2)
    return m.eval(), b


def test_config_checks():
    for bad in ({"top_p": 0.0}, {"top_p": 1.5}, {"max_decode_steps": -1}, {"invalid_decode": "skip"},
                {"sequence": "openvla"}, {"sequence": "pi0_fast"}):  # fmt: skip
        with pytest.raises(ConfigError):
            TokenHeadConfig(**bad)
    TokenHeadConfig(tokenizer="fast", sequence="pi0_fast", top_p=0.9, invalid_decode="repeat_last")


def test_pick_greedy_top_p_and_constraint(fast_model):
    m, _ = fast_model
    h = m.head
    v = h.allowed_ids.numel()
    allowed = h.allowed_ids.nonzero().flatten()
    logits = torch.full((1, v), -5.0)
    logits[0, allowed[:3]] = torch.tensor([3.0, 2.9, 0.0])  # top two hold ~0.9 of the mass
    logits[0, 0] = 100.0  # a disallowed id: never picked while constrained
    assert h.pick(logits, 0.0).item() == allowed[0]
    draws = torch.stack([h.pick(logits, 1.0, 0.8, torch.rand(1, v, generator=_gen(i))) for i in range(200)])
    assert set(draws.flatten().tolist()) == {allowed[0].item(), allowed[1].item()}
    assert h.pick(logits, 1.0, 1e-6, torch.rand(1, v)).item() == allowed[0]  # nucleus of one: greedy
    wide = {h.pick(logits, 1.0, 1.0, torch.rand(1, v, generator=_gen(i))).item() for i in range(300)}
    assert allowed[2].item() in wide and 0 not in wide


def test_sampling_is_seeded(fast_model):
    m, b = fast_model
    h = m.head
    with torch.no_grad():
        greedy, _ = h.generate(m, b)
        a, _ = h.generate(m, b, temperature=3.0, generator=_gen(1))
        a2, _ = h.generate(m, b, temperature=3.0, generator=_gen(1))
        c, _ = h.generate(m, b, temperature=3.0, generator=_gen(2))
        narrow, _ = h.generate(m, b, temperature=3.0, top_p=1e-6, generator=_gen(1))
    assert torch.equal(a, a2) and not torch.equal(a, c)
    assert torch.equal(narrow, greedy)  # top-p of one id is greedy at any temperature
    assert h.allowed_ids[a].all()


def test_cap_on_generated_tokens(fast_model):
    m, b = fast_model
    h = m.head
    full = h.num_steps
    assert full == m.cfg.head_options.max_action_tokens + 1
    with torch.no_grad():
        ids, lengths = h.generate(m, b)
        need = int(lengths.min())  # FAST tokens of the shorter sequence
        _, valid = m.sample(b)
        h.cfg = replace(h.cfg, head_options=replace(h.cfg.head_options, max_decode_steps=max(need - 1, 1)))
        try:
            capped, _ = h.generate(m, b)
            out, capped_valid = m.sample(b)
        finally:
            h.cfg = m.cfg
    assert capped.shape[1] == max(need - 1, 1) < full
    assert torch.equal(capped, ids[:, : capped.shape[1]])  # the cap cuts, it does not change tokens
    assert valid.all() and not capped_valid.any() and (out == 0).all()


def test_policy_invalid_decode_policy(fast_model, tmp_path):
    """zero: the invalid chunk is zeros, flagged; repeat_last: the last valid chunk, flagged and
    marked repeated; both counted in decode_stats; reset() forgets the last chunk."""
    from vlastack.models.heads import ActionOutput

    m, _ = fast_model
    m.save_pretrained(tmp_path / "p")
    obs = {"images": {"scene": np.zeros((16, 16, 3), np.uint8)}, "state": np.zeros(3, np.float32),
           "prompt": "go"}  # fmt: skip
    chunk = torch.arange(16, dtype=torch.float32).view(1, 4, 4) / 16
    script = iter([True, False, False, True])

    def sample(batch, noise=None, **kw):
        ok = next(script)
        return ActionOutput(chunk if ok else torch.zeros_like(chunk), torch.tensor([ok]))

    for name in ("zero", "repeat_last"):
        p = Policy.from_pretrained(tmp_path / "p")
        p.serving.invalid_decode = name
        p.model.sample = sample
        script = iter([True, False])
        ok, bad = p.infer(obs), p.infer(obs)
        assert ok["valid"] and not ok["repeated"] and not bad["valid"]
        assert bad["repeated"] == (name == "repeat_last")
        want = ok["actions"] if name == "repeat_last" else np.zeros_like(ok["actions"])
        np.testing.assert_array_equal(bad["actions"], want)
        assert p.decode_stats == {"chunks": 2, "invalid": 1, "repeated": int(name == "repeat_last")}
        script = iter([False])
        p.reset()  # a new episode forgets the last valid chunk
        again = p.infer(obs)
        assert not again["repeated"] and not again["actions"].any()


def test_policy_sampling_follows_its_seed(tmp_path):
    m, _ = make(micro(tokenizer="bins", temperature=2.0))
    m.save_pretrained(tmp_path)
    obs = {"images": {"scene": np.full((16, 16, 3), 90, np.uint8)}, "state": np.zeros(3, np.float32),
           "prompt": "go"}  # fmt: skip
    a = Policy.from_pretrained(tmp_path, seed=5).infer(obs)["actions"]
    b = Policy.from_pretrained(tmp_path, seed=5).infer(obs)["actions"]
    c = Policy.from_pretrained(tmp_path, seed=6).infer(obs)["actions"]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_decode_step_compiles_fullgraph_with_sampling(fast_model):
    """The per-token step with temperature and top-p sampling is one graph: torch.compile with
    fullgraph=True (which raises on any graph break; eager backend, so it checks the capture, not
    inductor codegen) decodes the same tokens as eager. Greedy: test_token_head.py's explain test."""
    import torch._dynamo as dynamo

    m, b = fast_model
    h = m.head
    step = h.decode_step
    with torch.no_grad():
        eager, _ = h.generate(m, b, 1.5, 0.9, generator=_gen(3))
        dynamo.reset()
        h.decode_step = torch.compile(step, fullgraph=True, dynamic=False, backend="eager")
        try:
            compiled, _ = h.generate(m, b, 1.5, 0.9, generator=_gen(3))
        finally:
            h.decode_step = step
            dynamo.reset()
    assert torch.equal(compiled, eager)


def test_length_constrained_fast_decodes_full_chunks():
    """exact_length: every FAST sequence that ends expands to exactly H*A DCT coefficients, so it
    decodes; without it, an untrained head's sampled sequences mostly end at the wrong count."""
    m, b = make(micro(tokenizer="fast", max_action_tokens=8))  # untrained; H=4 x 2 real dims = 8
    h = m.eval().head
    assert h.length_constrained and h.chunk_symbols == 8
    tok = h.tokenizer
    lengths = tok.piece_lengths()
    assert lengths.shape == (tok.placement.n,) and (lengths[: tok.bpe_vocab_size] >= 1).all()
    assert (lengths[tok.bpe_vocab_size :] == 9).all() and (lengths[: tok.bpe_vocab_size] == 1).sum() >= 8
    free = replace(m.cfg, head_options=replace(m.cfg.head_options, exact_length=False))
    valid = {}
    with torch.no_grad():
        for name, cfg in (("exact", m.cfg), ("free", free)):
            h.cfg = cfg
            rows = []
            for i in range(8):
                ids, lens = h.generate(m, b, temperature=1.0, generator=_gen(i))
                rows.append(h.decode_actions(ids, lens)[1])
                if name == "exact":  # each finished row wrote exactly H*A symbols
                    ended = lens < ids.shape[1]
                    assert ended.all()
                    written = torch.stack([h.piece_len[ids[r, : lens[r]]].sum() for r in range(2)])
                    assert (written == 8).all()
            valid[name] = torch.cat(rows).float().mean().item()
    h.cfg = m.cfg
    assert valid["exact"] == 1.0 and valid["free"] < 0.5, valid


def test_server_metrics_count_token_chunks():
    from vlastack.infer.metrics import Metrics

    stats = {"chunks": 5, "invalid": 2, "repeated": 1}
    text = Metrics(decode_stats=lambda: stats).render()
    assert 'vla_token_chunks_total{result="invalid"} 2' in text
    assert 'vla_token_chunks_total{result="repeated"} 1' in text
    assert "vla_token_chunks_total" not in Metrics().render()


def test_policy_decoding_options_override_the_config(fast_model, tmp_path):
    """Policy(decoding=...) / `vla serve --decode KEY=VALUE`: checked like config keys."""
    m, _ = fast_model
    m.save_pretrained(tmp_path / "p")
    p = Policy.from_pretrained(tmp_path / "p", decoding={"top_p": "0.5", "invalid_decode": "repeat_last"})
    assert (
        p.cfg.head_options.top_p == 0.5
        and p.model.head.cfg is p.cfg
        and p.serving.invalid_decode == "repeat_last"
    )
    with pytest.raises(ValueError, match="unknown decoding option"):
        Policy.from_pretrained(tmp_path / "p", decoding={"beam": 4})
    with pytest.raises(ConfigError, match="top_p"):
        Policy.from_pretrained(tmp_path / "p", decoding={"top_p": 2})


def test_eval_decode_options_reach_the_workers(fast_model, tmp_path, capsys):
    """`vla eval --decode KEY=VALUE`: a picklable Checkpoint spec that builds the Policy with those
    options in each worker; unknown keys are refused before any rollout."""
    import pickle

    from vlastack.cli import main
    from vlastack.sim.policies import Checkpoint, build_policy, policy_name

    m, _ = fast_model
    m.save_pretrained(tmp_path / "p")
    spec = pickle.loads(pickle.dumps(Checkpoint(str(tmp_path / "p"), (("exact_length", "false"),))))
    p = build_policy(spec)
    assert p.cfg.head_options.exact_length is False and policy_name(spec) == str(tmp_path / "p")
    assert main(["eval", "--policy", str(tmp_path / "p"), "--decode", "beam=4", "--episodes", "1"]) != 0
    assert "--decode takes KEY=VALUE" in capsys.readouterr().err


def _scripted(p: Policy, script: list[bool]) -> None:
    """``p.model.sample`` answers the rows of each call from ``script`` (True: a valid chunk, whose
    values count the calls so far; False: invalid zeros)."""
    from vlastack.models.heads import ActionOutput

    rows, calls = iter(script), iter(range(1, 1000))

    def sample(batch, noise=None, **kw):
        n, k = batch["state"].shape[0], next(calls)
        ok = torch.tensor([next(rows) for _ in range(n)])
        chunk = torch.full((n, 4, 4), 0.1 * k) * ok[:, None, None]
        return ActionOutput(chunk, ok)

    p.model.sample = sample


def test_repeat_last_keeps_one_chunk_per_stream(fast_model, tmp_path):
    """Episodes side by side (``infer_batch(streams=...)``) and a server's clients: an invalid
    chunk is replaced by the last valid chunk of its own stream, never another's; stream None
    (an HTTP request) keeps nothing; ``reset(stream)`` forgets one stream, ``reset()`` all."""
    m, _ = fast_model
    m.save_pretrained(tmp_path / "p")
    obs = {"images": {"scene": np.zeros((16, 16, 3), np.uint8)}, "state": np.zeros(3, np.float32),
           "prompt": "go"}  # fmt: skip
    p = Policy.from_pretrained(tmp_path / "p", decoding={"invalid_decode": "repeat_last"})
    assert p.batchable
    _scripted(p, [True, False, True, False, False, False, True, False, False, False])
    a1, b1 = p.infer_batch([obs, obs], streams=["a", "b"])  # call 1: a valid, b invalid
    assert a1["valid"] and not b1["valid"] and not b1["repeated"] and not b1["actions"].any()
    b2, a2 = p.infer_batch([obs, obs], streams=["b", "a"])  # call 2: b valid, a invalid
    assert b2["valid"] and a2["repeated"]
    np.testing.assert_array_equal(a2["actions"], a1["actions"])  # a's own chunk, not b's newer one
    assert not np.array_equal(a2["actions"], b2["actions"])
    p.reset("a")
    a3, b3 = p.infer_batch([obs, obs], streams=["a", "b"])  # call 3: both invalid
    assert not a3["repeated"] and not a3["actions"].any()
    assert b3["repeated"] and np.array_equal(b3["actions"], b2["actions"])
    # stream None: the valid chunk is not kept, so the invalid one after it stays zeros
    n1, n2 = p.infer_batch([obs, obs], streams=[None, None])
    assert n1["valid"] and not n2["valid"] and not n2["repeated"] and not n2["actions"].any()
    p.reset()
    (b4,) = p.infer_batch([obs], streams=["b"])
    assert not b4["repeated"] and not b4["actions"].any()
    with pytest.raises(ValueError, match="2 observations but 1 streams"):
        p.infer_batch([obs, obs], streams=["a"])


def test_server_repeat_last_stays_within_a_connection(fast_model, tmp_path):
    """Two websocket clients of one served token policy: one client's invalid chunk is never
    replaced by the other's; a client's own last chunk is; a closed connection's is forgotten."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from vlastack.infer.server import PolicyServer, ServerThread

    m, _ = fast_model
    m.save_pretrained(tmp_path / "p")
    obs = {"images": {"scene": np.zeros((16, 16, 3), np.uint8)}, "state": np.zeros(3, np.float32),
           "prompt": "go"}  # fmt: skip
    p = Policy.from_pretrained(tmp_path / "p", decoding={"invalid_decode": "repeat_last"})
    _scripted(p, [True, False, False])
    with ServerThread(PolicyServer(p, port=0, max_batch=1)) as srv:
        a = WebsocketClientPolicy("127.0.0.1", srv.port)
        b = WebsocketClientPolicy("127.0.0.1", srv.port)
        a1 = a.infer(obs)
        b1 = b.infer(obs)  # invalid, and b has no chunk of its own
        a2 = a.infer(obs)  # invalid: a's own chunk comes back
    assert a1["valid"] and not b1["valid"] and not b1["repeated"] and not np.asarray(b1["actions"]).any()
    assert a2["repeated"] and np.array_equal(a2["actions"], a1["actions"])
    assert p.serving._last_valid == {}  # every connection closed: nothing kept


@pytest.fixture(scope="module")
def bins_suite_ckpt(tmp_path_factory):
    """A bins token checkpoint with the built-in suite's state and actions, trained a little so
    its greedy ids are far from ties."""
    cfg = replace(micro(tokenizer="bins"), state_dim=5)
    m, b = make(cfg)
    train(m, b, 15, 1e-2)
    path = tmp_path_factory.mktemp("bins") / "p"
    m.eval().save_pretrained(path)
    return path, cfg


def test_token_batch_decodes_as_one_at_a_time(bins_suite_ckpt):
    """A token policy is batchable: greedy chunks of observations with different prompts and
    images decoded in one batch equal each decoded alone."""
    path, cfg = bins_suite_ckpt
    p = Policy.from_pretrained(path)
    assert p.batchable
    rng = np.random.default_rng(0)
    obs = [
        {
            "images": {c: rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for c in cfg.camera_names},
            "state": rng.standard_normal(5).astype(np.float32),
            "prompt": prompt,
        }
        for prompt in ("go", "pick up the red cube", "push it left")
    ]
    batched = p.infer_batch(obs, streams=[0, 1, 2])
    for o, got in zip(obs, batched, strict=True):
        np.testing.assert_array_equal(got["actions"], p.infer(o)["actions"])


@pytest.mark.integration
def test_token_episodes_side_by_side(bins_suite_ckpt, tmp_path):
    """The evaluator runs a token checkpoint's episodes side by side (``batch_episodes``, one
    batched decode per step) with the results of one at a time."""
    from vlastack.sim.evaluate import evaluate

    path, cfg = bins_suite_ckpt
    kw = dict(episodes=3, num_workers=0, max_steps=5, steps_per_chunk=1, videos=0, cameras=cfg.camera_names)
    one = evaluate(str(path), out_dir=tmp_path / "a", **kw)
    side = evaluate(str(path), out_dir=tmp_path / "b", batch_episodes=3, **kw)
    assert side["config"]["batch_episodes"] == 3 and one["config"]["batch_episodes"] == 1
    assert one["episodes"] == side["episodes"]
