"""What ``Policy`` asks a head for at inference: ``HeadServing``. A head's ``serving_cls`` says which
class serves it; this base samples plainly and refuses every optional capability (real-time
chunking, the fast path, decoding options) with a clear error, so ``Policy`` never needs to know
which head it holds. The flow head's: ``flow/serving.py``; the token heads': ``tokens/serving.py``.

A server is given options by keyword (``Policy(..., fast=True, guidance_max=5)``); each head's
serving class declares its own in ``OPTIONS`` (name -> default). An option another head declares
is accepted at its default (so one command line serves every head) and refused otherwise.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from vlastack.nn.compile import allow_recompiles


def parse_decoding(items: list[str]) -> dict[str, str]:
    """``--decode KEY=VALUE`` arguments (`vla serve`, `vla eval`) -> {key: value}. Keys are checked
    against every head's ``DECODING`` here, against the policy's own head and values when they are
    applied (``set_decoding``)."""
    known = sorted(HeadServing.ALL_DECODING)
    pairs = [kv.split("=", 1) for kv in items]
    bad = [kv for kv, p in zip(items, pairs, strict=True) if len(p) != 2 or p[0] not in known]
    if bad:
        raise ValueError(f"--decode takes KEY=VALUE with KEY one of {known}, got {bad}")
    return dict(pairs)


def set_decoding(model: torch.nn.Module, options: dict[str, Any], keys: tuple[str, ...]) -> None:
    """Change a head's decoding options (``model.head_options.<key>``, one of ``keys``, its serving
    class's ``DECODING``; values may be strings, as from ``vla serve --decode top_p=0.9``), checked
    like any config key."""
    from vlastack.config import Config, EvalConfig, apply_overrides

    cfg = model.cfg
    if not keys:
        raise ValueError(f"head {cfg.head!r} has no decoding options (token heads and flow heads do)")
    bad = sorted(set(options) - set(keys))
    if bad:
        raise ValueError(f"unknown decoding option(s) {bad} for head {cfg.head!r}; known: {list(keys)}")
    top = Config(model=cfg, eval=EvalConfig(steps_per_chunk=min(8, cfg.action_horizon)))
    new = apply_overrides(top, [f"model.head_options.{k}={v}" for k, v in options.items()]).model
    model.cfg = model.head.cfg = new


class HeadServing:
    """Plain sampling through ``model.sample``; every optional capability refuses.

    ``policy`` is the ``Policy`` being built (duck-typed: its ``model``, ``cfg``, ``device``,
    ``lock``, ``autocast()``, ``generator``, ``normalizer``, ``action_dim``, ``warn_once``), read
    when serving, never imported (models/ sits below infer/)."""

    OPTIONS: ClassVar[dict[str, Any]] = {}  # this head's serving options and their defaults
    # model.head_options keys a server may change (option "decoding": {key: value}; set_decoding)
    DECODING: ClassVar[tuple[str, ...]] = ()
    # Serving options and decoding keys of every head (filled by models/heads/__init__.py).
    ALL_OPTIONS: ClassVar[dict[str, Any]] = {}
    ALL_DECODING: ClassVar[tuple[str, ...]] = ()

    def __init__(self, policy: Any, compile: bool = False, **options: Any) -> None:
        self.policy = policy
        if options.get("decoding") and "decoding" in self.OPTIONS:  # first: they shape compiled steps
            set_decoding(policy.model, options["decoding"], self.DECODING)  # Policy re-reads model.cfg
        for key, value in options.items():
            if key in self.OPTIONS:
                continue
            if key not in self.ALL_OPTIONS:
                known = sorted(self.ALL_OPTIONS)
                raise ValueError(f"unknown policy option {key!r}; options: {known}")
            if value != self.ALL_OPTIONS[key]:
                raise ValueError(
                    f"{key}={value!r}: head {policy.cfg.head!r} does not take {key!r} "
                    f"(its options: {sorted(self.OPTIONS) or 'none'})"
                )
        for key, default in self.OPTIONS.items():
            setattr(self, key, options.get(key, default))
        self.check_options()
        if compile:
            self.compile()

    # ------------------------------------------------------------------ what every head does

    def check_options(self) -> None:
        """Raise ValueError for a bad value of one of ``OPTIONS`` (set as attributes)."""

    def compile(self) -> None:
        """``Policy(compile=True)``: the head's ``compile_decoding`` (one that has none warns,
        never a silent no-op). One compiled variant per batch size: nn/compile.py."""
        allow_recompiles()
        self.policy.model.head.compile_decoding()

    def sample(self, batch: dict[str, Tensor], noise: Tensor) -> tuple[Tensor, Tensor | None]:
        """A model batch and noise [B, H, A] -> (normalized actions [B, H, A], valid bool [B] or
        None). Caller holds the policy's lock."""
        p = self.policy
        with torch.inference_mode(), p.autocast():  # a sampler that draws uses the policy's seed
            out = p.model.sample(batch, noise=noise, generator=p.generator)
        return out.actions, out.valid

    def after_sample(
        self, actions: np.ndarray, valid: np.ndarray | None, streams: Sequence[Hashable | None]
    ) -> np.ndarray | None:
        """Env-unit actions [B, H, A_env] (may be changed in place), their validity and each row's
        stream (``Obs.stream``: its episode or client) -> which rows were replaced (bool [B]) or
        None. Under the lock."""
        return None

    def reset(self, stream: Hashable | None = None) -> None:
        """A new episode starts (``Policy.reset``): forget what was kept for ``stream``, or for every
        stream (None)."""

    @property
    def decode_stats(self) -> dict[str, int] | None:
        """Counters of chunks that did not decode (token heads); None: the head has none."""
        return None

    def metadata(self) -> dict[str, Any]:
        """The head's part of ``Policy.metadata``."""
        return {"rtc_methods": list(self.rtc_methods), "rtc_guidance": None}

    # ------------------------------------------------------------------ optional capabilities

    rtc_methods: tuple[str, ...] = ()  # real-time chunking requests it answers (infer/realtime.py)

    def answer_prefix(
        self, obs_list: list[Any], batch: dict[str, Tensor], noise: Tensor | None = None
    ) -> np.ndarray:
        """Observations with an ``action_prefix`` -> env-unit actions [B, H, A_env] continuing it."""
        raise ValueError(
            f"real-time chunking needs a head that denoises (a flow head); this policy's head is "
            f"{self.policy.cfg.head!r}"
        )

    def check_rl(self) -> None:
        """``vla rl`` (GRPO, ``rl/runner.py``) needs a stochastic policy with log-probabilities:
        raise ValueError where the head has none."""
        self._refuse_rl()

    def _refuse_rl(self, how: str = "") -> None:
        raise ValueError(
            f"vla rl fine-tunes token heads with autoregressive decoding and flow heads; this policy's "
            f"head is {self.policy.cfg.head!r}{how}, which samples no per-token or per-step distribution "
            "to reinforce"
        )

    def rl_sample(
        self, batch: dict[str, Tensor], rl: Any, generator: torch.Generator
    ) -> tuple[Tensor, Tensor, Tensor]:
        """A model batch -> (normalized actions [B, H, A], what was sampled (``rl_logprobs``' input),
        valid bool [B]), drawn with ``rl`` (``RLConfig``)'s noise from ``generator``."""
        self.check_rl()
        raise NotImplementedError

    def rl_logprobs(
        self, model: torch.nn.Module, batch: dict[str, Tensor], sampled: Tensor, rl: Any
    ) -> tuple[Tensor, Tensor]:
        """Log-probabilities fp32 [B, L] under ``model`` (the policy's, or a reference copy) of what
        ``rl_sample`` drew, with gradients, and their mask bool [B, L]."""
        self.check_rl()
        raise NotImplementedError

    def set_execution(self, execution: Any) -> None:
        """Take real-time execution settings (``ExecutionConfig``) where the head uses them."""
