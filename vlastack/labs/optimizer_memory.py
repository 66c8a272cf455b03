"""L16 optimizer_memory: bytes per parameter for AdamW vs 8-bit AdamW, LoRA's share, pi0's arithmetic."""

from __future__ import annotations

import torch
from torch import nn

from vlastack.labs._core import Ctx, Finding, Lab

LAB = Lab("optimizer_memory", "optimizer state bytes: AdamW vs AdamW8bit, LoRA, pi0 memory arithmetic")

GiB = 2**30


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer state tensors (moments, quantisation maps and scales; not the step counter)."""
    return sum(
        v.numel() * v.element_size()
        for s in opt.state.values()
        for k, v in s.items()
        if torch.is_tensor(v) and k != "step"
    )


def _stepped(opt_cls, params: list[nn.Parameter], **kw) -> torch.optim.Optimizer:
    opt = opt_cls(params, lr=1e-3, **kw)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    return opt


@LAB.check("S4-10")
def adamw_state_per_param(ctx: Ctx) -> Finding:
    params = [nn.Parameter(torch.randn(512, 512)) for _ in range(2)]
    n = sum(p.numel() for p in params)
    per = state_bytes(_stepped(torch.optim.AdamW, params)) / n
    rows = [
        {"optimizer": "AdamW fp32", "weights B/param": 4, "grads": 4, "state": per, "total": 8 + per},
        {
            "optimizer": "AdamW8bit (2 x 1 B + scales)",
            "weights B/param": 4,
            "grads": 4,
            "state": 2,
            "total": 10,
        },
    ]
    saving = 1 - 10 / (8 + per)
    return Finding(
        f"AdamW state {per:.2f} B/param (exp_avg + exp_avg_sq, fp32); 8-bit state would be ~2 B/param: -75% of "
        f"the state but only -{saving:.1%} of weights + grads + state (fp32 weights and grads)",
        per == 8.0,
        "Caveat: 8-bit optimizers save ~75% of the *optimizer state*; weights, grads and activations are "
        "unchanged, so the total falls by ~37.5% before activations. The measured 8-bit figure is the next check.",
        rows=rows,
    )


@LAB.check("S4-10", requires="bitsandbytes")
def adamw8bit_measured(ctx: Ctx) -> Finding:
    import bitsandbytes as bnb

    rows = []
    for shape in ((64, 63), (64, 64), (1024, 1024)):
        p32 = [nn.Parameter(torch.randn(*shape)) for _ in range(2)]
        p8 = [nn.Parameter(p.detach().clone()) for p in p32]
        n = sum(p.numel() for p in p32)
        b32 = state_bytes(_stepped(torch.optim.AdamW, p32)) / n
        b8 = state_bytes(_stepped(bnb.optim.AdamW8bit, p8)) / n
        rows.append(
            {
                "tensor": f"{shape[0]}x{shape[1]}",
                "elements": shape[0] * shape[1],
                "AdamW B/param": b32,
                "AdamW8bit B/param": b8,
                "state saved": 1 - b8 / b32,
            }
        )
    big = rows[-1]
    ok = big["AdamW8bit B/param"] / big["AdamW B/param"] <= 0.27 and rows[0]["AdamW8bit B/param"] == 8.0
    return Finding(
        f"bitsandbytes {bnb.__version__}: 1024^2 tensors {big['AdamW8bit B/param']:.2f} vs {big['AdamW B/param']:.0f} "
        f"B/param (-{big['state saved']:.1%}); tensors under min_8bit_size (4096 elements) keep fp32 state",
        ok,
        "True for the state of large tensors (block-wise quantised moments + per-block scales); small "
        "tensors (biases, norms) stay fp32.",
        rows=rows,
    )


@LAB.check("S4-11")
def lora_trainable_share(ctx: Ctx) -> Finding:
    from vlastack.config import load_config
    from vlastack.models import build_model
    from vlastack.nn.lora import apply_lora

    model = build_model(load_config("tiny").model)
    total = sum(p.numel() for p in model.parameters())
    wrapped = apply_lora(model, [r"decoder\.layers\.\d+\.vlm\.self_attn\.(q_proj|v_proj)$"], rank=8)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_train = sum(p.numel() for p in trainable)
    opt_bytes = state_bytes(_stepped(torch.optim.AdamW, trainable))
    ok = n_train < 0.1 * total and opt_bytes == 8 * n_train and len(wrapped) > 0
    return Finding(
        f"vlastack tiny ({total:,} params), LoRA rank 8 on the VLM's q_proj/v_proj ({len(wrapped)} layers): "
        f"{n_train:,} trainable ({n_train / total:.2%}); AdamW state {opt_bytes / 2**10:.0f} KiB instead of "
        f"{8 * total / 2**10:,.0f} KiB",
        ok,
        "True: only A and B train (vlastack.nn.lora.LoRALinear), so gradients and optimizer state exist "
        "only for them; the frozen base weights still take their full memory.",
    )


@LAB.check("S4-05", "S4-01", "S4-04")
def pi0_memory_arithmetic(ctx: Ctx) -> Finding:
    from vlastack.config import load_config
    from vlastack.models.vla import VLA

    cfg = load_config("pi0").model
    with torch.device("meta"):
        model = VLA(cfg)
    n = model.num_params()
    proj = sum(p.numel() for p in model.projector.parameters())
    expert = sum(p.numel() for name, p in model.named_parameters() if ".expert." in name)
    rows = [
        {"what": "bf16 weights (inference)", "GiB": 2 * n / GiB},
        {"what": "fp32 weights", "GiB": 4 * n / GiB},
        {"what": "fp32 AdamW training: weights + grads + 2 moments (16 B/param)", "GiB": 16 * n / GiB},
        {"what": "fp32 weights + grads + AdamW8bit state (~10 B/param)", "GiB": 10 * n / GiB},
    ]
    ok = 3.0e9 < n < 3.5e9 and proj == 1152 * 2048 + 2048 and expert > 2e8
    return Finding(
        f"pi0 preset on meta: {n / 1e9:.2f}B params; projector Linear(1152, 2048) = {proj:,}; action expert "
        f"{expert / 1e6:.0f}M params (a transformer, not an MLP); fp32 weights {4 * n / GiB:.1f} GiB, fp32 AdamW "
        f"training {16 * n / GiB:.1f} GiB + activations",
        ok,
        "Caveat: a 3B model's fp32 weights (12 GiB) fit one 80 GB GPU for inference; training with fp32 "
        "AdamW needs 16 B/param (~48 GiB) before activations - that is what does not fit smaller GPUs. "
        "Pi0's action side is a 300M-parameter transformer expert integrated over flow steps; only its "
        "last projection is a Linear.",
        rows=rows,
    )
