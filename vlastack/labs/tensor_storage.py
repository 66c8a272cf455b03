"""L01 tensor_storage: storage, shape, stride and offset; views vs copies; reshape's cost."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from vlastack.labs._core import Ctx, Finding, Lab, compare

LAB = Lab("tensor_storage", "storage, strides and offsets; view vs reshape vs contiguous vs clone")


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _desc(name: str, t: torch.Tensor, base: torch.Tensor) -> dict:
    return {
        "tensor": name,
        "shape": tuple(t.shape),
        "stride": t.stride(),
        "offset": t.storage_offset(),
        "contiguous": t.is_contiguous(),
        "same storage": _ptr(t) == _ptr(base),
    }


@LAB.check("S2-01", "S2-03", "S3-10", "S2-31")
def metadata_and_offset(ctx: Ctx) -> Finding:
    t = torch.arange(1, 7).view(2, 3)
    a = torch.arange(9).view(3, 3)
    sl = a[1:, 1:]
    pos = t.storage_offset() + 1 * t.stride(0) + 2 * t.stride(1)
    value = int(t.flatten()[pos])  # t is contiguous, so flat index == storage index
    rows = [_desc("t", t, t), _desc("t.T", t.T, t), _desc("a", a, a), _desc("a[1:, 1:]", sl, a)]
    ok = pos == 5 and value == 6 == int(t[1, 2]) and sl.storage_offset() == 4 and _ptr(sl) == _ptr(a)
    return Finding(
        f"t[1,2]: offset 0 + 1*{t.stride(0)} + 2*{t.stride(1)} = {pos} -> storage[{pos}] = {value}; "
        f"a[1:,1:] offset {sl.storage_offset()}, same storage {_ptr(sl) == _ptr(a)}",
        ok,
        "True, but a tensor holds more than storage/shape/stride: also storage_offset (the slice "
        "starts at element 4), dtype, device, layout, requires_grad and a version counter; they live "
        "in the C++ TensorImpl, the Python object is a handle to it.",
        rows=rows,
    )


@LAB.check("S2-02")
def typed_storage_deprecated(ctx: Ctx) -> Finding:
    t = torch.arange(1, 7).view(2, 3)
    old = torch.storage._get_always_warn_typed_storage_removal()
    torch.storage._set_always_warn_typed_storage_removal(True)  # torch warns once per process otherwise
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            s = t.storage()
    finally:
        torch.storage._set_always_warn_typed_storage_removal(old)
    msgs = [str(x.message) for x in w]
    deprecated = any("TypedStorage is deprecated" in m for m in msgs)
    return Finding(
        f"t.storage() -> {type(s).__name__}(dtype={s.dtype}, size {len(s)}); warns deprecated: {deprecated}; "
        f"untyped_storage(): {t.untyped_storage().nbytes()} bytes",
        deprecated and type(s).__name__ == "TypedStorage",
        "The note's `[torch.LongStorage of size 6]` is the old API: torch 2.x returns a TypedStorage "
        "and warns it is deprecated; use t.untyped_storage() (bytes).",
    )


@LAB.check("S0-01", "S0-05", "S2-04", "S2-05")
def views_share_storage(ctx: Ctx) -> Finding:
    a = torch.arange(1, 7).view(2, 3)
    b = a.transpose(0, 1)
    try:
        b.view(-1)
        raised = ""
    except RuntimeError as e:
        raised = str(e).split(".")[0]
    flat = b.contiguous().view(-1)
    ok = (
        _ptr(a.view(3, 2)) == _ptr(a)
        and _ptr(b) == _ptr(a)
        and b.stride() == (1, 3)
        and not b.is_contiguous()
        and bool(raised)
        and flat.tolist() == [1, 4, 2, 5, 3, 6]
    )
    return Finding(
        f"a.view(3,2) same ptr {_ptr(a.view(3, 2)) == _ptr(a)}; a.T stride {b.stride()}, same ptr "
        f"{_ptr(b) == _ptr(a)}, contiguous {b.is_contiguous()}; a.T.view(-1) raises: '{raised}'",
        ok,
        "Exactly as the notes say: view/transpose only rewrite shape and strides; the transpose is "
        "not contiguous, view(-1) on it raises, contiguous().view(-1) works (after a copy).",
    )


@LAB.check("S0-02")
def view_on_non_contiguous(ctx: Ctx) -> Finding:
    x = torch.randn(4, 6)[:, :4]  # non-contiguous slice
    y = x.view(2, 2, 4)  # splits dim 0 only: expressible with the old strides
    t = torch.arange(6).view(2, 3).T
    z = t.view(3, 1, 2)  # inserts a size-1 dim
    ok = not x.is_contiguous() and _ptr(y) == _ptr(x) and not t.is_contiguous() and _ptr(z) == _ptr(t)
    return Finding(
        f"non-contiguous randn(4,6)[:, :4].view(2,2,4) works, same storage {_ptr(y) == _ptr(x)}; "
        f"t.T.view(3,1,2) works, same storage {_ptr(z) == _ptr(t)}",
        ok,
        "Correction: view() fails only when the new shape cannot be expressed with the existing "
        "strides (e.g. flattening a transpose), not whenever the tensor is non-contiguous.",
    )


@LAB.check("S0-03", "S2-06", "S2-07")
def reshape_contiguous_clone(ctx: Ctx) -> Finding:
    t = torch.arange(1, 7).view(2, 3)
    r1 = t.reshape(3, 2)
    r2 = t.T.reshape(-1)
    c = t.T.clone()
    tc = t.T.contiguous()
    rows = [
        _desc("t.reshape(3,2)", r1, t),
        _desc("t.T.reshape(-1)", r2, t),
        _desc("t.T.clone()", c, t),
        _desc("t.T.contiguous()", tc, t),
    ]
    same_self = t.contiguous() is t
    ok = (
        _ptr(r1) == _ptr(t)
        and _ptr(r2) != _ptr(t)
        and r2.is_contiguous()
        and c.stride() == (1, 3)
        and not c.is_contiguous()
        and same_self
        and tc.flatten().tolist() == [1, 4, 2, 5, 3, 6]
    )
    return Finding(
        f"reshape views when it can (same storage) and copies otherwise; t.T.clone() stride {c.stride()} "
        f"(not contiguous); t.contiguous() is t: {same_self}; t.T.contiguous() storage "
        f"{tc.flatten().tolist()}",
        ok,
        "Caveats: reshape's copy is a *contiguous* copy, not clone() - clone() keeps the strides "
        "(clone of t.T is still non-contiguous); contiguous() of an already contiguous tensor returns "
        "the tensor itself (an alias, not independent).",
        rows=rows,
    )


@LAB.check("S0-04", "S3-11", timed=True)
def reshape_cost(ctx: Ctx) -> Finding:
    n = ctx.n(2048, 1024)
    x = torch.randn(n, n)
    xt = x.T
    small = compare({"view": lambda: x.view(-1), "reshape": lambda: x.reshape(-1)}, reps=7, inner=2000)
    big = compare(
        {"reshape_T": lambda: xt.reshape(-1), "contig_view_T": lambda: xt.contiguous().view(-1)},
        reps=7,
        inner=ctx.n(2, 4),
    )
    ratio = big["reshape_T"] / big["contig_view_T"]
    free = big["reshape_T"] / small["reshape"]
    rows = [
        {"op": "x.view(-1)", "us": small["view"] * 1e3},
        {"op": "x.reshape(-1)", "us": small["reshape"] * 1e3},
        {"op": f"x.T.reshape(-1) ({n}^2)", "us": big["reshape_T"] * 1e3},
        {"op": "x.T.contiguous().view(-1)", "us": big["contig_view_T"] * 1e3},
    ]
    return Finding(
        f"viewable reshape {small['reshape'] * 1e3:.2f} us vs view {small['view'] * 1e3:.2f} us; "
        f"transposed {n}^2: reshape {big['reshape_T']:.2f} ms vs contiguous().view {big['contig_view_T']:.2f} ms "
        f"(ratio {ratio:.2f}); a copy costs {free:,.0f}x a view",
        0.5 < ratio < 2.0 and free > 100,  # the same copy: only a gross difference would refute it
        "reshape is as cheap as view when a view is possible, and when it is not, view() cannot avoid "
        "the copy either (contiguous().view is the same copy). view only makes the copy explicit; "
        "'reshape is almost free' holds only in the viewable case.",
        rows=rows,
    )


@LAB.check("S4-19")
def einops_is_a_view(ctx: Ctx) -> Finding:
    from einops import rearrange

    b, s, h, d = 2, 5, 4, 8
    q = torch.randn(b, s, h * d)
    r = rearrange(q, "b s (h d) -> b h s d", h=h)
    ref = q.view(b, s, h, d).transpose(1, 2)
    ok = torch.equal(r, ref) and _ptr(r) == _ptr(q) and r.stride() == ref.stride()
    return Finding(
        f"rearrange == view+transpose: {torch.equal(r, ref)}; same storage {_ptr(r) == _ptr(q)}; "
        f"stride {r.stride()}, contiguous {r.is_contiguous()}",
        ok,
        "True: rearrange compiles to view + permute, so it is zero-copy and returns a non-contiguous view.",
    )


@LAB.check("S4-22")
def numpy_and_dlpack_alias(ctx: Ctx) -> Finding:
    arr = np.zeros(4, dtype=np.float32)
    t = torch.from_numpy(arr)
    arr[0] = 7.0
    u = torch.from_dlpack(t)
    u[1] = 3.0
    copied = torch.tensor(arr)
    ok = (
        t[0].item() == 7.0
        and arr[1] == 3.0
        and u.data_ptr() == t.data_ptr()
        and copied.data_ptr() != t.data_ptr()
    )
    return Finding(
        f"from_numpy sees a numpy write: {t[0].item() == 7.0}; from_dlpack same pointer "
        f"{u.data_ptr() == t.data_ptr()}, write visible in numpy {arr[1] == 3.0}; torch.tensor(arr) copies",
        ok,
        "True, and both share memory (zero-copy): in-place writes show on both sides; torch.tensor() copies.",
    )
