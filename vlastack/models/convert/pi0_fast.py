"""The tokenizers of an imported pi0-FAST checkpoint, on vlastack's token head.

LeRobot's ``pi0_fast`` (openpi's pi0-FAST) decodes, after ``[images | "Task: ..., State: ...;\\n"
| <bos>]``, the text ``Action: ``, then FAST ids, then ``|`` (and ``<eos>``). A FAST id ``k`` is the
PaliGemma id ``vocab_size - 1 - fast_skip_tokens - k`` (the top ``fast_skip_tokens`` ids, PaliGemma's
``<seg>`` tokens, are skipped): ``TokenPlacement("skip_special")`` with those ids as the specials.
The FAST tokenizer itself is the physical-intelligence processor (``PiFastTokenizer``).

    ckpt = locate(folder)                                   # convert/locate.py
    model, kind, meta = load_checkpoint(ckpt)
    attach_tokenizers(model, ckpt, text_tokenizer)          # the head can now decode
"""

from __future__ import annotations

from typing import Any

import torch

from vlastack.models.action_tokens import PiFastTokenizer, TokenPlacement
from vlastack.models.convert.locate import Checkpoint

ACTION_PREFIX = "Action: "
END_PIECE = "|"


def attach_tokenizers(model: torch.nn.Module, ckpt: Checkpoint, text: Any) -> None:
    """Give ``model.head`` (a pi0_fast token head) its FAST tokenizer (``ckpt.fast``, the processor
    files the config was read from) and the text ids of the sequence (``<bos>``, ``Action: ``,
    ``|``) from ``text``, the checkpoint's SentencePiece tokenizer."""
    folder, meta = ckpt.folder, ckpt.meta
    cfg = model.cfg
    v = cfg.vlm.vocab_size
    if text.vocab_size != v:
        raise ValueError(
            f"{folder}: the text tokenizer has {text.vocab_size} pieces but the embedding {v} rows; "
            "pi0-FAST places its FAST ids from the tokenizer's size, so they must agree"
        )
    skip = int(meta.get("fast_skip_tokens", 128))
    feats = meta.get("output_features", {}).get("action", {})
    action_dim = int(feats.get("shape", [cfg.action_dim])[0])

    def placement(n: int) -> TokenPlacement:
        return TokenPlacement("skip_special", n, v, range(v - skip, v))

    name = meta.get("action_tokenizer_name") or "lerobot/fast-action-tokenizer"
    proc, proc_meta, bpe = ckpt.fast
    tok = PiFastTokenizer.from_files(proc, proc_meta, bpe, cfg.action_horizon, action_dim, placement, name)
    end = text.sp.piece_to_id(END_PIECE)
    if text.sp.id_to_piece(end) != END_PIECE:
        raise ValueError(
            f"{folder}: the text tokenizer has no {END_PIECE!r} piece (pi0-FAST's end of actions)"
        )
    head = model.head
    head.end_id, head.bos_id = end, text.bos_id
    head.prefix_ids = text.encode(ACTION_PREFIX, bos=False)
    head.require_prefix = bool(meta.get("validate_action_token_prefix", True))
    head.attach_tokenizer(tok)
