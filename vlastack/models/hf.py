"""Import/export Hugging Face-format PaliGemma folders by an explicit key map (no `transformers`
needed at run time). Accepts both the original checkpoint layout (``language_model.model.*``,
``vision_tower.vision_model.*``) and the transformers>=4.52 layout (``model.language_model.*``).

    cfg = config_from_paligemma(folder, base=pi0().model)   # shapes from config.json
    model = build_model(cfg); load_paligemma(model, folder)  # VLM weights; expert/head untouched
    export_paligemma(model, out_folder)                      # and back
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from vlastack.config import DecoderConfig, ModelConfig, VisionConfig
from vlastack.fileio import open_safetensors, read_json, safetensors_read_error

# canonical HF key (regex) -> our key template
_RULES: list[tuple[str, str]] = [
    (r"vision_tower\.(.*)", r"vision.\1"),
    (r"multi_modal_projector\.linear\.(.*)", r"projector.\1"),
    (r"language_model\.embed_tokens\.weight", "decoder.embed_tokens.weight"),
    (r"language_model\.norm\.weight", "decoder.norm.weight"),
    (r"language_model\.layers\.(\d+)\.(.*)", r"decoder.layers.\1.vlm.\2"),
]
_VISION_RENAMES = [("vision.embeddings.", "vision."), ("vision.encoder.layers.", "vision.layers.")]


def canonical_key(key: str) -> str:
    """Map both HF layouts to one: ``vision_tower.*``, ``multi_modal_projector.*``, ``language_model.*``."""
    key = re.sub(r"^model\.", "", key)
    key = key.replace("vision_tower.vision_model.", "vision_tower.")
    key = key.replace("language_model.model.", "language_model.")
    return key


def hf_to_ours(key: str) -> str | None:
    """HF key -> our key, or None for keys we do not use (the tied LM head)."""
    key = canonical_key(key)
    if key in ("lm_head.weight", "language_model.lm_head.weight"):
        return None
    for pat, tmpl in _RULES:
        m = re.fullmatch(pat, key)
        if m:
            out = m.expand(tmpl)
            for a, b in _VISION_RENAMES:
                out = out.replace(a, b)
            return out
    raise ValueError(f"unrecognised PaliGemma weight {key!r}")


def ours_to_hf(key: str) -> str | None:
    """Our key -> HF key in the original PaliGemma layout, or None if not part of the VLM."""
    if key.startswith("vision."):
        rest = key[len("vision.") :]
        if rest.startswith("layers."):
            return "vision_tower.vision_model.encoder." + rest
        if rest.startswith(("patch_embedding", "position_embedding")):
            return "vision_tower.vision_model.embeddings." + rest
        return "vision_tower.vision_model." + rest
    if key.startswith("projector."):
        return "multi_modal_projector.linear." + key[len("projector.") :]
    if key == "decoder.embed_tokens.weight":
        return "language_model.model.embed_tokens.weight"
    if key == "decoder.norm.weight":
        return "language_model.model.norm.weight"
    m = re.fullmatch(r"decoder\.layers\.(\d+)\.vlm\.(.*)", key)
    if m:
        return f"language_model.model.layers.{m[1]}.{m[2]}"
    return None


def read_safetensors_folder(folder: str | Path, progress: bool = True) -> dict[str, Tensor]:
    """All tensors of ``model.safetensors`` or the shards named in ``model.safetensors.index.json``
    (``progress``: a live count of tensors read, for multi-GB checkpoints)."""
    from vlastack.progress import Progress

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    total = None
    if index.exists():
        weight_map = read_json(index)["weight_map"]
        files, total = sorted(set(weight_map.values())), len(weight_map)
    elif (folder / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    out: dict[str, Tensor] = {}
    with Progress(total, f"read {folder.name}", "tensor", enabled=progress) as bar:
        for name in files:
            with open_safetensors(folder / name) as f:
                try:
                    for k in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                        out[k] = f.get_tensor(k)
                        bar.update(1)
                except Exception as e:  # a file cut short past its header fails here
                    raise safetensors_read_error(folder / name, e) from None
    return out


def config_from_paligemma(folder: str | Path, base: ModelConfig) -> ModelConfig:
    """Read vision/text shapes from an HF PaliGemma ``config.json``; the expert keeps ``base``'s
    width/MLP with heads, KV heads, head dim and depth matched to the VLM; tokenizer = the folder."""
    folder = Path(folder)
    c = read_json(folder / "config.json")
    vc, tc = c.get("vision_config", {}), c.get("text_config", {})
    vision = VisionConfig(
        image_size=vc.get("image_size", 224),
        patch_size=vc.get("patch_size", 14),
        width=vc.get("hidden_size", 1152),
        depth=vc.get("num_hidden_layers", 27),
        heads=vc.get("num_attention_heads", 16),
        mlp_dim=vc.get("intermediate_size", 4304),
        norm_eps=vc.get("layer_norm_eps", 1e-6),
    )
    rope = tc.get("rope_parameters") or {}
    vlm = DecoderConfig(
        width=tc.get("hidden_size", 2048),
        depth=tc.get("num_hidden_layers", 18),
        heads=tc.get("num_attention_heads", 8),
        kv_heads=tc.get("num_key_value_heads", 1),
        head_dim=tc.get("head_dim", 256),
        mlp_dim=tc.get("intermediate_size", 16384),
        vocab_size=tc.get("vocab_size", c.get("vocab_size", 257152)),
        rope_theta=rope.get("rope_theta", tc.get("rope_theta", 10000.0)),
        norm_eps=tc.get("rms_norm_eps", 1e-6),
    )
    expert = replace(
        base.expert, heads=vlm.heads, kv_heads=vlm.kv_heads, head_dim=vlm.head_dim, depth=vlm.depth
    )
    has_tok = (folder / "tokenizer.json").exists() or (folder / "tokenizer.model").exists()
    return replace(
        base, vision=vision, vlm=vlm, expert=expert, tokenizer=str(folder) if has_tok else base.tokenizer
    )


@torch.no_grad()
def load_paligemma(model: nn.Module, folder: str | Path) -> list[str]:
    """Copy PaliGemma weights into ``model``'s vision encoder, projector and VLM. Returns the keys
    of ``model`` left untouched (action expert, heads). A checkpoint embedding with more rows than
    ``vocab_size`` (HF pads 257152 to 257216) is truncated: the extra rows are padding."""
    ours = model.state_dict()
    loaded = set()
    for hf_key, tensor in read_safetensors_folder(folder).items():
        key = hf_to_ours(hf_key)
        if key is None:
            continue
        if key not in ours:
            raise ValueError(f"{folder}: weight {hf_key!r} -> {key!r} has no place in this model config")
        target = ours[key]
        if key == "decoder.embed_tokens.weight" and tensor.shape[0] > target.shape[0]:
            tensor = tensor[: target.shape[0]]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"{folder}: {hf_key} has shape {tuple(tensor.shape)} but the model expects {tuple(target.shape)}"
            )
        target.copy_(tensor.to(target.dtype))
        loaded.add(key)
    vlm_keys = {k for k in ours if ours_to_hf(k) is not None}
    missing = sorted(vlm_keys - loaded)
    if missing:
        raise ValueError(f"{folder}: checkpoint lacks {len(missing)} VLM weights, e.g. {missing[:3]}")
    return sorted(set(ours) - loaded)


def export_paligemma(model: nn.Module, folder: str | Path, hf_config: dict | None = None) -> None:
    """Write the VLM part of ``model`` as an HF PaliGemma folder (original key layout)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in model.state_dict().items():
        hf = ours_to_hf(k)
        if hf is not None:
            state[hf] = v.detach().contiguous().cpu()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if hf_config is None:
        cfg: ModelConfig = model.cfg
        v, t = cfg.vision, cfg.vlm
        hf_config = {
            "architectures": ["PaliGemmaForConditionalGeneration"],
            "model_type": "paligemma",
            "hidden_size": t.width,
            "projection_dim": t.width,
            "vocab_size": t.vocab_size,
            "image_token_index": t.vocab_size - 1,
            "vision_config": {
                "model_type": "siglip_vision_model",
                "hidden_size": v.width,
                "intermediate_size": v.mlp_dim,
                "num_hidden_layers": v.depth,
                "num_attention_heads": v.heads,
                "image_size": v.image_size,
                "patch_size": v.patch_size,
                "layer_norm_eps": v.norm_eps,
                "projection_dim": t.width,
                "vision_use_head": False,
                "hidden_act": "gelu_pytorch_tanh",
            },
            "text_config": {
                "model_type": "gemma",
                "hidden_size": t.width,
                "intermediate_size": t.mlp_dim,
                "num_hidden_layers": t.depth,
                "num_attention_heads": t.heads,
                "num_key_value_heads": t.kv_heads,
                "head_dim": t.head_dim,
                "vocab_size": t.vocab_size,
                "rms_norm_eps": t.norm_eps,
                "rope_theta": t.rope_theta,
                "hidden_act": "gelu_pytorch_tanh",
            },
        }
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2))
