"""torch.compile settings shared by every compiled sampler (a head's ``compile_decoding``, the
flow head's fast path)."""

from __future__ import annotations

import torch

# Each batch size (a server micro-batches 1..max_batch; BID samples K x B) and each sampler kind
# (plain, prefix) is one more compiled variant of the same code (the step, the head's prefill).
# Dynamo allows 8 per code object, and with fullgraph=True the 9th raises FailOnRecompileLimitHit
# instead of running: a server would fail requests from its 9th shape on (tested).
COMPILED_VARIANTS = 64


def allow_recompiles(n: int = COMPILED_VARIANTS) -> None:
    """Raise dynamo's per-code-object recompile limit to at least ``n`` (process-wide: the limit
    is global: ``recompile_limit``, named ``cache_size_limit`` in older torch)."""
    cfg = torch._dynamo.config
    # the first name that exists (``cache_size_limit`` is an alias where both do)
    name = next(k for k in ("recompile_limit", "cache_size_limit") if hasattr(cfg, k))
    if getattr(cfg, name) < n:
        setattr(cfg, name, n)
