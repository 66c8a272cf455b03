"""Inference fast path (models/heads/flow/fastpath.py): a prepared model (fused QKV and gate/up, norms folded,
time branch precomputed) samples the same actions as the original, in fp32 on the CPU, through
the same static function a CUDA graph captures; the GPU tests check graph == eager."""

from __future__ import annotations

import copy
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from vlastack.batch import dummy_batch
from vlastack.config import load_config
from vlastack.infer.policy import Policy
from vlastack.models import build_model
from vlastack.models.heads.flow.fastpath import (
    FastFlow,
    FusedAttentionProj,
    StaticSampler,
    UnitRMSNorm,
    compile_layers,
    fast_velocity,
    fuse_projections,
    prepare_for_inference,
    uncompile_layers,
)
from vlastack.nn.lora import apply_lora
from vlastack.nn.norms import AdaRMSNorm, LayerNorm, RMSNorm

ATOL = 1e-5


def _model(variant: str, **kw):
    cfg = load_config("tiny", overrides=[f"model.head_options.variant={variant}"]).model
    cfg = replace(cfg, **kw).with_head_options(num_denoise_steps=4)
    torch.manual_seed(0)
    m = build_model(cfg).eval()
    with torch.no_grad():  # non-trivial norm scales and open adaptive norms (zero at init)
        for mod in m.modules():
            if isinstance(mod, RMSNorm | LayerNorm):
                mod.weight.normal_(0, 0.3)
            if isinstance(mod, LayerNorm):
                mod.bias.normal_(0, 0.3)
            if isinstance(mod, AdaRMSNorm):
                mod.dense.weight.normal_(0, 0.05), mod.dense.bias.normal_(0, 0.5)
    return m


def _noise(cfg, b, seed=1):
    return torch.randn(b, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=["pi0", "pi05"])
def pair(request):
    ref = _model(request.param)
    fast = prepare_for_inference(copy.deepcopy(ref), torch.float32)
    return ref, fast


def test_prepared_modules(pair):
    _, fast = pair
    block = fast.decoder.layers[0].vlm
    assert isinstance(block.self_attn, FusedAttentionProj) and isinstance(block.input_layernorm, UnitRMSNorm)
    assert not any(isinstance(m, RMSNorm) for m in fast.decoder.layers.modules())  # all folded or adaptive
    assert not any(p.requires_grad for p in fast.parameters())


@torch.no_grad()
def test_velocity_matches_denoise_step(pair):
    ref, fast = pair
    cfg = ref.cfg
    batch = dummy_batch(cfg, 2, train=False)
    x = _noise(cfg, 2)
    c_ref, pos, mask, state = ref.head.prefill(ref, batch)
    c_fast, pos2, mask2, state2 = fast.head.prefill(fast, batch)
    for a, b in zip(c_ref.k + c_ref.v, c_fast.k + c_fast.v):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=ATOL)
    n = cfg.head_options.num_denoise_steps
    for i in (0, n - 1):
        t = torch.full((2,), 1.0 - i / n)
        v_ref = ref.head.denoise_step(ref, c_ref, state, x, t, pos, mask)
        v_fast = fast_velocity(fast, c_fast, state2, x, fast.fast_time.rows[i], pos2, mask2)
        torch.testing.assert_close(v_fast, v_ref, atol=ATOL, rtol=ATOL)


def test_static_sampler_matches_sample(pair):
    ref, fast = pair
    cfg = ref.cfg
    sampler = StaticSampler(fast, graph=True)  # graph is ignored on the CPU: same function, eager
    for seed in (0, 1):  # the second call reuses the buffers and the cache
        batch = dummy_batch(cfg, 2, train=False, seed=seed)
        noise = _noise(cfg, 2, seed)
        want = ref.sample_actions(batch, noise=noise)
        with torch.inference_mode():
            got = sampler(batch, noise)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)
    with pytest.raises(ValueError, match="per batch size"):
        sampler(dummy_batch(cfg, 3, train=False), _noise(cfg, 3))


def test_token_head_unaffected():
    over = ["model.head=tokens", "model.action_horizon=4", "model.action_dim=4", "eval.steps_per_chunk=4"]
    over.append("model.head_options.decoding=parallel")  # one pass (autoregressive decoding takes 7 s here)
    cfg = load_config("tiny", overrides=over).model
    torch.manual_seed(0)
    ref = build_model(cfg).eval()
    with torch.no_grad():
        for mod in ref.modules():
            if isinstance(mod, RMSNorm):
                mod.weight.normal_(0, 0.3)
    fast = prepare_for_inference(copy.deepcopy(ref), torch.float32)
    assert not hasattr(fast, "fast_time")
    batch = dummy_batch(cfg, 2, train=False)
    with torch.no_grad():
        h_ref = ref.decoder.logits(
            ref.decoder([ref.embed_prefix(batch)[0], None], *_plain_args(ref, batch)).vlm
        )
        h_fast = fast.decoder.logits(
            fast.decoder([fast.embed_prefix(batch)[0], None], *_plain_args(fast, batch)).vlm
        )
    torch.testing.assert_close(h_fast, h_ref, atol=1e-4, rtol=1e-4)
    a_ref, a_fast = ref.sample(batch), fast.sample(batch)
    torch.testing.assert_close(a_fast.actions, a_ref.actions)
    assert torch.equal(a_fast.valid, a_ref.valid)


def _plain_args(model, batch):
    from vlastack.nn.attention import block_causal_mask

    _, pad = model.embed_prefix(batch)
    return pad.long().cumsum(-1) - 1, block_causal_mask(pad, pad.new_zeros(pad.shape[1]))


def test_fused_model_still_samples_and_refuses_lora():
    ref = _model("pi0")
    fused = fuse_projections(copy.deepcopy(ref))  # without the time tables model.sample still works
    batch, noise = dummy_batch(ref.cfg, 2, train=False), _noise(ref.cfg, 2)
    torch.testing.assert_close(
        fused.sample_actions(batch, noise=noise), ref.sample_actions(batch, noise=noise), atol=ATOL, rtol=ATOL
    )
    lora = copy.deepcopy(ref)
    apply_lora(lora, [r"q_proj"], rank=2)
    with pytest.raises(ValueError, match="merge LoRA"):
        prepare_for_inference(lora, torch.float32)


def test_bf16_prepared_close_to_fp32():
    ref = _model("pi05")
    fast = prepare_for_inference(copy.deepcopy(ref), torch.bfloat16)
    assert fast.decoder.layers[0].vlm.self_attn.qkv_proj.weight.dtype == torch.bfloat16
    batch, noise = dummy_batch(ref.cfg, 2, train=False), _noise(ref.cfg, 2)
    want = ref.sample_actions(batch, noise=noise)
    with torch.inference_mode():
        got = StaticSampler(fast)(batch, noise)
    assert got.dtype == torch.float32
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 0.05, rel


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_policy_fast_matches_policy(variant):
    ref = _model(variant)
    slow, fast = Policy(ref), Policy(copy.deepcopy(ref), fast=True)
    cfg, rng = ref.cfg, np.random.default_rng(0)
    obs = [
        {
            "images": {c: rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for c in cfg.camera_names},
            "state": rng.normal(size=cfg.state_dim).astype(np.float32),
            "prompt": f"pick {i}",
        }
        for i in range(2)
    ]
    checked = [slow.check(o) for o in obs]
    for n in (1, 2):  # a second batch size gets its own static sampler
        noise = _noise(cfg, n)
        want = slow.infer_checked(checked[:n], noise)
        got = fast.infer_checked(checked[:n], noise)
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=ATOL)
    assert sorted(fast.serving.fast_sampler.samplers) == [1, 2]
    assert fast.infer(obs[0])["actions"].shape == (cfg.action_horizon, fast.action_dim)


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_policy_fast_runs_real_time_chunking(variant):
    """RTC's guided sampling and BID are not the fixed Euler schedule: on a prepared pi0.5 model
    they need the adaptive norms' own dense layers (``generic_time``), not the step tables (they
    raised an AssertionError before). pi0's training-time RTC runs the static prefix sampler and
    BID's candidates the plain one. Same noise and seed -> the same actions."""
    ref = _model(variant)
    slow, fast = Policy(ref, seed=3), Policy(copy.deepcopy(ref), fast=True, seed=3)
    cfg, rng = ref.cfg, np.random.default_rng(0)
    h = cfg.action_horizon
    obs = {
        "images": {c: rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for c in cfg.camera_names},
        "state": rng.normal(size=cfg.state_dim).astype(np.float32),
        "prompt": "pick",
        "action_prefix": rng.normal(size=(h // 2, cfg.action_dim)).astype(np.float32),
        "inference_delay": 2,
    }
    methods = ["rtc_inference", "bid"] + (["rtc_training"] if variant == "pi0" else [])
    for method in methods:
        o = dict(obs, rtc_method=method)
        want, got = slow.infer(o)["actions"], fast.infer(o)["actions"]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=method)
    # pi0's training-time RTC runs the static prefix sampler, BID's 8 candidates the plain one at
    # batch 8 (each one CUDA graph on a GPU)
    assert sorted(fast.serving.fast_sampler.prefix_samplers) == ([1] if variant == "pi0" else [])
    assert sorted(fast.serving.fast_sampler.samplers) == [fast.serving.bid_samples]
    # the tables are back: the fast sampler still matches after the generic calls
    plain = {k: v for k, v in obs.items() if k not in ("action_prefix", "inference_delay")}
    checked, noise = [slow.check(plain)], _noise(cfg, 1)
    np.testing.assert_allclose(
        fast.infer_checked(checked, noise), slow.infer_checked(checked, noise), atol=ATOL, rtol=ATOL
    )


@torch.no_grad()
def test_prefix_sampler_matches_prefix_sample():
    """Training-time RTC on the prepared pi0 model (StaticSampler(prefix=True): the committed
    steps at time 0 from ``zero_row``) equals ``prefix_sample`` on the original, per sample
    prefix lengths (none, some, the whole chunk); the committed steps come back exactly."""
    from vlastack.models.heads.flow.rtc import prefix_sample

    ref = _model("pi0")
    fast = prepare_for_inference(copy.deepcopy(ref), torch.float32)
    cfg, h = ref.cfg, ref.cfg.action_horizon
    batch, noise = dummy_batch(cfg, 3, train=False), _noise(cfg, 3)
    prefix = _noise(cfg, 3, seed=7)
    n = torch.tensor([0, 3, h])
    sampler = StaticSampler(fast, prefix=True)
    for _ in range(2):  # the second call reuses the buffers
        got = sampler(batch, noise, prefix, n)
        want = prefix_sample(ref.head, ref, batch, prefix, n, noise)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)
    assert torch.equal(got[1, :3], prefix[1, :3]) and torch.equal(got[2], prefix[2])
    assert not torch.allclose(got[0, :3], prefix[0, :3])
    with pytest.raises(ValueError, match="prefix=True"):
        sampler(batch, noise)
    with pytest.raises(ValueError, match="prefix=True"):
        StaticSampler(fast)(batch, noise, prefix, n)
    with pytest.raises(ValueError, match="variant='pi0'"):
        StaticSampler(prepare_for_inference(_model("pi05"), torch.float32), prefix=True)


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_policy_warmup_builds_every_sampler_and_keeps_the_draws(variant):
    """``Policy.warmup`` (``vla serve --warmup``) runs each sampling method once, so the fast
    path's samplers exist (compiled and captured on a GPU) before the first request, and restores
    the generator: a warmed-up policy answers what a fresh one with the same seed does."""
    ref = _model(variant)
    warm, fresh = Policy(copy.deepcopy(ref), fast=True, seed=5), Policy(copy.deepcopy(ref), fast=True, seed=5)
    took = warm.warmup()
    want = (
        ["plain", "rtc_inference", "rtc_training", "bid"]
        if variant == "pi0"
        else ["plain", "rtc_inference", "bid"]
    )
    assert list(took) == want and all(t >= 0 for t in took.values())
    assert sorted(warm.serving.fast_sampler.samplers) == [1, warm.serving.bid_samples]
    assert sorted(warm.serving.fast_sampler.prefix_samplers) == ([1] if variant == "pi0" else [])
    cfg, rng = ref.cfg, np.random.default_rng(0)
    obs = {
        "images": {c: rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for c in cfg.camera_names},
        "state": rng.normal(size=cfg.state_dim).astype(np.float32),
        "prompt": "pick",
    }
    np.testing.assert_allclose(warm.infer(obs)["actions"], fresh.infer(obs)["actions"], atol=ATOL, rtol=ATOL)
    with pytest.raises(ValueError, match="cannot warm up"):
        warm.warmup(("plain", "rtc_training") if variant == "pi05" else "sideways")


def test_policy_fast_refuses_token_head():
    cfg = load_config("tiny", overrides=["model.head=tokens"]).model
    with pytest.raises(ValueError, match="does not take 'fast'"):
        Policy(build_model(cfg), fast=True)


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile with dynamo's eager backend: traced and guarded like the real thing, without
    inductor's codegen, so compile tests stay quick."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": "eager"}))


@pytest.mark.integration
@pytest.mark.parametrize("variant,prefix", [("pi05", False), ("pi0", True)])
def test_static_sampler_compiles_whole_without_graph_breaks(variant, prefix):
    """The unrolled sampler traces as one graph (fullgraph=True; the eager backend: no codegen),
    the training-time RTC one (pi0, ``prefix=True``) too."""
    torch._dynamo.reset()
    fast = prepare_for_inference(_model(variant, action_horizon=4), torch.float32)
    sampler = StaticSampler(fast, prefix=prefix)
    batch, noise = dummy_batch(fast.cfg, 1, train=False), _noise(fast.cfg, 1)
    extra = (_noise(fast.cfg, 1, seed=5), torch.tensor([2])) if prefix else ()
    with torch.inference_mode():
        sampler(batch, noise, *extra)
        want = sampler.out.clone()
        t0 = time.perf_counter()
        torch.compile(sampler.run, fullgraph=True, dynamic=False, backend="eager")()
    print(f"dynamo trace of the whole sampler: {time.perf_counter() - t0:.1f} s")
    torch.testing.assert_close(sampler.out, want)
    torch._dynamo.reset()


@pytest.mark.integration
def test_compiled_samplers_for_many_batch_sizes_do_not_hit_the_recompile_limit(eager_compile):
    """Each batch size is one more compiled variant of the same step and prefill; with fullgraph
    dynamo refuses the one past its recompile limit (8 by default) with an error. A compiling
    sampler raises the limit (here from 2, with dynamo's eager backend to keep it quick)."""
    import torch._dynamo

    torch._dynamo.reset()
    fast = prepare_for_inference(_model("pi0", action_horizon=4), torch.float32)
    # config.patch, not monkeypatch: the config module keeps its values outside __dict__, and
    # monkeypatch's undo deleted the entry (a later torch.export then failed)
    with torch._dynamo.config.patch(recompile_limit=2), torch.inference_mode():
        for b in (1, 2, 3):
            batch, noise = dummy_batch(fast.cfg, b, train=False), _noise(fast.cfg, b)
            got = StaticSampler(fast, compile=True)(batch, noise)
            torch.testing.assert_close(got, StaticSampler(fast)(batch, noise), atol=ATOL, rtol=ATOL)
        assert torch._dynamo.config.recompile_limit >= 64
    torch._dynamo.reset()


@pytest.mark.integration
def test_compile_mode_reaches_torch_compile_and_capturing_modes_are_refused(monkeypatch):
    """``compile_mode`` goes to torch.compile for the prefill and the step, through FastFlow and
    Policy; modes that capture CUDA graphs themselves (inside our capture) get a ValueError."""
    real_compile = torch.compile
    modes = []

    def spy(fn, **kw):
        modes.append(kw.get("mode"))
        return real_compile(fn, **{**kw, "mode": None, "backend": "eager"})

    monkeypatch.setattr(torch, "compile", spy)
    torch._dynamo.reset()
    fast = prepare_for_inference(_model("pi0", action_horizon=4), torch.float32)
    batch, noise = dummy_batch(fast.cfg, 1, train=False), _noise(fast.cfg, 1)
    with torch.inference_mode():
        got = StaticSampler(fast, compile=True, compile_mode="max-autotune-no-cudagraphs")(batch, noise)
        torch.testing.assert_close(got, StaticSampler(fast)(batch, noise), atol=ATOL, rtol=ATOL)
    assert modes == ["max-autotune-no-cudagraphs"] * 2
    flow = FastFlow(fast, graph=False, compile=True, compile_mode="max-autotune-no-cudagraphs")
    with torch.inference_mode():
        flow(batch, noise)
    assert modes[2:] == ["max-autotune-no-cudagraphs"] * 2
    for bad in ("reduce-overhead", "max-autotune", "fast"):
        with pytest.raises(ValueError, match="compile mode"):
            StaticSampler(fast, compile=True, compile_mode=bad)
        with pytest.raises(ValueError, match="compile mode"):
            Policy(_model("pi0", action_horizon=4), fast=True, compile=True, compile_mode=bad)
    with pytest.raises(ValueError, match="fast=True with compile=True"):
        Policy(_model("pi0", action_horizon=4), compile=True, compile_mode="default")
    torch._dynamo.reset()


@pytest.mark.integration
@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_layers_scope_compiles_one_graph_per_call_kind_at_any_depth(variant, eager_compile):
    """compile_scope="layers": the decoder layer and the SigLIP block are compiled once per kind
    of call (prefill, last prefill layer, denoise step) and shared by every layer, so deeper
    models add no graphs; the result equals the eager sampler's, and the training-time RTC
    sampler reuses them. (Dynamo's eager backend: the graph count, not inductor's codegen.)"""
    from torch._dynamo.utils import counters

    graphs = []
    for depth in (2, 4):
        torch._dynamo.reset()
        counters.clear()
        cfg = load_config("tiny", overrides=[f"model.head_options.variant={variant}"]).model
        cfg = replace(
            cfg,
            vlm=replace(cfg.vlm, depth=depth),
            expert=replace(cfg.expert, depth=depth),
            vision=replace(cfg.vision, depth=depth),
        ).with_head_options(num_denoise_steps=3)
        torch.manual_seed(0)
        fast = prepare_for_inference(build_model(cfg).eval(), torch.float32)
        batch, noise = dummy_batch(cfg, 1, train=False), _noise(cfg, 1)
        with torch.inference_mode():
            want = StaticSampler(fast)(batch, noise)
            got = StaticSampler(fast, compile=True, compile_scope="layers")(batch, noise)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)
            graphs.append(counters["stats"]["unique_graphs"])
            if variant == "pi0":
                extra = (_noise(cfg, 1, seed=5), torch.tensor([1]))
                got = StaticSampler(fast, compile=True, compile_scope="layers", prefix=True)(
                    batch, noise, *extra
                )
                want = StaticSampler(fast, prefix=True)(batch, noise, *extra)
                torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)
                assert counters["stats"]["unique_graphs"] == graphs[-1]  # nothing new to compile
        assert fast._compiled_layers == "default"
        uncompile_layers(fast)
        assert "forward" not in fast.decoder.layers[0].__dict__
    assert 0 < graphs[0] == graphs[1] <= 6, graphs
    with pytest.raises(ValueError, match="compile_scope"):
        StaticSampler(fast, compile=True, compile_scope="model")
    compile_layers(fast)
    with pytest.raises(ValueError, match="already compiled"):
        compile_layers(fast, "max-autotune-no-cudagraphs")
    torch._dynamo.reset()


@pytest.mark.integration
def test_policy_warmup_with_layers_scope_runs_every_sampler(eager_compile):
    """``vla serve --warmup --compile-scope layers``: every sampling method, the VJP-guided one
    too (autograd through the compiled layers), runs and answers as an uncompiled policy."""
    torch._dynamo.reset()
    ref = _model("pi0")
    warm = Policy(copy.deepcopy(ref), fast=True, compile=True, compile_scope="layers", seed=5)
    fresh = Policy(copy.deepcopy(ref), fast=True, seed=5)
    assert list(warm.warmup()) == ["plain", "rtc_inference", "rtc_training", "bid"]
    rng = np.random.default_rng(0)
    obs = {
        "images": {c: rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for c in ref.cfg.camera_names},
        "state": rng.normal(size=ref.cfg.state_dim).astype(np.float32),
        "prompt": "pick",
    }
    np.testing.assert_allclose(warm.infer(obs)["actions"], fresh.infer(obs)["actions"], atol=ATOL, rtol=ATOL)
    torch._dynamo.reset()


def test_policy_layers_scope_matches_policy(eager_compile):
    torch._dynamo.reset()
    ref = _model("pi0", action_horizon=4)
    slow = Policy(copy.deepcopy(ref), fast=True)
    fast = Policy(ref, fast=True, compile=True, compile_scope="layers")
    rng = np.random.default_rng(0)
    obs = {
        "images": {c: rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for c in ref.cfg.camera_names},
        "state": rng.normal(size=ref.cfg.state_dim).astype(np.float32),
        "prompt": "pick",
    }
    noise = _noise(ref.cfg, 1)
    want, got = slow.infer_checked([slow.check(obs)], noise), fast.infer_checked([fast.check(obs)], noise)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=ATOL)
    assert ref._compiled_layers == "default"
    with pytest.raises(ValueError, match="compile_scope"):
        Policy(_model("pi0", action_horizon=4), compile=True, compile_scope="layers")
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", ["pi0", "pi05"])
@pytest.mark.parametrize("compile", [False, True])
def test_cuda_graph_matches_eager(variant, compile):
    ref = _model(variant).cuda()
    fast = prepare_for_inference(copy.deepcopy(ref), torch.bfloat16)
    eager, graphed = StaticSampler(fast), StaticSampler(fast, graph=True, compile=compile)
    for seed in (0, 1, 2):  # capture, then replays with new inputs
        batch = {k: v.cuda() for k, v in dummy_batch(ref.cfg, 2, train=False, seed=seed).items()}
        noise = _noise(ref.cfg, 2, seed).cuda()
        with torch.inference_mode():
            want, got = eager(batch, noise), graphed(batch, noise)
            fp32 = ref.sample_actions(batch, noise=noise)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        assert ((got - fp32).norm() / fp32.norm()).item() < 0.05
    assert graphed.graph is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_cuda_graph_layers_compiled_matches_eager(variant):
    """compile_scope="layers" (one compiled layer of each kind), then the whole call captured."""
    ref = _model(variant).cuda()
    fast = prepare_for_inference(copy.deepcopy(ref), torch.bfloat16)
    eager, graphed = (
        StaticSampler(fast),
        StaticSampler(fast, graph=True, compile=True, compile_scope="layers"),
    )
    for seed in (0, 1):
        batch = {k: v.cuda() for k, v in dummy_batch(ref.cfg, 2, train=False, seed=seed).items()}
        noise = _noise(ref.cfg, 2, seed).cuda()
        with torch.inference_mode():
            torch.testing.assert_close(graphed(batch, noise), eager(batch, noise), atol=2e-2, rtol=2e-2)
    assert graphed.graph is not None
    uncompile_layers(fast)
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_autotuned_matches_eager():
    """compile_mode="max-autotune-no-cudagraphs" (benchmarked GEMM configs), then our capture."""
    ref = _model("pi0").cuda()
    fast = prepare_for_inference(copy.deepcopy(ref), torch.bfloat16)
    eager = StaticSampler(fast)
    tuned = StaticSampler(fast, graph=True, compile=True, compile_mode="max-autotune-no-cudagraphs")
    batch = {k: v.cuda() for k, v in dummy_batch(ref.cfg, 1, train=False).items()}
    noise = _noise(ref.cfg, 1).cuda()
    with torch.inference_mode():
        torch.testing.assert_close(tuned(batch, noise), eager(batch, noise), atol=2e-2, rtol=2e-2)
    assert tuned.graph is not None
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compile", [False, True])
def test_cuda_graph_prefix_sampler_matches_eager(compile):
    """Training-time RTC captured in one CUDA graph (pi0) == the same static function eager."""
    ref = _model("pi0").cuda()
    fast = prepare_for_inference(copy.deepcopy(ref), torch.bfloat16)
    eager, graphed = (
        StaticSampler(fast, prefix=True),
        StaticSampler(fast, graph=True, compile=compile, prefix=True),
    )
    for seed in (0, 1, 2):
        batch = {k: v.cuda() for k, v in dummy_batch(ref.cfg, 2, train=False, seed=seed).items()}
        noise, prefix = _noise(ref.cfg, 2, seed).cuda(), _noise(ref.cfg, 2, seed + 10).cuda()
        n = torch.tensor([seed, 4], device="cuda")
        with torch.inference_mode():
            want, got = eager(batch, noise, prefix, n), graphed(batch, noise, prefix, n)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        assert torch.equal(got[1, :4], prefix[1, :4])
    assert graphed.graph is not None


def test_grounded_flow_head_matches():
    """The grounding head (the demo's) reads the prefix through the head's hooks: same parity."""
    cfg = load_config("tiny").model
    ref = _model("pi0", grounding=replace(cfg.grounding, points=2))
    fast = prepare_for_inference(copy.deepcopy(ref), torch.float32)
    batch, noise = dummy_batch(ref.cfg, 2, train=False), _noise(ref.cfg, 2)
    with torch.inference_mode():
        got = StaticSampler(fast)(batch, noise)
    torch.testing.assert_close(got, ref.sample_actions(batch, noise=noise), atol=ATOL, rtol=ATOL)
