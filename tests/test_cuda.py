"""CUDA-only checks (``pytest -m gpu``): the same invariances as the CPU suite, on the GPU paths
(SDPA kernels, bf16 autocast, CUDA graphs under compile, pinned non-blocking copies)."""

from dataclasses import replace

import pytest
import torch

from vlastack.batch import dummy_batch, to_device
from vlastack.config import tiny
from vlastack.models import build_model
from vlastack.train.optim import build_optimizer
from vlastack.train.step import make_scaler, train_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _noise(cfg, b, device="cuda"):
    g = torch.Generator().manual_seed(1)
    return torch.randn(b, cfg.action_horizon, cfg.action_dim, generator=g).to(device)


@pytest.fixture(scope="module")
def cfg():
    return replace(tiny().model, grounding=replace(tiny().model.grounding, points=2))


def test_cuda_sampling_matches_cpu_and_uncached(cfg):
    torch.manual_seed(0)
    cpu = build_model(cfg).eval()
    gpu = build_model(cfg, device="cuda").eval()
    gpu.load_state_dict(cpu.state_dict())
    batch = dummy_batch(cfg, 3, train=False)
    noise = _noise(cfg, 3, "cpu")
    ref = cpu.sample_actions(batch, noise=noise)
    out = gpu.sample_actions(to_device(batch, "cuda"), noise=noise.cuda())
    with torch.no_grad():
        uncached = gpu.head.sample_uncached(gpu, to_device(batch, "cuda"), noise.cuda())
    # fp32 on both (TF32 is off by default); the kernels sum in other orders, and the Euler steps
    # carry the rounding: 2.1e-4 max abs on an H100 against the CPU (actions of order 1)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(out, uncached, atol=1e-3, rtol=1e-3)


def test_cuda_bf16_sampling_drift_is_small(cfg):
    torch.manual_seed(0)
    m = build_model(cfg, device="cuda").eval()
    batch = dummy_batch(cfg, 4, train=False, device="cuda")
    noise = _noise(cfg, 4)
    ref = m.sample_actions(batch, noise=noise)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        low = m.sample_actions(batch, noise=noise)
    assert low.dtype == torch.float32  # the head returns fp32 actions under autocast
    err = (low - ref).abs().max().item()
    assert err < 0.1, f"bf16 drift {err:.3g}"


def test_cuda_compiled_sampler_matches_eager(cfg):
    small = cfg.with_head_options(num_denoise_steps=3)
    torch.manual_seed(0)
    m = build_model(small, device="cuda").eval()
    batch = dummy_batch(small, 2, train=False, device="cuda")
    noise = _noise(small, 2)
    eager = m.sample_actions(batch, noise=noise)
    torch._dynamo.reset()
    compiled = torch.compile(m.sample_actions, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # the first calls record the CUDA graph; the last one replays it
        out = compiled(batch, noise=noise)
    torch.testing.assert_close(out, eager, atol=1e-4, rtol=1e-4)


def test_cuda_graph_step_sampler_with_static_cache(cfg):
    """Prefill compiled, the denoise step compiled with CUDA graphs writing a static cache in place."""
    torch.manual_seed(0)
    m = build_model(cfg, device="cuda").eval()
    noise = _noise(cfg, 2)
    batches = [dummy_batch(cfg, 2, train=False, device="cuda", seed=s) for s in (0, 1)]
    eager = [m.sample_actions(b, noise=noise) for b in batches]
    torch._dynamo.reset()
    head = m.head
    head.compile_decoding(mode="reduce-overhead")
    try:
        cache = head.new_cache(m, 2, torch.float32, "cuda").mark_static()
        for _ in range(3):  # record, then replay; alternating batches must not leak through the cache
            for b, ref in zip(batches, eager, strict=True):
                torch.testing.assert_close(
                    m.sample_actions(b, noise=noise, cache=cache), ref, atol=1e-4, rtol=1e-4
                )
    finally:
        del head.prefill, head.denoise_step


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_training_reduces_loss(precision):
    cfg = tiny()
    torch.manual_seed(0)
    m = build_model(cfg.model, device="cuda")
    opt = build_optimizer(m, cfg.train)
    scaler = make_scaler("cuda", precision)
    batch = dummy_batch(cfg.model, 8, device="cuda")
    res = [
        train_step(m, opt, [batch], device_type="cuda", precision=precision, scaler=scaler) for _ in range(30)
    ]
    # fp16: GradScaler skips the first steps while it lowers its scale from 2**16 (by design)
    assert all(r.ok or r.scaled_skip for r in res)
    losses = [r.loss for r in res if r.ok]
    assert len(losses) >= 20
    # per-step losses are noisy (fresh flow times and noise each step): compare window means
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:3]) / 3, [round(v, 3) for v in losses]


def test_pinned_non_blocking_copy_is_exact():
    cfg = tiny().model
    host = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in dummy_batch(cfg, 4).items()}
    dev = to_device(host, "cuda", non_blocking=True)
    torch.cuda.synchronize()
    for k, v in host.items():
        if isinstance(v, torch.Tensor):
            assert dev[k].is_cuda and torch.equal(dev[k].cpu(), v), k
