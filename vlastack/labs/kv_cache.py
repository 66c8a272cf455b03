"""L14 kv_cache: what a KV cache keeps alive under grad, cat-grown vs static caches, prefix-once sampling."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from vlastack.labs._core import Ctx, Finding, Lab, MiB, SavedTensors, compare

LAB = Lab("kv_cache", "KV caches: detach vs inference_mode, the note's snippet, cat vs static, prefix once")


class ToyDecoder(nn.Module):
    """Two attention layers with a cat-grown per-layer (k, v) cache. Input x [1, 1, d]."""

    def __init__(self, d: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))

    def step(self, x: torch.Tensor, cache: list, detach: bool) -> torch.Tensor:
        for i, (qkv, out) in enumerate(zip(self.qkv, self.out)):
            q, k, v = qkv(x).chunk(3, dim=-1)
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], dim=1), torch.cat([cache[i][1], v], dim=1)
            cache[i] = (k.detach(), v.detach()) if detach else (k, v)
            att = torch.softmax(q @ k.transpose(1, 2) / k.shape[-1] ** 0.5, dim=-1)
            x = x + out(att @ v)
        return x


def _generate_alive_mib(model: ToyDecoder, steps: int, mode: str) -> float:
    cache: list = [None] * len(model.qkv)
    torch.manual_seed(0)
    tokens = torch.randn(steps, 1, 1, 64)  # the next token's embedding: no graph between steps
    cm = torch.inference_mode if mode == "inference_mode" else torch.enable_grad
    with SavedTensors(exclude=model.parameters()) as meter, cm():
        for t in range(steps):
            y = model.step(tokens[t], cache, detach=mode == "grad + detach")
    alive = meter.alive_bytes() / MiB
    del y, cache
    return alive


@LAB.check("S0-14")
def cache_graph_growth(ctx: Ctx) -> Finding:
    model = ToyDecoder()
    steps = ctx.n([16, 64, 256], [16, 64, 128])
    rows = []
    for mode in ("grad", "grad + detach", "inference_mode"):
        rows.append({"mode": mode, **{f"{s} steps MiB": _generate_alive_mib(model, s, mode) for s in steps}})
    g = rows[0]
    growth = g[f"{steps[-1]} steps MiB"] / g[f"{steps[-2]} steps MiB"]
    expect = (steps[-1] / steps[-2]) ** 2
    ok = (
        growth > 0.6 * expect
        and rows[1][f"{steps[-1]} steps MiB"] < 0.1 * g[f"{steps[-1]} steps MiB"]
        and all(v == 0 for k, v in rows[2].items() if k != "mode")
    )
    return Finding(
        f"activations kept alive by the cache after {steps} steps: grad {[round(g[f'{s} steps MiB'], 2) for s in steps]} MiB "
        f"(x{growth:.1f} for x{steps[-1] // steps[-2]} steps: quadratic), detached "
        f"{rows[1][f'{steps[-1]} steps MiB']:.2f} MiB, inference_mode 0",
        ok,
        "True only when generating with grad enabled, and it grows quadratically, not 'instantly'. At "
        "inference the fix is inference_mode/no_grad (nothing saved at all), not detach.",
        rows=rows,
    )


@LAB.check("S4-15")
def note_snippet_raises(ctx: Ctx) -> Finding:
    cache: dict = {}
    layer_idx = 0
    k, v = torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    new_k = torch.randn(1, 1, 8)
    err = ""
    for _ in range(2):  # the note's code, run for two steps
        try:
            if layer_idx not in cache:
                cache[layer_idx] = (k, v)
            else:
                cache[layer_idx] = torch.cat([cache[layer_idx], new_k], dim=1)
        except TypeError as e:
            err = str(e)
    return Finding(
        f"second step raises TypeError: '{err[:80]}'",
        "tuple" in err,
        "False as written: the cache holds a (k, v) tuple, so cat([tuple, new_k]) raises, and v is "
        "never appended. Fixed (cat k and v separately) it still reallocates the whole cache every "
        "step (next check); vlastack uses a static cache written by index (vlastack/nn/kv_cache.py).",
        verdict="F (as written)",
    )


class _CatBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ == "cat":
            self.bytes += out.numel() * out.element_size()
        return out


@LAB.check("S0-30", "S4-15", timed=True)
def cat_vs_static_cache(ctx: Ctx) -> Finding:
    steps = ctx.n(1024, 512)
    new = torch.randn(1, 8, 1, 64)

    def grow_cat() -> torch.Tensor:
        cache = torch.empty(1, 8, 0, 64)
        for _ in range(steps):
            cache = torch.cat([cache, new], dim=2)
        return cache

    buf = torch.empty(1, 8, steps, 64)

    def write_static() -> torch.Tensor:
        for t in range(steps):
            buf[:, :, t : t + 1] = new
        return buf

    t = compare({"cat": grow_cat, "static": write_static}, reps=ctx.n(5, 3))
    with _CatBytes() as cb:
        grow_cat()
    ratio = t["cat"] / t["static"]
    rows = [
        {"cache": "torch.cat per step", "ms": t["cat"], "MiB allocated in total": cb.bytes / MiB},
        {
            "cache": "preallocated, written by index",
            "ms": t["static"],
            "MiB allocated in total": buf.nbytes / MiB,
        },
    ]
    return Finding(
        f"{steps} appends to a 1x8xTx64 fp32 cache: cat {t['cat']:.1f} ms and {cb.bytes / MiB:.0f} MiB allocated "
        f"vs static {t['static']:.1f} ms and {buf.nbytes / MiB:.0f} MiB ({ratio:.1f}x)",
        ratio >= 2.0,
        "Caveat: on CPU the measurable cost of cat in a loop is quadratic copying and allocation; "
        "fragmentation proper (reserved - allocated) is a CUDA caching-allocator effect (gpu_transfer lab).",
        rows=rows,
    )


@LAB.check("S4-14", "S4-16", timed=True)
def prefix_once_vs_recompute(ctx: Ctx) -> Finding:
    from vlastack.batch import dummy_batch
    from vlastack.config import load_config
    from vlastack.models import build_model

    cfg = load_config("tiny")
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    batch = dummy_batch(cfg.model, batch_size=1, train=False)
    noise = torch.randn(1, cfg.model.action_horizon, cfg.model.action_dim)
    with torch.inference_mode():
        cached = model.sample_actions(batch, noise=noise)
        full = model.head.sample_uncached(model, batch, noise)
        t = compare(
            {
                "cached": lambda: model.sample_actions(batch, noise=noise),
                "uncached": lambda: model.head.sample_uncached(model, batch, noise),
            },
            reps=ctx.n(7, 3),
        )
    diff = (cached - full).abs().max().item()
    speed = t["uncached"] / t["cached"]
    steps = cfg.model.head_options.num_denoise_steps
    return Finding(
        f"vlastack tiny, batch 1, {steps} flow steps: prefix once (KV cache) {t['cached']:.1f} ms vs prefix "
        f"recomputed every step {t['uncached']:.1f} ms ({speed:.2f}x); max |diff| {diff:.1e}",
        diff < 1e-4 and speed > 1.2,
        "True: the VLM prefix (images + text) is encoded once into the cache and each denoising step "
        "runs only the action expert over the suffix, with the same result.",
        data={"speedup": speed, "max_diff": diff},
    )
