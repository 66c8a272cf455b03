"""Tiny random `transformers` PaliGemma models saved to disk, for parity tests of our import code."""

from __future__ import annotations

from pathlib import Path

import torch


def make_tiny_paligemma(folder: Path, seed: int = 0, vocab: int = 300) -> Path:
    from transformers import (
        GemmaConfig,
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        SiglipVisionConfig,
    )

    torch.manual_seed(seed)
    vc = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        vision_use_head=False,
        hidden_act="gelu_pytorch_tanh",
    )
    tc = GemmaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=vocab,
        hidden_act="gelu_pytorch_tanh",
    )
    cfg = PaliGemmaConfig(
        vision_config=vc.to_dict(), text_config=tc.to_dict(), projection_dim=64, image_token_index=vocab - 1
    )
    model = PaliGemmaForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # HF inits norms to 0 (= scale 1); randomise so the (1 + w) convention is tested
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(0, 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return folder
