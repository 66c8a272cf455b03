"""``vla export-lerobot``: write a vlastack pi0 / pi05 policy folder (or an imported pi0-FAST token
head) as a LeRobot ``pretrained_model`` folder that ``PI0Policy`` / ``PI05Policy`` /
``PI0FastPolicy.from_pretrained(strict=True)`` and ``make_pre_post_processors(pretrained_path=...)``
load (checked against lerobot 0.6.1 by scripts/make_lerobot_fixtures.py --export and
scripts/make_pi0_fast_fixture.py --export).

Norm stats: a folder from ``vla import`` carries LeRobot's exact ones (``lerobot_pipeline.json``);
a vlastack-trained folder's ``norm_stats.json`` maps mean_std -> MEAN_STD, quantiles -> QUANTILES,
min_max -> MIN_MAX (LeRobot does not clip quantile-normalized values; vlastack's training does).
LeRobot only builds the ``gemma_2b`` / ``gemma_300m`` / SigLIP so400m shapes; other shapes are
written faithfully but need a patched LeRobot to load.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from vlastack.config import to_dict
from vlastack.infer.preprocess import ACTION_KEY, PIPELINE_FILE, STATE_KEY, Pipeline
from vlastack.models.convert.lerobot import IMAGE_PREFIX, VLASTACK_SIDECAR, ours_to_checkpoint
from vlastack.models.vla import VLA

_MODES = {"mean_std": "MEAN_STD", "quantiles": "QUANTILES", "min_max": "MIN_MAX", "identity": "IDENTITY"}
TOKENIZER = "google/paligemma-3b-pt-224"


def _norm(folder: Path) -> tuple[dict[str, str], dict[str, dict[str, np.ndarray]], float]:
    """-> (modes by key, stats by key, eps) from lerobot_pipeline.json or norm_stats.json."""
    if (folder / PIPELINE_FILE).exists():
        n = Pipeline.load(folder).normalizer
        if n.style != "lerobot":
            raise ValueError(f"{folder}: openpi-style norm stats (eps 1e-6) have no exact LeRobot equivalent")
        return dict(n.modes), n.stats, n.eps
    if (folder / "norm_stats.json").exists():
        from vlastack.data.stats import Normalizer

        n = Normalizer.load(folder / "norm_stats.json")
        return dict(n.modes), {k: dict(v) for k, v in n.stats.items()}, 1e-8
    return {STATE_KEY: "identity", ACTION_KEY: "identity"}, {}, 1e-8


def _dim(stats: dict, key: str, default: int) -> int:
    return (
        int(np.asarray(next(iter(stats[key].values()))).reshape(-1).shape[0]) if stats.get(key) else default
    )


def export_lerobot(policy_folder: str | Path, out: str | Path) -> Path:
    folder, out = Path(policy_folder), Path(out)
    model = VLA.from_pretrained(folder)
    cfg = model.cfg
    kind = "pi05" if cfg.adarms else "pi0"
    if cfg.head_spec.action_tokens and cfg.head_options.sequence == "pi0_fast":
        return _export_pi0_fast(model, folder, out)
    if not cfg.head_spec.export_lerobot or cfg.grounding.points:
        raise ValueError(
            "only the plain flow head (pi0 / pi05) and an imported pi0-FAST token head have a LeRobot equivalent"
        )
    if cfg.advantage_conditioning:  # LeRobot's processors would leave its prompts without the indicator
        raise ValueError(
            f"{folder}: trained with model.advantage_conditioning (RECAP): LeRobot's pi0/pi05 processors "
            "do not write the 'Advantage: positive' line its prompts need; serve it with `vla serve`"
        )
    if cfg.head_options.step_noise > 0:  # LeRobot's sampler is the deterministic one
        raise ValueError(
            f"{folder}: samples with model.head_options.step_noise={cfg.head_options.step_noise}, which "
            "LeRobot's pi0/pi05 Euler sampler does not add; export its weights with step_noise=0 in its "
            "config.yaml (they are the same weights), or serve it with `vla serve`"
        )
    modes, stats, eps = _norm(folder)
    out.mkdir(parents=True, exist_ok=True)

    state = {}
    for key, v in model.state_dict().items():
        ck = ours_to_checkpoint(key)
        if ck is None:
            raise ValueError(f"{key} has no place in a LeRobot {kind} checkpoint")
        state["model." + ck] = v.detach().float().contiguous()
    pg = "model.paligemma_with_expert."
    state[pg + "paligemma.lm_head.weight"] = state[
        pg + "paligemma.model.language_model.embed_tokens.weight"
    ].clone()
    state[pg + "gemma_expert.lm_head.weight"] = torch.zeros(cfg.vlm.vocab_size, cfg.expert.width)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

    s = cfg.vision.image_size
    feats, out_feats, norm_map = _features(cfg, stats, modes, _dim(stats, ACTION_KEY, cfg.action_dim))
    config = {
        "type": kind,
        "n_obs_steps": 1,
        "input_features": feats,
        "output_features": out_feats,
        "device": "cpu",
        "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m",
        "dtype": "float32",
        "chunk_size": cfg.action_horizon,
        "n_action_steps": cfg.action_horizon,
        "max_state_dim": cfg.state_dim,
        "max_action_dim": cfg.action_dim,
        "num_inference_steps": cfg.head_options.num_denoise_steps,
        "min_period": cfg.head_options.time_min_period,
        "max_period": cfg.head_options.time_max_period,
        "image_resolution": [s, s],
        "tokenizer_max_length": cfg.max_text_len,
        "normalization_mapping": norm_map,
    }
    (out / "config.json").write_text(json.dumps(config, indent=4))

    tok = _text_tokenizer(cfg)
    relative = {"enabled": False, "exclude_joints": ["gripper"], "action_names": None}
    if kind == "pi05":
        names = ["rename_observations_processor", "to_batch_processor", "relative_actions_processor",
                 "normalizer_processor", "pi05_prepare_state_tokenizer_processor_step",
                 "tokenizer_processor", "device_processor"]  # fmt: skip
        configs = [{"rename_map": {}}, {}, relative, {}, {}, tok, _DEVICE]
    else:
        names = ["rename_observations_processor", "to_batch_processor", "pi0_new_line_processor",
                 "tokenizer_processor", "device_processor", "relative_actions_processor", "normalizer_processor"]  # fmt: skip
        configs = [{"rename_map": {}}, {}, {}, tok, _DEVICE, relative, {}]
    _processor_files(out, list(zip(names, configs, strict=True)), stats, eps, feats, out_feats, norm_map)
    if (folder / "tokenizer.model").exists():
        (out / "tokenizer.model").write_bytes((folder / "tokenizer.model").read_bytes())
    # What LeRobot's files cannot say (head counts, a file-free tokenizer): `vla import` reads it.
    (out / VLASTACK_SIDECAR).write_text(json.dumps({"model": to_dict(cfg)}, indent=2))
    return out


_DEVICE = {"device": "cpu", "float_dtype": None}


def _text_tokenizer(cfg) -> dict:
    """LeRobot's tokenizer_processor config for the PaliGemma prompt."""
    return {"max_length": cfg.max_text_len, "task_key": "task", "padding_side": "right",
            "padding": "max_length", "truncation": True, "tokenizer_name": TOKENIZER}  # fmt: skip


def _features(cfg, stats: dict, modes: dict, action_dim: int) -> tuple[dict, dict, dict]:
    """LeRobot's input features (cameras, state), output features (action) and norm map."""
    s = cfg.vision.image_size
    feats = {IMAGE_PREFIX + c: {"type": "VISUAL", "shape": [3, s, s]} for c in cfg.camera_names}
    feats[STATE_KEY] = {"type": "STATE", "shape": [_dim(stats, STATE_KEY, cfg.state_dim)]}
    out_feats = {ACTION_KEY: {"type": "ACTION", "shape": [action_dim]}}
    norm_map = {"VISUAL": "IDENTITY", "STATE": _MODES[modes.get(STATE_KEY, "identity")],
                "ACTION": _MODES[modes.get(ACTION_KEY, "identity")]}  # fmt: skip
    return feats, out_feats, norm_map


def _processor_files(out: Path, pre: list[tuple[str, dict]], stats: dict, eps: float, feats: dict,
                     out_feats: dict, norm_map: dict) -> None:  # fmt: skip
    """policy_{pre,post}processor.json and their normalizer state files (LeRobot's layout).
    ``pre``: the preprocessor's (registry name, config) steps in order; the normalizer's config
    is filled in here."""
    tensors = {f"{k}.{n}": torch.from_numpy(np.asarray(v, np.float32)).reshape(-1)
               for k, d in stats.items() for n, v in d.items()}  # fmt: skip
    steps = []
    for i, (name, c) in enumerate(pre):
        step = {"registry_name": name, "config": c}
        if name == "normalizer_processor":
            step["config"] = {"eps": eps, "features": {**feats, **out_feats}, "norm_map": norm_map}
            step["state_file"] = f"policy_preprocessor_step_{i}_normalizer_processor.safetensors"
            save_file(tensors, str(out / step["state_file"]))
        steps.append(step)
    (out / "policy_preprocessor.json").write_text(
        json.dumps({"name": "policy_preprocessor", "steps": steps}, indent=2)
    )
    post = [
        {"registry_name": "unnormalizer_processor",
         "config": {"eps": eps, "features": out_feats, "norm_map": norm_map},
         "state_file": "policy_postprocessor_step_0_unnormalizer_processor.safetensors"},
        {"registry_name": "absolute_actions_processor", "config": {"enabled": False}},
        {"registry_name": "device_processor", "config": _DEVICE},
    ]  # fmt: skip
    save_file(tensors, str(out / post[0]["state_file"]))
    (out / "policy_postprocessor.json").write_text(
        json.dumps({"name": "policy_postprocessor", "steps": post}, indent=2)
    )


def _export_pi0_fast(model: VLA, folder: Path, out: Path) -> Path:
    """An imported (and possibly fine-tuned) pi0-FAST token head -> LeRobot ``pi0_fast`` folder, with
    its FAST processor in ``fast_tokenizer/`` (config.json names the processor it was imported with)."""
    from vlastack.models.action_tokens import PiFastTokenizer

    cfg, head = model.cfg, model.head
    tok = head.tokenizer
    if not isinstance(tok, PiFastTokenizer):
        raise ValueError("only an imported pi0-FAST head (its physical-intelligence FAST tokenizer) exports")
    v = cfg.vlm.vocab_size
    skip = v - 1 - int(tok.placement.ids[0])
    if not (tok.placement.ids == v - 1 - skip - np.arange(tok.placement.n)).all():
        raise ValueError("the FAST ids are not LeRobot's vocab - 1 - fast_skip_tokens - k")
    modes, stats, eps = _norm(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, t in model.state_dict().items():
        ck = "paligemma_with_expert.paligemma.lm_head.weight" if key == "head.lm_head.weight" else None
        ck = ck or ours_to_checkpoint(key)
        if ck is None:
            raise ValueError(f"{key} has no place in a LeRobot pi0_fast checkpoint")
        state["model." + ck] = t.detach().float().contiguous()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save_processor(out / "fast_tokenizer")

    s = cfg.vision.image_size
    feats, out_feats, norm_map = _features(cfg, stats, modes, tok.action_dim)
    steps = cfg.head_options.max_decode_steps or head.num_steps
    config = {
        "type": "pi0_fast", "n_obs_steps": 1, "input_features": feats, "output_features": out_feats,
        "device": "cpu", "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m",
        "dtype": "float32", "chunk_size": cfg.action_horizon, "n_action_steps": cfg.action_horizon,
        "max_state_dim": cfg.state_dim, "max_action_dim": cfg.action_dim,
        "max_action_tokens": cfg.head_options.max_action_tokens, "image_resolution": [s, s],
        "tokenizer_max_length": cfg.max_text_len, "text_tokenizer_name": TOKENIZER,
        "action_tokenizer_name": tok.name, "temperature": cfg.head_options.temperature,
        "max_decoding_steps": steps, "fast_skip_tokens": skip, "validate_action_token_prefix": head.require_prefix,
        "use_kv_cache": True, "normalization_mapping": norm_map,
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=4))
    text = _text_tokenizer(cfg)
    action = {"trust_remote_code": True, "max_action_tokens": cfg.head_options.max_action_tokens,
              "action_tokenizer_name": tok.name}  # fmt: skip
    pre = [("rename_observations_processor", {"rename_map": {}}), ("to_batch_processor", {}),
           ("relative_actions_processor", {"enabled": False, "exclude_joints": ["gripper"], "action_names": None}),
           ("normalizer_processor", {}), ("pi0_fast_prepare_state_tokenizer_processor_step", {}),
           ("tokenizer_processor", text), ("action_tokenizer_processor", action),
           ("device_processor", _DEVICE)]  # fmt: skip
    _processor_files(out, pre, stats, eps, feats, out_feats, norm_map)
    if (folder / "tokenizer.model").exists():
        (out / "tokenizer.model").write_bytes((folder / "tokenizer.model").read_bytes())
    return out
