import pytest
import torch
from torch import nn

from vlastack.batch import dummy_batch
from vlastack.config import tiny
from vlastack.models import build_model
from vlastack.nn.lora import LoRALinear, apply_lora, lora_state_dict, merge_lora, remove_lora, unmerge_lora


def _trained_adapter_model():
    cfg = tiny().model
    m = build_model(cfg).eval()
    names = apply_lora(m, [r"self_attn\.(q|v)_proj$"], rank=4, alpha=8)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, LoRALinear):
                mod.lora_B.normal_(0, 0.05)  # as if trained: B != 0
    return cfg, m, names


def test_only_lora_parameters_are_trainable():
    _, m, names = _trained_adapter_model()
    assert names and all(n.endswith(("q_proj", "v_proj")) for n in names)
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A" in n or ".lora_B" in n for n in trainable)
    assert set(lora_state_dict(m)) == {n for n in trainable}


def test_merged_equals_unmerged_and_unmerge_restores():
    cfg, m, _ = _trained_adapter_model()
    batch = dummy_batch(cfg, 2)
    noise = torch.randn(2, cfg.action_horizon, cfg.action_dim)
    ref = m.sample_actions(batch, noise=noise)
    base_w = m.decoder.layers[0].vlm.self_attn.q_proj.base.weight.clone()
    merge_lora(m)
    assert not torch.equal(m.decoder.layers[0].vlm.self_attn.q_proj.base.weight, base_w)
    torch.testing.assert_close(m.sample_actions(batch, noise=noise), ref, atol=1e-5, rtol=1e-5)
    unmerge_lora(m)
    torch.testing.assert_close(
        m.decoder.layers[0].vlm.self_attn.q_proj.base.weight, base_w, atol=1e-6, rtol=0
    )
    torch.testing.assert_close(m.sample_actions(batch, noise=noise), ref, atol=1e-5, rtol=1e-5)
    remove_lora(m)
    assert not any(isinstance(x, LoRALinear) for x in m.modules())
    torch.testing.assert_close(m.sample_actions(batch, noise=noise), ref, atol=1e-5, rtol=1e-5)


def test_fresh_adapter_is_identity_and_gets_gradients():
    lin = nn.Linear(8, 6)
    x = torch.randn(3, 8)
    ref = lin(x)
    lora = LoRALinear(lin, rank=2, dropout=0.1).train()
    torch.testing.assert_close(lora(x), ref)
    lora(x).sum().backward()
    assert lora.lora_B.grad is not None and lora.lora_B.grad.abs().sum() > 0


def test_bad_targets_and_rank_raise():
    m = build_model(tiny().model)
    with pytest.raises(ValueError, match="matched no"):
        apply_lora(m, ["does_not_exist"], rank=4)
    with pytest.raises(ValueError, match="rank"):
        LoRALinear(nn.Linear(2, 2), rank=0)


def test_adapter_adds_no_output_sized_temporaries():
    """The step's transient memory is what the allocator's heap keeps (docs/research/doctor.md): the adapter
    allocates one [..., out] tensor (its product) and adds it in place, where it used to make
    three (product, scaled copy, sum), which held ~10% more RSS in a LoRA run than vla plan said."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Allocs(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.storages = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.numel() == 2 * 5 * 48:  # [..., out]-sized
                self.storages.add(out.untyped_storage().data_ptr())
            return out

    torch.manual_seed(0)
    base = nn.Linear(32, 48)
    lora = LoRALinear(base, rank=4)
    with torch.no_grad():
        lora.lora_B.normal_()
    x = torch.randn(2, 5, 32, requires_grad=True)
    with Allocs() as a:
        y = lora(x)
    assert len(a.storages) == 2  # the base output and the adapter's product: no scaled copy, no sum
    # same function and gradients as the out-of-place form
    want = base(x) + (x @ lora.lora_A.t() @ lora.lora_B.t()) * lora.scaling
    torch.testing.assert_close(y, want)
    gx, ga = torch.autograd.grad(y.square().sum(), (x, lora.lora_A))
    wx, wa = torch.autograd.grad(want.square().sum(), (x, lora.lora_A))
    torch.testing.assert_close(gx, wx)
    torch.testing.assert_close(ga, wa)
