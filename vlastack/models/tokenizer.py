"""Text tokenizers: a file-free byte-level one for small presets, and SentencePiece/`tokenizers`
files read from a Hugging Face-format folder (PaliGemma/Gemma) for real checkpoints.

Every tokenizer has ``encode(text) -> list[int]`` (with BOS), ``decode(ids)``, ``pad_id``,
``bos_id``, ``eos_id``, ``vocab_size``, and ``tokenize(text, max_len) -> (ids [L], mask [L])``.
Following openpi, a prompt is cleaned (strip, '_' -> ' ') and ends with a newline.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def clean_prompt(text: str) -> str:
    return text.strip().replace("_", " ").replace("\n", " ") + "\n"


class _Base:
    pad_id: int
    bos_id: int
    eos_id: int
    vocab_size: int

    def encode(self, text: str, bos: bool = True) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def tokenize(self, text: str, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """-> ids int64 [max_len] (right-padded with pad_id, truncated), mask bool [max_len]."""
        ids = self.encode(clean_prompt(text))[:max_len]
        out = np.full(max_len, self.pad_id, dtype=np.int64)
        out[: len(ids)] = ids
        mask = np.zeros(max_len, dtype=bool)
        mask[: len(ids)] = True
        return out, mask


class ByteTokenizer(_Base):
    """UTF-8 bytes shifted by 4. Ids: 0 pad, 1 bos, 2 eos, 3 reserved, 4..259 bytes (vocab 260)."""

    OFFSET = 4

    def __init__(self) -> None:
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.vocab_size = 256 + self.OFFSET

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = [b + self.OFFSET for b in text.encode("utf-8")]
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i - self.OFFSET for i in ids if i >= self.OFFSET).decode("utf-8", errors="replace")

    def to_json(self) -> dict:
        return {"type": "byte"}


class SentencePieceTokenizer(_Base):
    """A ``tokenizer.model`` file (Gemma/PaliGemma)."""

    def __init__(self, path: str | Path) -> None:
        import sentencepiece as spm

        self.path = str(path)
        self.sp = spm.SentencePieceProcessor(model_file=self.path)
        self.pad_id = max(self.sp.pad_id(), 0)
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()
        self.vocab_size = self.sp.get_piece_size()

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = self.sp.encode(text)
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(list(ids))


class HFTokenizer(_Base):
    """A ``tokenizer.json`` file read with the `tokenizers` library (no `transformers` needed)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self.path = str(path)
        self.tok = Tokenizer.from_file(self.path)
        cfg_path = Path(path).parent / "tokenizer_config.json"
        extra = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}

        def tid(name: str, default: str) -> int:
            tok = extra.get(name) or default
            if isinstance(tok, dict):
                tok = tok.get("content", default)
            i = self.tok.token_to_id(tok)
            return -1 if i is None else i

        self.pad_id = max(tid("pad_token", "<pad>"), 0)
        self.bos_id = tid("bos_token", "<bos>")
        self.eos_id = tid("eos_token", "<eos>")
        self.vocab_size = self.tok.get_vocab_size()

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if bos and self.bos_id >= 0 else ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids))


Tokenizer = ByteTokenizer | SentencePieceTokenizer | HFTokenizer


def load_tokenizer(spec: str) -> Tokenizer:
    """``"byte"`` or a folder holding ``tokenizer.json`` (preferred) or ``tokenizer.model``."""
    if spec == "byte":
        return ByteTokenizer()
    folder = Path(spec)
    if (folder / "tokenizer.json").exists():
        return HFTokenizer(folder / "tokenizer.json")
    if (folder / "tokenizer.model").exists():
        return SentencePieceTokenizer(folder / "tokenizer.model")
    raise ValueError(
        f"model.tokenizer={spec!r}: expected 'byte' or a folder with tokenizer.json or tokenizer.model"
    )
