"""Pick fp32 or bf16 autocast for training by measuring, not by assuming.

    choice = choose_precision(matmul_shapes(cfg.model, cfg.train.batch_size))
    print(choice.reason)  # "bf16: a bf16 matmul takes 0.41x the fp32 time here (...)"

On CPUs with bf16 matmul instructions (avx512_bf16, AMX) bf16 autocast trains faster than fp32;
without them oneDNN emulates bf16 and a bf16 matmul runs tens of times slower. The CPU flags do
not tell the whole story (a capped ``ONEDNN_MAX_CPU_ISA``, a virtual machine hiding flags, a
different oneDNN build), so the choice times the model's own matmul shapes in both precisions
(interleaved, medians, well under 2 s) and takes bf16 only where it is clearly faster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from vlastack.config import Config, ModelConfig

# bf16 is taken only below this kernel-time ratio. A whole bf16 training step gains less than its
# matmuls (casts, fp32 norms and softmax): on avx512_bf16 a 0.5x matmul makes a ~0.8x step, and
# near parity fp32 wins (exact numerics, and the fp32 recipe needs fewer steps).
BF16_MAX_RATIO = 0.75


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str  # "fp32" | "bf16"
    ratio: float  # bf16 time / fp32 time on the measured matmuls (nan when not measured)
    fp32_ms: float
    bf16_ms: float
    reason: str


def matmul_shapes(model: ModelConfig, batch_size: int, max_rows: int = 1024) -> list[tuple[int, int, int]]:
    """(M, K, N) of the training step's largest matmuls: the vision tower's MLP over every image
    token of the batch and the VLM's MLP over the prefix. M is capped at ``max_rows``: kernel speed
    per FLOP is flat beyond it, and a CPU that emulates bf16 must not take seconds to measure."""
    v, d = model.vision, model.vlm
    m_img = min(max_rows, batch_size * model.num_cameras * v.num_patches)
    m_txt = min(max_rows, batch_size * model.prefix_len)
    return [(m_img, v.width, v.mlp_dim), (m_img, v.mlp_dim, v.width), (m_txt, d.width, d.mlp_dim)]


def _operands(shapes: list[tuple[int, int, int]], dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    return [
        tuple(torch.randn(*s, generator=g).to(dtype) for s in ((m, k), (n, k), (m, n))) for m, k, n in shapes
    ]


def _pass(operands: list[tuple[torch.Tensor, ...]], clock: Callable[[], float]) -> float:
    """Seconds for the forward, input-gradient and weight-gradient matmuls of every shape."""
    with torch.no_grad():
        t0 = clock()
        for x, w, gy in operands:
            torch.nn.functional.linear(x, w)  # y = x w^T
            torch.matmul(gy, w)  # dL/dx
            torch.matmul(gy.t(), x)  # dL/dw
        return clock() - t0


def measure(shapes: list[tuple[int, int, int]], budget_s: float = 1.5, reps: int = 9) -> tuple[float, float]:
    """Best-of fp32 and bf16 pass times (seconds) of the matmul kernels bf16 autocast runs (its
    operands cast to bf16), on one thread, interleaved so a noisy neighbour hits both; the minimum, since noise
    only ever adds time. Stops early once the budget is spent or bf16 is > 3x slower."""
    ops = {"fp32": _operands(shapes, torch.float32), "bf16": _operands(shapes, torch.bfloat16)}
    clock = time.perf_counter
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the per-core kernel speed; a busy neighbour stalls multi-thread barriers
    try:
        t_start = clock()
        for p in ops:  # warm-up: oneDNN primitive creation, allocations
            _pass(ops[p], clock)
        best = {p: float("inf") for p in ops}
        for _ in range(reps):
            for p in ops:
                best[p] = min(best[p], _pass(ops[p], clock))
            if clock() - t_start > budget_s or best["bf16"] > 3 * best["fp32"]:
                break
    finally:
        torch.set_num_threads(threads)
    return best["fp32"], best["bf16"]


def choose_precision(
    shapes: list[tuple[int, int, int]],
    device_type: str = "cpu",
    timer: Callable[[list[tuple[int, int, int]]], tuple[float, float]] | None = None,
    max_ratio: float = BF16_MAX_RATIO,
) -> PrecisionChoice:
    """bf16 where a measured bf16 matmul pass takes under ``max_ratio`` of the fp32 time, else fp32.

    ``timer(shapes) -> (fp32_s, bf16_s)`` defaults to ``measure``; tests inject their own. On CUDA
    bf16 is taken when the GPU supports it (tensor cores; nothing to measure)."""
    nan = float("nan")
    if device_type == "cuda":
        if not torch.cuda.is_available():  # planning for a GPU from a CPU machine: the usual case
            return PrecisionChoice("bf16", nan, nan, nan, "bf16: the target is a CUDA GPU (Ampere or newer)")
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16", nan, nan, nan, "bf16: a CUDA GPU with bf16 support")
        return PrecisionChoice("fp32", nan, nan, nan, "fp32: this CUDA GPU has no bf16 support")
    fp32_s, bf16_s = (timer or measure)(shapes)
    ratio = bf16_s / max(fp32_s, 1e-12)
    figures = f"bf16 {1e3 * bf16_s:.1f} ms vs fp32 {1e3 * fp32_s:.1f} ms on the model's matmul shapes"
    if ratio < max_ratio:
        why = f"bf16: a bf16 matmul takes {ratio:.2f}x the fp32 time on this CPU ({figures})"
        return PrecisionChoice("bf16", ratio, 1e3 * fp32_s, 1e3 * bf16_s, why)
    why = (
        f"fp32: a bf16 matmul takes {ratio:.2f}x the fp32 time on this CPU ({figures}; "
        f"bf16 needs < {max_ratio}x, i.e. native avx512_bf16/AMX)"
    )
    return PrecisionChoice("fp32", ratio, 1e3 * fp32_s, 1e3 * bf16_s, why)


def resolve_auto(
    cfg: Config,
    device_type: str,
    previous: str | None = None,
    timer: Callable[[list[tuple[int, int, int]]], tuple[float, float]] | None = None,
) -> tuple[Config, str | None]:
    """``cfg`` with ``train.precision: auto`` made concrete, and the one-line reason (None when
    ``cfg`` did not ask for ``auto``).

    ``previous`` is the precision a resumed run trained in: it is kept, so a run resumed on another
    kind of CPU continues the same computation instead of switching mid-run. Otherwise the model's
    own matmul shapes are timed (``choose_precision``): bf16 on CPUs with native bf16 and on CUDA
    GPUs that support it, fp32 elsewhere (on AVX2-only CPUs bf16 runs ~10x slower)."""
    if cfg.train.precision != "auto":
        return cfg, None
    if previous is not None and previous != "auto":
        precision, why = previous, f"{previous}: the precision the resumed run trained in"
    else:
        choice = choose_precision(matmul_shapes(cfg.model, cfg.train.batch_size), device_type, timer=timer)
        precision, why = choice.precision, choice.reason
    return replace(cfg, train=replace(cfg.train, precision=precision)), f"train.precision=auto -> {why}"


def cpu_capability() -> str:
    """ATen's CPU kernel level ("AVX512", "AVX2", ...; ``ATEN_CPU_CAPABILITY`` caps it)."""
    get = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return get() if get is not None else "unknown"
