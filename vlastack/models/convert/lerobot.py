"""Weights and model config of LeRobot ``pi0`` / ``pi05`` / ``pi0_fast`` and openpi PyTorch checkpoints.

Layouts (detected by ``locate``):

- ``lerobot``: a ``pretrained_model`` folder: ``config.json`` (``"type": "pi0" | "pi05" |
  "pi0_fast"``), ``model.safetensors`` with keys ``model.paligemma_with_expert...``,
  ``model.action_in_proj...`` (pi0_fast: PaliGemma only, read by our token head; its FAST action
  tokenizer is found by ``find_fast_processor``);
- ``openpi``: openpi's PyTorch conversion: ``model.safetensors`` with the same keys without the
  ``model.`` prefix, ``config.json`` with ``paligemma_variant`` / ``action_expert_variant``;
- ``vlastack``: our own folder (``config.json`` with a ``"model"`` tree).

Shapes come from the tensors; what tensors cannot tell (head counts) comes from the config's
variant names, and dotted overrides (``model.vision.heads=4``) win over both.

    ckpt = locate(folder)                            # resolved, config.json read, format detected
    cfg, kind, meta = config_from_checkpoint(ckpt, overrides)
    model = build_from_checkpoint(ckpt, cfg, kind)  # a VLA with every weight from the file
    model, kind, meta = load_checkpoint(folder, overrides)   # the three in one call

Each file is read once per load: ``Checkpoint`` keeps ``config.json``, the safetensors header and
(pi0_fast) the FAST processor once read, and each weights file is opened once for all its tensors.

Loading is strict: a missing, unexpected or mis-shaped tensor is an error listing them;
``strict=False`` loads what matches and prints what was left out.
"""

from __future__ import annotations

import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch

from vlastack.config import (
    Config,
    DecoderConfig,
    EvalConfig,
    FlowOptions,
    ModelConfig,
    TokenHeadConfig,
    VisionConfig,
    apply_overrides,
    model_config_from_dict,
)
from vlastack.fileio import read_json
from vlastack.models.convert.locate import (  # noqa: F401 - re-exported: the loaders' one entry point
    Checkpoint,
    find_fast_processor,
    hf_cache_dir,
    hf_snapshot,
    locate,
    resolve_checkpoint,
)
from vlastack.models.convert.safetensors_io import TensorInfo, open_weights, read_tensor
from vlastack.models.heads.flow.lerobot_keys import HEAD_RULES, head_to_checkpoint
from vlastack.models.heads.flow.lerobot_keys import checkpoint_kind as flow_checkpoint_kind

# openpi gemma.py variants: what the tensors cannot tell (heads) plus defaults for the rest.
GEMMA_VARIANTS = {
    "gemma_2b": dict(width=2048, depth=18, mlp_dim=16384, heads=8, kv_heads=1, head_dim=256),
    "gemma_300m": dict(width=1024, depth=18, mlp_dim=4096, heads=8, kv_heads=1, head_dim=256),
}
SIGLIP_SO400M_HEADS = 16
SIGLIP_SO400M = dict(width=1152, depth=27, mlp_dim=4304)
# Written by ``vla export-lerobot`` beside LeRobot's files (LeRobot ignores it): our model config,
# for what the tensors cannot say (attention head counts, the text tokenizer), so ``vla import``
# of an exported folder rebuilds the same model with no overrides.
VLASTACK_SIDECAR = "vlastack_config.json"
IMAGE_PREFIX = "observation.images."
EXTERNAL = ("lerobot", "openpi")

# Checkpoint key (after ``canonical_key``) -> our key. ``None``: a tensor that no output reads.
_P = r"paligemma_with_expert\."
_RULES: list[tuple[str, str | None]] = [
    (_P + r"paligemma\.model\.vision_tower\.vision_model\.embeddings\.(.*)", r"vision.\1"),
    (_P + r"paligemma\.model\.vision_tower\.vision_model\.encoder\.layers\.(.*)", r"vision.layers.\1"),
    (_P + r"paligemma\.model\.vision_tower\.vision_model\.post_layernorm\.(.*)", r"vision.post_layernorm.\1"),
    (_P + r"paligemma\.model\.multi_modal_projector\.linear\.(.*)", r"projector.\1"),
    (_P + r"paligemma\.model\.language_model\.embed_tokens\.weight", "decoder.embed_tokens.weight"),
    (_P + r"paligemma\.model\.language_model\.layers\.(\d+)\.(.*)", r"decoder.layers.\1.vlm.\2"),
    (_P + r"paligemma\.model\.language_model\.norm\.weight", "decoder.norm.weight"),
    (_P + r"gemma_expert\.model\.layers\.(\d+)\.(.*)", r"decoder.layers.\1.expert.\2"),
    (_P + r"gemma_expert\.model\.norm\.(.*)", r"decoder.expert_norm.\1"),
    *HEAD_RULES,  # the flow head's own tensors: models/heads/flow/lerobot_keys.py
    # Tied to embed_tokens (PaliGemma), or never used (the expert's LM head: its embeddings are None).
    (_P + r"paligemma\.lm_head\.weight", None),
    (_P + r"gemma_expert\.lm_head\.weight", None),
]


_LM_HEAD = "paligemma_with_expert.paligemma.lm_head.weight"


def canonical_key(key: str) -> str:
    """LeRobot (``model.`` prefix) and openpi keys, old (transformers<4.52) and new layouts -> one."""
    key = re.sub(r"^model\.", "", key)
    key = key.replace("paligemma.language_model.model.", "paligemma.model.language_model.")
    key = key.replace("paligemma.language_model.", "paligemma.model.language_model.")
    key = key.replace("paligemma.vision_tower.", "paligemma.model.vision_tower.")
    key = key.replace("paligemma.multi_modal_projector.", "paligemma.model.multi_modal_projector.")
    return key


def checkpoint_to_ours(key: str) -> str | None:
    """Checkpoint key -> our key, ``None`` for tensors nothing reads; unknown keys raise."""
    ck = canonical_key(key)
    for pat, tmpl in _RULES:
        m = re.fullmatch(pat, ck)
        if m:
            return None if tmpl is None else m.expand(tmpl)
    raise KeyError(key)


# Our key -> LeRobot's (without ``model.``), for export: the first rule of each kind above, reversed.
_REVERSE: list[tuple[str, str]] = [
    (r"vision\.(patch_embedding|position_embedding)\.(.*)",
     r"paligemma.model.vision_tower.vision_model.embeddings.\1.\2"),
    (r"vision\.layers\.(.*)", r"paligemma.model.vision_tower.vision_model.encoder.layers.\1"),
    (r"vision\.post_layernorm\.(.*)", r"paligemma.model.vision_tower.vision_model.post_layernorm.\1"),
    (r"projector\.(.*)", r"paligemma.model.multi_modal_projector.linear.\1"),
    (r"decoder\.embed_tokens\.weight", "paligemma.model.language_model.embed_tokens.weight"),
    (r"decoder\.layers\.(\d+)\.vlm\.(.*)", r"paligemma.model.language_model.layers.\1.\2"),
    (r"decoder\.norm\.weight", "paligemma.model.language_model.norm.weight"),
    (r"decoder\.layers\.(\d+)\.expert\.(.*)", r"gemma_expert.model.layers.\1.\2"),
    (r"decoder\.expert_norm\.(.*)", r"gemma_expert.model.norm.\1"),
]  # fmt: skip


def ours_to_checkpoint(key: str) -> str | None:
    """Our key -> LeRobot's key without the ``model.`` prefix (openpi's layout), or None."""
    for pat, tmpl in _REVERSE:
        m = re.fullmatch(pat, key)
        if m:
            return "paligemma_with_expert." + m.expand(tmpl)
    return head_to_checkpoint(key)


def checkpoint_kind(header: dict[str, TensorInfo]) -> str:
    """pi05 has ``time_mlp_in`` and adaptive expert norms; pi0 has ``state_proj``."""
    return flow_checkpoint_kind({canonical_key(k) for k in header})


# ----------------------------------------------------------------------------- config from tensors


def _shape(header: dict[str, TensorInfo], suffix: str) -> tuple[int, ...]:
    for k, info in header.items():
        if canonical_key(k).endswith(suffix):
            return info.shape
    raise ValueError(f"checkpoint lacks a tensor ending in {suffix!r}")


def _depth(header: dict[str, TensorInfo], pattern: str) -> int:
    idx = {int(m[1]) for k in header if (m := re.search(pattern, canonical_key(k)))}
    if not idx:
        raise ValueError(f"checkpoint has no layers matching {pattern!r}")
    return max(idx) + 1


def _decoder(header: dict[str, TensorInfo], stem: str, variant: dict, vocab: int) -> DecoderConfig:
    q = _shape(header, f"{stem}.layers.0.self_attn.q_proj.weight")
    k = _shape(header, f"{stem}.layers.0.self_attn.k_proj.weight")
    heads = variant["heads"]
    head_dim = q[0] // heads
    return DecoderConfig(
        width=q[1],
        depth=_depth(header, re.escape(stem) + r"\.layers\.(\d+)\."),
        heads=heads,
        kv_heads=max(k[0] // head_dim, 1),
        head_dim=head_dim,
        mlp_dim=_shape(header, f"{stem}.layers.0.mlp.gate_proj.weight")[0],
        vocab_size=vocab,
    )


def config_from_checkpoint(
    ckpt: str | Path | Checkpoint, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[ModelConfig, str, dict]:
    """-> (our model config, "pi0" | "pi05" | "pi0_fast", the checkpoint's config.json)."""
    ckpt = ckpt if isinstance(ckpt, Checkpoint) else locate(ckpt)  # located already: no trip back
    if ckpt.fmt not in EXTERNAL:
        raise ValueError(f"{ckpt.folder} is a {ckpt.fmt} folder, not a LeRobot or openpi checkpoint")
    folder, header, meta = ckpt.folder, ckpt.header, ckpt.meta
    kind = "pi0_fast" if meta.get("type") == "pi0_fast" else checkpoint_kind(header)
    vlm_var = GEMMA_VARIANTS.get(meta.get("paligemma_variant", "gemma_2b"))
    exp_var = GEMMA_VARIANTS.get(meta.get("action_expert_variant", "gemma_300m"))
    if vlm_var is None or exp_var is None:
        raise ValueError(f"unknown gemma variant in {folder}/config.json; known: {sorted(GEMMA_VARIANTS)}")
    pg, ex = "paligemma.model.language_model", "gemma_expert.model"
    vocab = (
        _shape(header, f"{pg}.embed_tokens.weight")[0]
        if any(canonical_key(k).endswith("embed_tokens.weight") for k in header)
        else _shape(header, "paligemma.lm_head.weight")[0]
    )
    vlm = _decoder(header, pg, vlm_var, vocab)
    if kind == "pi0_fast":  # no action expert (a token head builds none): shapes only satisfy the config
        expert = replace(vlm, vocab_size=1)
    else:
        expert = replace(_decoder(header, ex, exp_var, 1), heads=vlm.heads, kv_heads=vlm.kv_heads,
                         head_dim=vlm.head_dim)  # fmt: skip
    patch = _shape(header, "embeddings.patch_embedding.weight")
    n_pos = _shape(header, "embeddings.position_embedding.weight")[0]
    grid = round(n_pos**0.5)
    vision = VisionConfig(
        image_size=grid * patch[2],
        patch_size=patch[2],
        width=patch[0],
        depth=_depth(header, r"vision_model\.encoder\.layers\.(\d+)\."),
        heads=SIGLIP_SO400M_HEADS if patch[0] % SIGLIP_SO400M_HEADS == 0 else 1,
        mlp_dim=_shape(header, "encoder.layers.0.mlp.fc1.weight")[0],
    )
    if kind == "pi0_fast":
        cfg = _pi0_fast_config(ckpt, vision, vlm, expert)
        return _apply(cfg, overrides), kind, meta
    side = folder / VLASTACK_SIDECAR
    representation = "auto"  # unspecified: LeRobot's config does not say what its actions mean
    if side.exists():  # exported by vlastack: the head counts, tokenizer and actions it was trained with
        vision, vlm, expert, tokenizer, representation = _from_sidecar(side, vision, vlm, expert)
    else:
        tokenizer = str(folder)
        _say_assumptions(folder, vision, vlm, expert, meta, overrides)
    action_dim = _shape(header, "action_in_proj.weight")[1]
    state_dim = _shape(header, "state_proj.weight")[1] if kind == "pi0" else meta.get("max_state_dim", 32)
    cameras = camera_names(meta)
    horizon = meta.get("chunk_size", meta.get("action_horizon", 50))
    cfg = ModelConfig(
        vision=vision,
        vlm=vlm,
        expert=expert,
        action_horizon=horizon,
        action_dim=action_dim,
        state_dim=state_dim,
        camera_names=cameras,
        image_resize="pad",  # openpi/LeRobot resize_with_pad, also when fine-tuning it
        max_text_len=meta.get("tokenizer_max_length", 200 if kind == "pi05" else 48),
        head_options=FlowOptions(
            num_denoise_steps=meta.get("num_inference_steps", 10),
            time_min_period=meta.get("min_period", 4e-3),
            time_max_period=meta.get("max_period", 4.0),
        ),
        tokenizer=tokenizer,
        action_representation=representation,
    )
    return _apply(with_kind(cfg, kind), overrides), kind, meta


def _from_sidecar(
    path: Path, vision: VisionConfig, vlm: DecoderConfig, expert: DecoderConfig
) -> tuple[VisionConfig, DecoderConfig, DecoderConfig, str, str]:
    """The shapes read from the tensors, with the head counts (and a file-free tokenizer) of the
    vlastack config ``vla export-lerobot`` saved beside them, and its action representation;
    ValueError if the two disagree."""
    saved = model_config_from_dict(read_json(path)["model"])
    for name, ours, theirs in (
        ("vision", vision, saved.vision),
        ("vlm", vlm, saved.vlm),
        ("expert", expert, saved.expert),
    ):
        for f in ("width", "depth", "mlp_dim"):
            if getattr(ours, f) != getattr(theirs, f):
                raise ValueError(
                    f"{path}: model.{name}.{f}={getattr(theirs, f)} but the weights have {getattr(ours, f)}: "
                    f"the folder's weights are not the ones exported with it; remove {path.name} to import "
                    "from the weights alone"
                )
    heads = dict(heads=saved.vlm.heads, kv_heads=saved.vlm.kv_heads, head_dim=saved.vlm.head_dim)
    vlm, expert = replace(vlm, **heads), replace(expert, **heads)
    vision = replace(vision, heads=saved.vision.heads)
    tokenizer = saved.tokenizer if saved.tokenizer == "byte" else str(path.parent)
    return vision, vlm, expert, tokenizer, saved.action_representation


def _say_assumptions(
    folder: Path, vision: VisionConfig, vlm: DecoderConfig, expert: DecoderConfig, meta: dict, overrides
) -> None:
    """Head counts cannot be read from the tensors: they come from the variant names (Gemma) and
    So400m (SigLIP). Where the shapes are not those, say what was assumed and how to change it."""
    given = " ".join(overrides)
    notes = []
    if any(getattr(vision, k) != v for k, v in SIGLIP_SO400M.items()) and "vision.heads" not in given:
        notes.append(
            f"SigLIP heads={vision.heads} (So400m's; the encoder is {vision.width} wide, {vision.depth} deep)"
        )
    for name, dec, var in (("vlm", vlm, meta.get("paligemma_variant", "gemma_2b")),
                           ("expert", expert, meta.get("action_expert_variant", "gemma_300m"))):  # fmt: skip
        std = GEMMA_VARIANTS[var]
        if (dec.width, dec.depth, dec.mlp_dim) != (
            std["width"],
            std["depth"],
            std["mlp_dim"],
        ) and f"{name}.heads" not in given:
            notes.append(
                f"{name} heads={dec.heads} head_dim={dec.head_dim} (from {var!r}; the weights are {dec.width} wide)"
            )
    if notes:
        warnings.warn(
            f"{folder}: shapes that are not the standard ones; assumed {'; '.join(notes)}. Head counts are "
            "not in the weights: if these are wrong, pass e.g. model.vision.heads=N model.vlm.heads=N "
            "model.vlm.head_dim=D (a folder written by `vla export-lerobot` carries them)",
            stacklevel=3,
        )


def _apply(cfg: ModelConfig, overrides: list[str] | tuple[str, ...]) -> ModelConfig:
    if not overrides:
        return cfg
    top = Config(model=cfg, eval=EvalConfig(steps_per_chunk=min(8, cfg.action_horizon)))
    return apply_overrides(top, [o if o.startswith("model.") else "model." + o for o in overrides]).model


def _pi0_fast_config(
    ckpt: Checkpoint, vision: VisionConfig, vlm: DecoderConfig, expert: DecoderConfig
) -> ModelConfig:
    """pi0-FAST: PaliGemma + the token head in LeRobot's layout (``model.head_options.sequence=pi0_fast``):
    greedy or sampled over the whole vocabulary, at most ``max_decoding_steps`` tokens, FAST ids at
    ``vocab - 1 - fast_skip_tokens - k``. The FAST processor (``find_fast_processor``) gives the
    scale and the BPE size."""
    folder, meta = ckpt.folder, ckpt.meta
    _, proc_meta, bpe = ckpt.fast
    scale, n_bpe = proc_meta.get("scale"), bpe.get_vocab_size()
    steps = int(meta.get("max_decoding_steps", 256))
    horizon = meta.get("chunk_size", 50)
    if meta.get("n_action_steps", horizon) != horizon:
        # LeRobot decodes FAST with n_action_steps as the horizon, which only works when they are equal.
        raise ValueError(f"{folder}: pi0_fast with n_action_steps != chunk_size ({horizon}) is not supported")
    tokens = TokenHeadConfig(
        tokenizer="fast",
        placement="skip_special",
        fast_scale=float(scale),
        fast_vocab_size=n_bpe,
        max_action_tokens=steps,
        temperature=float(meta.get("temperature", 0.0)),
        max_decode_steps=steps,
        constrained=False,
        sequence="pi0_fast",
    )
    return ModelConfig(
        vision=vision,
        vlm=vlm,
        expert=expert,
        head="tokens",
        head_options=tokens,
        action_horizon=horizon,
        action_dim=meta.get("max_action_dim", 32),
        state_dim=meta.get("max_state_dim", 32),
        camera_names=camera_names(meta),
        image_resize="pad",  # openpi/LeRobot resize_with_pad, also when fine-tuning it
        max_text_len=meta.get("tokenizer_max_length", 200),
        tokenizer=str(folder),
    )


def with_kind(cfg: ModelConfig, kind: str) -> ModelConfig:
    """Select the Pi0 or Pi0.5 flow head in our config (``model.head_options.variant``)."""
    return cfg if kind == "pi0" else cfg.with_head_options(variant="pi05")


def camera_names(meta: dict) -> tuple[str, ...]:
    """Camera names in the config's input-feature order (``observation.images.`` stripped);
    LeRobot's ``empty_cameras`` add ``empty_camera_i``; openpi's three fixed cameras otherwise."""
    feats = meta.get("input_features")
    if feats is None:
        return ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
    names = [k.removeprefix(IMAGE_PREFIX) for k, f in feats.items() if f.get("type") == "VISUAL"]
    for i in range(meta.get("empty_cameras", 0)):
        if f"empty_camera_{i}" not in names:
            names.append(f"empty_camera_{i}")
    if not names:
        raise ValueError("the checkpoint's config.json lists no VISUAL input feature")
    return tuple(names)


# ----------------------------------------------------------------------------- loading


def _problems(title: str, names: list[str]) -> str:
    shown = ", ".join(names[:10])
    return f"{len(names)} {title}: {shown}{' ...' if len(names) > 10 else ''}"


def load_weights(
    model: torch.nn.Module,
    header: dict[str, TensorInfo],
    source: str,
    strict: bool = True,
    dtype: torch.dtype | None = None,
) -> list[str]:
    """Fill ``model`` (built on the meta device) from the checkpoint, tensor by tensor, with
    ``assign=True``: each tensor is read once, into the memory the model keeps. ``dtype``: cast
    floating tensors (None keeps the checkpoint's). Returns the names left out (strict=False)."""
    ours = model.state_dict()
    wanted: dict[str, TensorInfo] = {}
    unexpected, mis_shaped, ignored = [], [], []
    for key, info in header.items():
        try:
            our = checkpoint_to_ours(key)
        except KeyError:
            unexpected.append(key)
            continue
        if our is None and "head.lm_head.weight" in ours and canonical_key(key) == _LM_HEAD:
            our = "head.lm_head.weight"  # pi0-FAST: LeRobot's PaliGemma LM head is not tied to the embedding
        if our is None:
            ignored.append(key)
            continue
        if our not in ours:
            unexpected.append(f"{key} (-> {our})")
        elif tuple(ours[our].shape) != info.shape:
            mis_shaped.append(f"{key} {list(info.shape)} vs ours {list(ours[our].shape)}")
        else:
            wanted[our] = info
    if "decoder.embed_tokens.weight" in ours and "decoder.embed_tokens.weight" not in wanted:
        tied = [k for k in ignored if canonical_key(k).endswith("paligemma.lm_head.weight")]
        if tied and header[tied[0]].shape == tuple(ours["decoder.embed_tokens.weight"].shape):
            wanted["decoder.embed_tokens.weight"] = header[tied[0]]  # stored once, as the LM head
    missing = sorted(set(ours) - set(wanted))
    errors = [
        _problems(t, n)
        for t, n in (("missing", missing), ("unexpected", sorted(unexpected)), ("mis-shaped", mis_shaped))
        if n
    ]
    if errors and strict:
        raise ValueError(f"{source}: weights do not match the model: " + "; ".join(errors))

    def read(item: tuple[str, TensorInfo]) -> tuple[str, torch.Tensor]:
        our, info = item
        cast = dtype if (dtype is not None and info.dtype.is_floating_point) else None
        return our, read_tensor(info, cast, fds[info.file])

    # A few reads in flight: disk reads overlap with the page faults of the fresh memory they fill.
    with open_weights(wanted.values()) as fds, ThreadPoolExecutor(max_workers=4) as pool:
        state = dict(pool.map(read, wanted.items()))
    model.load_state_dict(state, strict=False, assign=True)
    left = missing + sorted(unexpected) + mis_shaped
    if left:
        print(f"warning: strict=False: {source}: " + "; ".join(errors))
        for name in missing:  # a missing tensor would stay on the meta device: give it a value
            _materialize(model, name)
    return left


def _materialize(model: torch.nn.Module, name: str) -> None:
    mod_name, _, attr = name.rpartition(".")
    mod = model.get_submodule(mod_name)
    old = getattr(mod, attr)
    new = torch.zeros(old.shape, dtype=old.dtype)
    if isinstance(old, torch.nn.Parameter):
        new = torch.nn.Parameter(new, requires_grad=old.requires_grad)
    setattr(mod, attr, new)


def load_checkpoint(
    path: str | Path | Checkpoint,
    overrides: list[str] | tuple[str, ...] = (),
    strict: bool = True,
    dtype: torch.dtype | None = None,
) -> tuple[torch.nn.Module, str, dict]:
    """A LeRobot or openpi folder -> (our VLA on the CPU, "pi0" | "pi05" | "pi0_fast", its config.json).
    A pi0_fast model still needs its action tokenizer: ``models.convert.pi0_fast.attach_tokenizers``."""
    ckpt = locate(path)
    cfg, kind, meta = config_from_checkpoint(ckpt, overrides)
    return build_from_checkpoint(ckpt, cfg, kind, strict, dtype), kind, meta


def build_from_checkpoint(
    ckpt: Checkpoint,
    cfg: ModelConfig,
    kind: str,
    strict: bool = True,
    dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """Our VLA for ``cfg`` (from ``config_from_checkpoint``) with the folder's weights, on the CPU."""
    from vlastack.models.vla import VLA

    with torch.device("meta"):
        model = VLA(cfg)
    if kind == "pi05" and "head.state_proj.weight" in model.state_dict():
        raise ValueError("pi05 checkpoints need the Pi0.5 flow head, which this build does not have yet")
    load_weights(model, ckpt.header, str(ckpt.folder), strict=strict, dtype=dtype)
    for name, buf in model.named_buffers():  # non-persistent buffers (RoPE tables) are rebuilt
        if buf.device.type == "meta":
            raise ValueError(f"buffer {name} was not initialised")
    return model.eval()
