"""FAST action tokenizer (Pertsch et al. 2025): DCT along time, quantize, BPE.

Per normalized chunk x [H, A]: ``c = D @ x`` with ``D`` the orthonormal DCT-II matrix [H, H], then
``q = round(c * scale)``, flattened frequency-major (``q[0, :]`` = every dim's DC term first, as the
physical-intelligence processor does), so the near-zero high frequencies form long runs at the end
that BPE merges. Each integer is one character; BPE (``tokenizers``) is trained over that alphabet.

Because ``D`` is orthonormal, a quantization error ``e`` (``|e| <= 0.5 / scale`` per coefficient)
reaches the actions as ``D.T @ e``: per element at most ``0.5 / scale * max_n sum_k |D[k, n]|``
(<= ``0.5 * sqrt(H) / scale``) and in RMS at most ``0.5 / scale``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, trainers

from vlastack.models.action_tokens.base import ActionTokenizer, TokenPlacement, _as_chunks

BPE_FILE = "fast_bpe.json"
# Integers are stored as characters from here on: past ASCII/Latin-1 so no whitespace or control
# characters appear, and far below the surrogate range (0xD800) for any realistic alphabet.
CHAR_BASE = 0x100


def dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix float64 [n, n]: ``coeffs = D @ x``, ``x = D.T @ coeffs``."""
    k = np.arange(n)[:, None]
    t = np.arange(n)[None, :]
    d = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * t + 1) * k / (2 * n))
    d[0] /= np.sqrt(2.0)
    return d


def fast_error_bound(horizon: int, scale: float) -> float:
    """Max abs round-trip error of FAST on in-range chunks (quantization only)."""
    return 0.5 / scale * float(np.abs(dct_matrix(horizon)).sum(axis=0).max())


class FastTokenizer(ActionTokenizer):
    """DCT + scale/round + BPE. ``placement.n`` is the BPE vocabulary size (``fast_vocab_size``)."""

    kind = "fast"

    def __init__(
        self,
        horizon: int,
        action_dim: int,
        placement: TokenPlacement,
        scale: float = 10.0,
        min_frequency: int = 2,
        bpe: Tokenizer | None = None,
    ) -> None:
        super().__init__(horizon, action_dim, placement)
        if scale <= 0:
            raise ValueError(f"fast scale must be > 0, got {scale}")
        self.scale, self.min_frequency = float(scale), int(min_frequency)
        self._dct = dct_matrix(self.horizon)
        # |D[k] @ x| <= sum_n |D[k, n]| for x in [-1, 1]^H, so this alphabet covers every in-range
        # chunk: encoding never has to clip a coefficient, whatever data the BPE was fitted on.
        self.bound = int(np.floor(np.abs(self._dct).sum(axis=1).max() * self.scale + 0.5))
        alphabet = 2 * self.bound + 1
        if alphabet > placement.n:
            raise ValueError(
                f"FAST needs {alphabet} base symbols (horizon={horizon}, scale={scale}) but "
                f"fast_vocab_size is {placement.n}; raise fast_vocab_size or lower fast_scale"
            )
        self._bpe: Tokenizer | None = None
        self._pieces: list[np.ndarray] = []
        if bpe is not None:
            self._set_bpe(bpe)

    @property
    def is_fitted(self) -> bool:
        return self._bpe is not None

    @property
    def bpe_vocab_size(self) -> int:
        self._require_fitted()
        return self._bpe.get_vocab_size()

    def _set_bpe(self, bpe: Tokenizer) -> None:
        size = bpe.get_vocab_size()
        if size > self.placement.n:
            raise ValueError(
                f"BPE vocabulary ({size}) exceeds the reserved fast_vocab_size {self.placement.n}"
            )
        offset = CHAR_BASE + self.bound
        pieces = []
        for i in range(size):
            piece = bpe.id_to_token(i)
            if piece is None:
                raise ValueError(f"BPE vocabulary has a hole at id {i}")
            pieces.append(np.fromiter((ord(c) - offset for c in piece), dtype=np.int64, count=len(piece)))
        self._bpe, self._pieces = bpe, pieces

    def piece_lengths(self) -> np.ndarray:
        """Coefficients each internal id's BPE piece expands to, int64 [placement.n]."""
        self._require_fitted()
        out = np.full(self.placement.n, self.horizon * self.action_dim + 1, dtype=np.int64)
        out[: len(self._pieces)] = [len(p) for p in self._pieces]
        return out

    def ordinal_values(self) -> np.ndarray | None:
        """Each id's quantized DCT coefficient when the BPE learned no merges (``fast_vocab_size``
        = the alphabet, ``2 * bound + 1``: one token per coefficient), else None (a piece of
        several coefficients has no order). Reserved, unused ids get inf: never a neighbour."""
        self._require_fitted()
        if any(len(p) != 1 for p in self._pieces):
            return None
        out = np.full(self.placement.n, np.inf)
        out[: len(self._pieces)] = [float(p[0]) for p in self._pieces]
        return out

    def _to_strings(self, chunks: np.ndarray) -> list[str]:
        """Chunks float64 [B, H, A] in [-1, 1] -> B strings of H*A symbols."""
        coeffs = np.einsum("kh,bha->bka", self._dct, chunks)
        q = np.clip(np.rint(coeffs * self.scale), -self.bound, self.bound).astype(np.int64)
        chars = q.reshape(len(chunks), -1) + (CHAR_BASE + self.bound)
        return ["".join(map(chr, row)) for row in chars.tolist()]

    def fit(self, chunks: np.ndarray | Iterable) -> FastTokenizer:
        """Train the BPE on normalized chunks [N, H, A]. Deterministic: same data -> same merges."""
        strings = self._to_strings(_as_chunks(chunks, self.horizon, self.action_dim))
        bpe = Tokenizer(models.BPE())  # no normalizer / pre-tokenizer: one chunk is one "word"
        trainer = trainers.BpeTrainer(
            vocab_size=self.placement.n,
            min_frequency=self.min_frequency,
            special_tokens=[],
            initial_alphabet=[chr(CHAR_BASE + i) for i in range(2 * self.bound + 1)],
            show_progress=False,
        )
        bpe.train_from_iterator(strings, trainer=trainer)
        self._set_bpe(bpe)
        return self

    def _encode_internal(self, chunks: np.ndarray) -> list[np.ndarray]:
        encs = self._bpe.encode_batch(self._to_strings(chunks))
        return [np.asarray(e.ids, dtype=np.int64) for e in encs]

    def _decode_internal(self, tokens: np.ndarray) -> np.ndarray | None:
        if tokens.size == 0 or int(tokens.max()) >= len(self._pieces):
            return None  # reserved-but-unused ids, or nothing generated
        q = np.concatenate([self._pieces[i] for i in tokens.tolist()])
        if q.size != self.horizon * self.action_dim:
            return None
        return self._dct.T @ (q.reshape(self.horizon, self.action_dim) / self.scale)

    def _state(self) -> dict:
        return {
            "scale": self.scale,
            "min_frequency": self.min_frequency,
            "bound": self.bound,
            "char_base": CHAR_BASE,
            "bpe_file": BPE_FILE,
        }

    def save(self, directory: str | Path) -> Path:
        d = super().save(directory)
        (d / BPE_FILE).write_text(self._bpe.to_str(pretty=True) + "\n")
        return d

    @classmethod
    def from_saved(cls, directory: Path, meta: dict, placement: TokenPlacement) -> FastTokenizer:
        bpe_path = directory / meta.get("bpe_file", BPE_FILE)
        if not bpe_path.is_file():
            raise ValueError(f"FAST tokenizer in {directory} is missing its BPE file {bpe_path.name}")
        tok = cls(meta["horizon"], meta["action_dim"], placement, meta["scale"], meta["min_frequency"])
        if tok.bound != meta["bound"] or meta["char_base"] != CHAR_BASE:
            raise ValueError(
                f"{directory}/{json.dumps(meta.get('type'))}: symbol layout (bound {meta['bound']}, base "
                f"{meta['char_base']}) does not match this version (bound {tok.bound}, base {CHAR_BASE})"
            )
        tok._set_bpe(Tokenizer.from_file(str(bpe_path)))
        return tok
