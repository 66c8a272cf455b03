"""How a token head serves: ``TokenServing`` (``models/heads/serving.py``'s interface).

- decoding options at serving time (``Policy(decoding={...})``, ``vla serve --decode KEY=VALUE``):
  ``DECODING_KEYS`` of ``model.head_options``, checked like any config key;
- sampling from the policy's seeded generator (temperature > 0);
- chunks whose tokens do not decode (``valid`` False): counted in ``decode_stats``, and with
  ``model.head_options.invalid_decode=repeat_last`` replaced by the last valid chunk of the same
  stream (``Obs.stream``: one episode or client), so episodes side by side and a server's clients
  never receive each other's chunks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from vlastack.models.heads.serving import HeadServing
from vlastack.models.heads.tokens.rl import token_logprobs

DECODING_KEYS = ("temperature", "top_p", "max_decode_steps", "invalid_decode", "constrained", "exact_length")


class TokenServing(HeadServing):
    OPTIONS: ClassVar[dict[str, Any]] = {"decoding": None}  # {key: value} of DECODING_KEYS
    DECODING = DECODING_KEYS

    def __init__(self, policy: Any, compile: bool = False, **options: Any) -> None:
        super().__init__(policy, compile=compile, **options)
        self.invalid_decode = policy.model.cfg.head_options.invalid_decode
        self.stats = {"chunks": 0, "invalid": 0, "repeated": 0}
        # The latest valid chunk [H, A_env] of each stream (repeat_last); stream None keeps none.
        self._last_valid: dict[Hashable, np.ndarray] = {}

    def check_rl(self) -> None:
        decoding = self.policy.model.cfg.head_options.decoding
        if decoding != "autoregressive":  # every token at once, nothing sampled one by one
            self._refuse_rl(f" with {decoding} decoding")

    def rl_sample(
        self, batch: dict[str, Tensor], rl: Any, generator: torch.Generator
    ) -> tuple[Tensor, Tensor, Tensor]:
        model = self.policy.model
        ids, lengths = model.head.generate(model, batch, rl.temperature, 1.0, generator)
        actions, valid = model.head.decode_actions(ids, lengths)
        return actions, ids, valid

    def rl_logprobs(
        self, model: torch.nn.Module, batch: dict[str, Tensor], sampled: Tensor, rl: Any
    ) -> tuple[Tensor, Tensor]:
        return token_logprobs(model, batch, sampled, rl.temperature)

    def after_sample(
        self, actions: np.ndarray, valid: np.ndarray | None, streams: Sequence[Hashable | None]
    ) -> np.ndarray | None:
        """Count invalid chunks; with ``repeat_last`` overwrite each with the latest valid chunk of
        its own stream (in place; none yet, or stream None: it stays zero). -> repeated bool [B].
        Under the lock."""
        if valid is None:
            return None
        repeated = np.zeros(len(valid), dtype=bool)
        if self.invalid_decode == "repeat_last":
            for i, (ok, key) in enumerate(zip(valid, streams, strict=True)):
                # one dict operation each: a server's reset(stream) may run on another thread
                if key is None:
                    continue  # a query with no history
                if ok:
                    self._last_valid[key] = actions[i].copy()
                elif (last := self._last_valid.get(key)) is not None:
                    actions[i], repeated[i] = last, True
        s = self.stats
        s["chunks"] += len(valid)
        s["invalid"] += int((~valid).sum())
        s["repeated"] += int(repeated.sum())
        return repeated

    def reset(self, stream: Hashable | None = None) -> None:
        # dict.clear / dict.pop are atomic under the GIL: no lock, so a server's event loop never
        # waits for a forward pass to forget a closed connection
        if stream is None:
            self._last_valid.clear()
        else:
            self._last_valid.pop(stream, None)

    @property
    def decode_stats(self) -> dict[str, int]:
        return self.stats
