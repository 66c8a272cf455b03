"""Discrete action tokenizers: RT-2/OpenVLA uniform bins and FAST (DCT + BPE, see ``fast.py``).

Every tokenizer maps one normalized action chunk ``[H, A]`` (values in [-1, 1]) to a sequence of
*language-model vocabulary ids* and back:

- ``fit(chunks)``: learn from ``[N, H, A]`` data (or an iterable of ``[H, A]`` / ``[n, H, A]``);
- ``encode(chunk [H, A]) -> int64 [T]``, ``encode_batch(chunks [B, H, A]) -> list of int64 [T_b]``;
- ``decode(tokens [T]) -> (chunk float32 [H, A], valid)`` and
  ``decode_batch(tokens [B, T], lengths [B]) -> (chunks float32 [B, H, A], valid bool [B])``.
  A sequence that is not a full chunk gives ``valid=False`` (chunk of zeros that callers must not
  execute) or, with ``strict=True``, a ValueError. It is never silently turned into a zero action.
- ``save(dir)`` / ``load_action_tokenizer(dir)``: JSON only (plus the BPE tokenizer's JSON).

How tokenizer-internal ids (bin index, BPE id) land in the LM vocabulary is a ``TokenPlacement``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

import numpy as np

CONFIG_FILE = "action_tokenizer.json"
PLACEMENTS = ("overwrite_last", "skip_special", "new_rows")


class TokenPlacement:
    """Maps ``n`` internal token ids ``0..n-1`` to LM vocabulary ids.

    - ``overwrite_last``: the last ``n`` ids, counting down (internal 0 -> ``vocab_size - 1``), as
      OpenVLA does; refuses to overwrite a special id.
    - ``skip_special``: the last ``n`` ids that are not special, counting down, as openpi does
      (``vocab_size - 1 - num_skipped - t`` when the specials are the top ids).
    - ``new_rows``: ``vocab_size .. vocab_size + n - 1``; the LM needs ``required_vocab_size`` rows.
    """

    def __init__(self, strategy: str, n: int, vocab_size: int, special_ids: Iterable[int] = ()) -> None:
        if strategy not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {strategy!r}")
        if n <= 0 or vocab_size <= 0:
            raise ValueError(f"need n > 0 and vocab_size > 0, got n={n}, vocab_size={vocab_size}")
        self.strategy, self.n, self.vocab_size = strategy, int(n), int(vocab_size)
        self.special_ids = sorted({int(i) for i in special_ids})
        special = set(self.special_ids)
        if strategy == "new_rows":
            ids = np.arange(vocab_size, vocab_size + n, dtype=np.int64)
        elif strategy == "overwrite_last":
            if n > vocab_size:
                raise ValueError(
                    f"overwrite_last needs {n} action ids but the LM vocabulary has only {vocab_size}; "
                    "use placement='new_rows' (or fewer bins / a smaller fast_vocab_size)"
                )
            ids = np.arange(vocab_size - 1, vocab_size - 1 - n, -1, dtype=np.int64)
            clash = sorted(special.intersection(ids.tolist()))
            if clash:
                raise ValueError(
                    f"overwrite_last would overwrite special token ids {clash[:8]}; "
                    "use placement='skip_special' or 'new_rows'"
                )
        else:
            free = [i for i in range(vocab_size - 1, -1, -1) if i not in special][:n]
            if len(free) < n:
                raise ValueError(
                    f"skip_special needs {n} non-special ids but the LM vocabulary of {vocab_size} has "
                    f"only {len(free)}; use placement='new_rows'"
                )
            ids = np.asarray(free, dtype=np.int64)
        self.ids = ids  # internal id -> LM id
        self.required_vocab_size = max(vocab_size, int(ids.max()) + 1)
        self._inverse = np.full(self.required_vocab_size, -1, dtype=np.int64)
        self._inverse[ids] = np.arange(n, dtype=np.int64)

    def to_lm(self, tokens: np.ndarray) -> np.ndarray:
        """Internal ids int [...] -> LM ids int64 [...]."""
        return self.ids[np.asarray(tokens, dtype=np.int64)]

    def from_lm(self, ids: np.ndarray) -> np.ndarray:
        """LM ids int [...] -> internal ids int64 [...]; -1 where an id is not an action token."""
        ids = np.asarray(ids, dtype=np.int64)
        ok = (ids >= 0) & (ids < self.required_vocab_size)
        return np.where(ok, self._inverse[np.where(ok, ids, 0)], -1)

    def to_json(self) -> dict:
        return {
            "strategy": self.strategy,
            "n": self.n,
            "vocab_size": self.vocab_size,
            "special_ids": self.special_ids,
        }

    @classmethod
    def from_json(cls, d: dict) -> TokenPlacement:
        return cls(d["strategy"], d["n"], d["vocab_size"], d["special_ids"])


def _as_chunks(chunks: np.ndarray | Iterable, horizon: int, action_dim: int) -> np.ndarray:
    """An array [N, H, A] or an iterable of [H, A] / [n, H, A] -> float64 [N, H, A] clipped to [-1, 1]."""
    if isinstance(chunks, np.ndarray):
        parts = [chunks]
    else:
        parts = [np.asarray(c) for c in chunks]
    parts = [p[None] if p.ndim == 2 else p for p in parts]
    for p in parts:
        if p.ndim != 3 or p.shape[1:] != (horizon, action_dim):
            raise ValueError(
                f"action chunks must have shape [N, {horizon}, {action_dim}] (or [{horizon}, {action_dim}]), "
                f"got {tuple(p.shape)}"
            )
    if not parts:
        raise ValueError("fit() got no action chunks")
    out = np.concatenate(parts, axis=0).astype(np.float64)
    if not np.isfinite(out).all():
        raise ValueError("action chunks contain NaN or inf; normalize the data first")
    return np.clip(out, -1.0, 1.0)


class ActionTokenizer:
    """Shared plumbing. Subclasses implement ``_encode_internal`` / ``_decode_internal``."""

    kind = ""
    # The model.head_options.tokenizer value this tokenizer serves ("bins" | "fast"); None: ``kind``.
    family: ClassVar[str | None] = None
    # Decoded chunks are clipped to [-1, 1] (the range the tokenizer was fitted on).
    clip_output: ClassVar[bool] = True
    # Subclasses by ``kind``, filled as they are defined, so ``load`` finds the class a folder names
    # without this module importing its subclasses (``fast.py`` imports this one).
    KINDS: ClassVar[dict[str, type[ActionTokenizer]]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            ActionTokenizer.KINDS[cls.kind] = cls

    def __init__(self, horizon: int, action_dim: int, placement: TokenPlacement) -> None:
        if horizon <= 0 or action_dim <= 0:
            raise ValueError(f"horizon and action_dim must be > 0, got {horizon}, {action_dim}")
        self.horizon, self.action_dim, self.placement = int(horizon), int(action_dim), placement

    # -- overridden by subclasses
    def fit(self, chunks: np.ndarray | Iterable) -> ActionTokenizer:
        """Learn from normalized chunks [N, H, A]. Returns self."""
        _as_chunks(chunks, self.horizon, self.action_dim)
        return self

    @property
    def is_fitted(self) -> bool:
        return True

    @property
    def fixed_length(self) -> int | None:
        """Tokens per chunk when it is constant (bins: H*A), else None (FAST)."""
        return None

    def ordinal_values(self) -> np.ndarray | None:
        """The number each internal id stands for, float64 [placement.n], when ids are ordinal (one
        quantized value each: bins, FAST without BPE merges), else None. Soft training targets
        (``bin_sigma``) spread over the ids of neighbouring values."""
        return None

    def piece_lengths(self) -> np.ndarray | None:
        """Symbols each internal id expands to, int64 [placement.n] (a full chunk is H*A symbols),
        where a tokenizer knows them (FAST: the BPE piece lengths; unused ids get H*A + 1 so no
        chunk can use them); None otherwise. Length-constrained decoding reads it."""
        return None

    def _encode_internal(self, chunks: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _decode_internal(self, tokens: np.ndarray) -> np.ndarray | None:
        """Internal ids int64 [T] (all >= 0) -> chunk [H, A], or None if they are not a full chunk."""
        raise NotImplementedError

    def _state(self) -> dict:
        return {}

    # -- public API
    @property
    def required_vocab_size(self) -> int:
        """LM vocabulary rows needed (> vocab_size only for placement 'new_rows')."""
        return self.placement.required_vocab_size

    @property
    def action_token_ids(self) -> np.ndarray:
        """All LM ids this tokenizer can emit, int64 [n] (e.g. to restrict logits while decoding)."""
        return self.placement.ids.copy()

    def encode(self, chunk: np.ndarray) -> np.ndarray:
        """Normalized chunk [H, A] (clipped to [-1, 1]) -> LM ids int64 [T]."""
        chunk = np.asarray(chunk)
        if chunk.shape != (self.horizon, self.action_dim):
            raise ValueError(f"chunk must be [{self.horizon}, {self.action_dim}], got {tuple(chunk.shape)}")
        return self.encode_batch(chunk[None])[0]

    def encode_batch(self, chunks: np.ndarray) -> list[np.ndarray]:
        """Normalized chunks [B, H, A] -> B arrays of LM ids int64 [T_b]."""
        self._require_fitted()
        internal = self._encode_internal(_as_chunks(np.asarray(chunks), self.horizon, self.action_dim))
        return [self.placement.to_lm(t) for t in internal]

    def decode(self, tokens: np.ndarray | list[int], strict: bool = False) -> tuple[np.ndarray, bool]:
        """LM ids [T] -> (chunk float32 [H, A], valid). Invalid: zeros + False, or ValueError if strict."""
        self._require_fitted()
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        internal = self.placement.from_lm(ids)
        chunk = None if (internal < 0).any() else self._decode_internal(internal)
        if chunk is None:
            if strict:
                raise ValueError(
                    f"{self.kind} tokens do not decode to a full [{self.horizon}, {self.action_dim}] chunk "
                    f"(got {ids.size} tokens, {(internal < 0).sum()} not action tokens)"
                )
            return np.zeros((self.horizon, self.action_dim), dtype=np.float32), False
        return (np.clip(chunk, -1.0, 1.0) if self.clip_output else chunk).astype(np.float32), True

    def decode_batch(
        self, tokens: np.ndarray, lengths: np.ndarray | None = None, strict: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """LM ids [B, T] with valid lengths [B] (default T) -> (chunks float32 [B, H, A], valid bool [B])."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [B, T], got shape {tuple(tokens.shape)}")
        b, t = tokens.shape
        lengths = np.full(b, t) if lengths is None else np.asarray(lengths, dtype=np.int64).reshape(-1)
        if lengths.shape != (b,) or (lengths < 0).any() or (lengths > t).any():
            raise ValueError(f"lengths must be [B={b}] with values in [0, {t}], got {lengths.tolist()}")
        out = np.zeros((b, self.horizon, self.action_dim), dtype=np.float32)
        valid = np.zeros(b, dtype=bool)
        for i in range(b):
            out[i], valid[i] = self.decode(tokens[i, : lengths[i]], strict=strict)
        return out, valid

    def save(self, directory: str | Path) -> Path:
        """Write ``action_tokenizer.json`` (+ FAST's BPE JSON) into ``directory``."""
        self._require_fitted()
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        meta = {
            "type": self.kind,
            "horizon": self.horizon,
            "action_dim": self.action_dim,
            "placement": self.placement.to_json(),
            **self._state(),
        }
        (d / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return d

    @classmethod
    def load(cls, directory: str | Path) -> ActionTokenizer:
        """Load a saved tokenizer (of this class or a subclass); inverse of ``save``."""
        d = Path(directory)
        path = d / CONFIG_FILE
        if not path.is_file():
            raise ValueError(f"no {CONFIG_FILE} in {d}; was the action tokenizer saved there?")
        meta = json.loads(path.read_text())
        kind = ActionTokenizer.KINDS.get(meta["type"])
        if kind is None:
            raise ValueError(f"{path}: unknown action tokenizer type {meta['type']!r}")
        tok = kind.from_saved(d, meta, TokenPlacement.from_json(meta["placement"]))
        if not isinstance(tok, cls):
            raise ValueError(f"{directory} holds a {tok.kind!r} action tokenizer, not {cls.__name__}")
        return tok

    @classmethod
    def from_saved(cls, directory: Path, meta: dict, placement: TokenPlacement) -> ActionTokenizer:
        """Rebuild from the saved ``meta`` (the JSON written by ``save``) and ``placement``."""
        raise NotImplementedError

    def _require_fitted(self) -> None:
        if not self.is_fitted:
            raise ValueError(f"the {self.kind} action tokenizer is not fitted; call fit(chunks) or load it")


class BinTokenizer(ActionTokenizer):
    """RT-2/OpenVLA: ``num_bins`` uniform bins per dimension over [-1, 1], H*A tokens per chunk in
    time-major order (step 0's dims first). Decoding returns bin centers, so the round-trip error on
    in-range values is at most half a bin width, ``1 / num_bins``."""

    kind = "bins"

    def __init__(self, horizon: int, action_dim: int, placement: TokenPlacement, num_bins: int = 256) -> None:
        super().__init__(horizon, action_dim, placement)
        if num_bins < 2 or placement.n != num_bins:
            raise ValueError(
                f"num_bins must be >= 2 and match the placement size, got {num_bins}/{placement.n}"
            )
        self.num_bins = int(num_bins)

    @property
    def fixed_length(self) -> int:
        return self.horizon * self.action_dim

    def ordinal_values(self) -> np.ndarray:
        return np.arange(self.num_bins, dtype=np.float64)

    def _encode_internal(self, chunks: np.ndarray) -> list[np.ndarray]:
        b = np.floor((chunks + 1.0) * (self.num_bins / 2.0)).astype(np.int64)
        b = np.clip(b, 0, self.num_bins - 1).reshape(len(chunks), -1)
        return list(b)

    def _decode_internal(self, tokens: np.ndarray) -> np.ndarray | None:
        if tokens.size != self.horizon * self.action_dim:
            return None
        centers = -1.0 + (tokens + 0.5) * (2.0 / self.num_bins)
        return centers.reshape(self.horizon, self.action_dim)

    def _state(self) -> dict:
        return {"num_bins": self.num_bins}

    @classmethod
    def from_saved(cls, directory: Path, meta: dict, placement: TokenPlacement) -> BinTokenizer:
        return cls(meta["horizon"], meta["action_dim"], placement, meta["num_bins"])
