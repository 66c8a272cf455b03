"""L18 training_hygiene: accumulation, clipping, seeding, and what torch.load refuses."""

from __future__ import annotations

import io
import pickle

import torch
from torch import nn
from torch.utils.data import DataLoader

from vlastack.labs._core import Ctx, Finding, Lab, MiB, SavedTensors

LAB = Lab("training_hygiene", "gradient accumulation, clipping, seeds, torch.load(weights_only)")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 1))


@LAB.check("S1-06")
def accumulation_equals_big_batch(ctx: Ctx) -> Finding:
    torch.manual_seed(1)
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    big, acc = _model(), _model()
    with SavedTensors(exclude=big.parameters()) as m_big:
        loss = nn.functional.mse_loss(big(x), y)
    saved_big = m_big.alive_bytes() / MiB
    loss.backward()
    saved_micro = 0.0
    for xs, ys in zip(x.chunk(4), y.chunk(4)):
        with SavedTensors(exclude=acc.parameters()) as m:
            loss = nn.functional.mse_loss(acc(xs), ys) / 4
        saved_micro = max(saved_micro, m.alive_bytes() / MiB)
        loss.backward()
    diff = max((a.grad - b.grad).abs().max().item() for a, b in zip(big.parameters(), acc.parameters()))
    ok = diff < 1e-6 and saved_micro < 0.35 * saved_big
    return Finding(
        f"4 micro-batches of 16 (loss / 4) vs one batch of 64: max grad diff {diff:.1e}; saved activations "
        f"{saved_micro:.3f} vs {saved_big:.3f} MiB",
        ok,
        "True: the summed micro-batch gradients equal the big batch's (mean loss divided by the number of "
        "micro-batches), while activations are held for one micro-batch at a time. "
        "vlastack: tests/train/test_trainer.py::test_grad_accumulation_matches_one_big_batch.",
    )


@LAB.check("S1-07")
def clip_grad_norm_returns_pre_clip_norm(ctx: Ctx) -> Finding:
    model = _model()
    (model(torch.randn(64, 32)) * 100).sum().backward()
    before = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    ok = before.item() > 1 and abs(after.item() - 1.0) < 1e-4
    return Finding(
        f"clip_grad_norm_(max_norm=1) returned {before.item():.2f} (the norm before clipping); norm after {after.item():.4f}",
        ok,
        "True; note the return value is the pre-clip total norm (log it to see how often clipping bites).",
    )


@LAB.check("S1-08")
def seeds_and_what_breaks_them(ctx: Ctx) -> Finding:
    def weights() -> torch.Tensor:
        torch.manual_seed(0)
        return nn.Linear(8, 8).weight.detach().clone()

    same_init = torch.equal(weights(), weights())

    def order(generator: torch.Generator | None, extra_draw: bool) -> list[int]:
        torch.manual_seed(0)
        if extra_draw:  # e.g. a model change that initialises one more layer
            torch.randn(1)
        loader = DataLoader(list(range(8)), batch_size=8, shuffle=True, generator=generator)
        return next(iter(loader)).tolist()

    no_gen = order(None, False) == order(None, True)
    with_gen = order(torch.Generator().manual_seed(1), False) == order(torch.Generator().manual_seed(1), True)
    ok = same_init and not no_gen and with_gen
    return Finding(
        f"manual_seed -> bit-identical init {same_init}; shuffle order unchanged by one extra random draw: "
        f"without a loader generator {no_gen}, with one {with_gen}",
        ok,
        "Caveat: manual_seed makes one CPU process reproducible, but every consumer shares the global "
        "stream; give the DataLoader its own generator, seed workers, and on CUDA add "
        "torch.use_deterministic_algorithms(True). vlastack: tests/train/test_resume.py::test_resume_is_bit_exact.",
    )


class _Blob:
    def __init__(self) -> None:
        self.w = torch.ones(2)


@LAB.check("S1-03")
def torch_load_weights_only(ctx: Ctx) -> Finding:
    sd = _model().state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location="cpu")
    ok_sd = all(torch.equal(loaded[k], sd[k]) for k in sd)
    buf = io.BytesIO()
    torch.save(_Blob(), buf)  # an arbitrary pickled object: in memory only, never loaded unsafely
    buf.seek(0)
    try:
        torch.load(buf)
        err = "no error"
    except pickle.UnpicklingError as e:
        err = type(e).__name__
    return Finding(
        f"state_dict loads with the default weights_only=True: {ok_sd}; a pickled object -> {err}",
        ok_sd and err == "UnpicklingError",
        "Caveat: works for state_dicts, but since torch 2.6 torch.load defaults to weights_only=True and "
        "refuses arbitrary pickles (good: loading a pickle runs code). vlastack stores safetensors.",
    )
