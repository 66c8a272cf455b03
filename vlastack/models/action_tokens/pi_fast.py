"""The physical-intelligence FAST tokenizer, as pi0-FAST checkpoints (LeRobot ``pi0_fast``, openpi)
use it: read from its processor folder (``processor_config.json`` + ``tokenizer.json``), never fitted.

Same idea as vlastack's own ``FastTokenizer`` (fast.py: DCT along time, ``round(scale * c)``,
frequency-major, BPE) but its symbol layout is the reference's, so imported weights keep their
meaning: a coefficient ``q`` is the character ``chr(max(q - min_token, 0))`` and the BPE is a
HF ``tokenizers`` ByteLevel BPE (the string goes through UTF-8 bytes, decoding back through the
tokenizer's decoder). Decoding is strict: a sequence that does not decode to exactly ``H * A``
coefficients is invalid (LeRobot's ``relaxed_decoding`` pads it with zeros or truncates it and
executes the result). Decoded actions are not clipped (the checkpoint's normalization, e.g.
MEAN_STD, may legitimately leave [-1, 1]).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from vlastack.models.action_tokens.base import ActionTokenizer, TokenPlacement
from vlastack.models.action_tokens.fast import dct_matrix

BPE_FILE = "pi_fast_bpe.json"
DEFAULT_NAME = "lerobot/fast-action-tokenizer"
PROCESSOR_FILES = ("processor_config.json", "tokenizer.json")


class PiFastTokenizer(ActionTokenizer):
    """``placement.n`` is the BPE vocabulary size; internal id ``k`` is BPE id ``k``."""

    kind = "pi_fast"
    family = "fast"
    clip_output = False

    def __init__(
        self,
        horizon: int,
        action_dim: int,
        placement: TokenPlacement,
        scale: float,
        min_token: int,
        bpe: Tokenizer,
        name: str = DEFAULT_NAME,
    ) -> None:
        super().__init__(horizon, action_dim, placement)
        if scale <= 0:
            raise ValueError(f"FAST scale must be > 0, got {scale}")
        if bpe.get_vocab_size() > placement.n:
            raise ValueError(f"BPE vocabulary ({bpe.get_vocab_size()}) exceeds the placement ({placement.n})")
        self.scale, self.min_token, self._bpe = float(scale), int(min_token), bpe
        self.name = name  # the processor's Hub id / path in the checkpoint's config (for export)
        self._dct = dct_matrix(self.horizon)

    @classmethod
    def from_processor(
        cls,
        folder: str | Path,
        horizon: int,
        action_dim: int,
        placement_for: Callable[[int], TokenPlacement],
        name: str = DEFAULT_NAME,
    ) -> PiFastTokenizer:
        """A FAST processor folder (``AutoProcessor.from_pretrained``'s files). ``placement_for(n)``
        -> the ``TokenPlacement`` of ``n`` BPE ids in the LM vocabulary."""
        folder = Path(folder)
        missing = [f for f in PROCESSOR_FILES if not (folder / f).is_file()]
        if missing:
            raise ValueError(f"FAST processor folder {folder} lacks {missing}")
        meta = json.loads((folder / "processor_config.json").read_text())
        bpe = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return cls.from_files(folder, meta, bpe, horizon, action_dim, placement_for, name)

    @classmethod
    def from_files(
        cls,
        folder: str | Path,
        meta: dict,
        bpe: Tokenizer,
        horizon: int,
        action_dim: int,
        placement_for: Callable[[int], TokenPlacement],
        name: str = DEFAULT_NAME,
    ) -> PiFastTokenizer:
        """``from_processor`` on files already read: ``processor_config.json`` as ``meta``, the BPE
        ``tokenizer.json`` as ``bpe`` (``folder`` names them in errors)."""
        for key in ("scale", "min_token"):
            if key not in meta:
                raise ValueError(f"{folder}/processor_config.json has no {key!r}")
        for key, want in (("time_horizon", horizon), ("action_dim", action_dim)):
            if meta.get(key) not in (None, want):
                raise ValueError(
                    f"{folder}/processor_config.json: {key}={meta[key]} but the checkpoint predicts {want}"
                )
        n = bpe.get_vocab_size()
        return cls(horizon, action_dim, placement_for(n), meta["scale"], meta["min_token"], bpe, name)

    @property
    def bpe_vocab_size(self) -> int:
        return self._bpe.get_vocab_size()

    def fit(self, chunks: np.ndarray) -> PiFastTokenizer:
        raise ValueError(
            "a pi0-FAST checkpoint's FAST tokenizer is fixed by its weights; fine-tune with it, do not refit it"
        )

    def encode_batch(self, chunks: np.ndarray) -> list[np.ndarray]:
        """Normalized chunks [B, H, A] (not clipped) -> B arrays of LM ids int64 [T_b]."""
        x = np.asarray(chunks, dtype=np.float64)
        if x.ndim != 3 or x.shape[1:] != (self.horizon, self.action_dim):
            raise ValueError(f"chunks must be [B, {self.horizon}, {self.action_dim}], got {tuple(x.shape)}")
        q = np.around(np.einsum("kh,bha->bka", self._dct, x) * self.scale)
        sym = np.maximum(q.reshape(len(x), -1) - self.min_token, 0).astype(np.int64)
        encs = self._bpe.encode_batch(["".join(map(chr, row)) for row in sym.tolist()])
        return [self.placement.to_lm(np.asarray(e.ids, dtype=np.int64)) for e in encs]

    def _decode_internal(self, tokens: np.ndarray) -> np.ndarray | None:
        if tokens.size == 0 or int(tokens.max()) >= self.bpe_vocab_size:
            return None
        coeffs = np.fromiter((ord(c) for c in self._bpe.decode(tokens.tolist())), dtype=np.int64)
        if coeffs.size != self.horizon * self.action_dim:
            return None
        q = (coeffs + self.min_token).reshape(self.horizon, self.action_dim)
        return self._dct.T @ (q / self.scale)

    def _state(self) -> dict:
        return {"scale": self.scale, "min_token": self.min_token, "bpe_file": BPE_FILE, "name": self.name}

    def save(self, directory: str | Path) -> Path:
        d = super().save(directory)
        (d / BPE_FILE).write_text(self._bpe.to_str(pretty=True) + "\n")
        return d

    def save_processor(self, folder: str | Path) -> Path:
        """Write the processor folder LeRobot's ``AutoProcessor`` files hold (config + BPE)."""
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        meta = {"action_dim": self.action_dim, "min_token": self.min_token,
                "processor_class": "UniversalActionProcessor", "scale": self.scale,
                "time_horizon": self.horizon, "vocab_size": self.bpe_vocab_size}  # fmt: skip
        (d / "processor_config.json").write_text(json.dumps(meta, indent=2) + "\n")
        (d / "tokenizer.json").write_text(self._bpe.to_str(pretty=True) + "\n")
        cfg = {"clean_up_tokenization_spaces": False, "processor_class": "UniversalActionProcessor",
               "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        return d

    @classmethod
    def from_saved(cls, directory: Path, meta: dict, placement: TokenPlacement) -> PiFastTokenizer:
        path = directory / meta.get("bpe_file", BPE_FILE)
        if not path.is_file():
            raise ValueError(f"pi0-FAST tokenizer in {directory} is missing its BPE file {path.name}")
        bpe = Tokenizer.from_file(str(path))
        name = meta.get("name", DEFAULT_NAME)
        return cls(
            meta["horizon"], meta["action_dim"], placement, meta["scale"], meta["min_token"], bpe, name
        )
