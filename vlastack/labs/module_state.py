"""L07 module_state: parameters, buffers and plain attributes; registration; containers; init."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlastack.labs._core import Ctx, Finding, Lab

LAB = Lab("module_state", "Parameter vs buffer vs plain attribute; registration; ModuleList; init")


class _State(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        self.register_buffer("pe", torch.ones(2))
        self.register_buffer("scratch", torch.ones(2), persistent=False)
        self.plain = torch.ones(2)


@LAB.check("S0-16", "S3-19")
def buffers_move_and_save(ctx: Ctx) -> Finding:
    m = _State()
    keys = sorted(m.state_dict())
    m64 = _State().to(torch.float64)
    meta = _State().to("meta")
    rows = [
        {
            "member": name,
            ".to(float64) dtype": str(getattr(m64, name).dtype).replace("torch.", ""),
            ".to('meta') device": str(getattr(meta, name).device),
            "in state_dict": name in keys,
        }
        for name in ("w", "pe", "scratch", "plain")
    ]
    bn_keys = sorted(nn.BatchNorm1d(3).state_dict())
    ok = (
        keys == ["pe", "w"]
        and m64.pe.dtype == torch.float64
        and m64.plain.dtype == torch.float32
        and meta.pe.is_meta
        and not meta.plain.is_meta
        and "num_batches_tracked" in bn_keys
    )
    return Finding(
        f"state_dict keys {keys}; BatchNorm1d keys {bn_keys}",
        ok,
        "True: buffers follow .to()/.cuda() and are saved; plain tensor attributes are neither moved nor "
        "saved. Caveat: persistent=False buffers move but are not saved. state_dict holds tensors only "
        "(no code): rebuild the module, then load.",
        rows=rows,
    )


@LAB.check("S2-14")
def setattr_does_not_call_register_module(ctx: Ctx) -> Finding:
    calls = []
    orig_reg, orig_add = nn.Module.register_module, nn.Module.add_module

    def spy_reg(self, name, module):
        calls.append(("register_module", name))
        return orig_reg(self, name, module)

    def spy_add(self, name, module):
        calls.append(("add_module", name))
        return orig_add(self, name, module)

    nn.Module.register_module, nn.Module.add_module = spy_reg, spy_add
    try:

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.l = nn.Linear(2, 2)

        net = Net()
    finally:
        nn.Module.register_module, nn.Module.add_module = orig_reg, orig_add
    ok = calls == [] and "l" in net._modules
    return Finding(
        f"`self.l = nn.Linear(...)`: register_module/add_module calls seen: {len(calls)}; "
        f"'l' in _modules: {'l' in net._modules}",
        ok,
        "Correction: Module.__setattr__ writes into self._modules directly; it does not call "
        "register_module/add_module. The effect (registration) is the same.",
    )


@LAB.check("S2-15", "S2-17")
def plain_list_hides_modules(ctx: Ctx) -> Finding:
    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.W = torch.randn(2, 2)
            self.layers = [nn.Linear(2, 2), nn.Linear(2, 2)]

    class Registered(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.W = nn.Parameter(torch.randn(2, 2))
            self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
            self.heads = nn.ModuleDict({"a": nn.Linear(2, 2)})
            self.seq = nn.Sequential(nn.Linear(2, 2))

    def count(m: nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    h, r = Hidden(), Registered()
    moved = h.to(torch.float64)
    ok = (
        count(h) == 0
        and len(h.state_dict()) == 0
        and count(r) == 4 + 12 + 6 + 6
        and moved.layers[0].weight.dtype == torch.float32
    )
    return Finding(
        f"plain tensor + Python list: {count(h)} parameters, {len(h.state_dict())} state_dict keys, "
        f"list's Linear stays float32 after .to(float64); Parameter + ModuleList + ModuleDict + Sequential: {count(r)}",
        ok,
        "True: parameters(), state_dict() and .to() see only registered members; a Python list hides "
        "its modules from all three (and from the optimizer).",
    )


@LAB.check("S2-16")
def hand_written_linear_init(ctx: Ctx) -> Finding:
    class MyLinear(nn.Module):  # the note's layer
        def __init__(self, n_in: int, n_out: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(n_out, n_in))
            self.bias = nn.Parameter(torch.randn(n_out))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight.T + self.bias

    mine, ref = MyLinear(512, 512), nn.Linear(512, 512)
    x = torch.randn(8, 512)
    same = torch.allclose(mine(x), F.linear(x, mine.weight, mine.bias), atol=1e-4)
    h_mine, h_ref = x, x
    for _ in range(4):
        h_mine, h_ref = MyLinear(512, 512)(h_mine), nn.Linear(512, 512)(h_ref)
    ok = same and mine.weight.std() > 0.9 and ref.weight.std() < 0.05 and h_mine.std() > 100 * h_ref.std()
    return Finding(
        f"x @ W.T + b == F.linear: {same}; init std randn {mine.weight.std():.3f} vs nn.Linear "
        f"{ref.weight.std():.4f} (kaiming-uniform, fan-in 512); activation std after 4 layers "
        f"{h_mine.std():.3g} vs {h_ref.std():.3g}",
        ok,
        "The math is the same as nn.Linear, but the init is not: randn weights have std 1, so "
        "activations grow ~sqrt(fan_in) per layer; nn.Linear scales by 1/sqrt(fan_in).",
    )
