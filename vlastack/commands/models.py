"""Model subcommands: ``vla info``, ``vla smoke``, ``vla import-hf``, ``vla export-hf``."""

from __future__ import annotations

import argparse
import time

import torch

from vlastack.commands.common import add_config_args, config_from_args


def _parts(model) -> dict[str, int]:
    counts = {"vision": 0, "projector": 0, "vlm": 0, "expert": 0, "head": 0}
    for name, p in model.named_parameters():
        if name.startswith("vision."):
            counts["vision"] += p.numel()
        elif name.startswith("projector."):
            counts["projector"] += p.numel()
        elif name.startswith("head."):
            counts["head"] += p.numel()
        elif ".expert." in name or name.startswith("decoder.expert_norm"):
            counts["expert"] += p.numel()
        else:
            counts["vlm"] += p.numel()
    return counts


def cmd_info(args: argparse.Namespace) -> int:
    from vlastack.models.vla import VLA

    cfg = config_from_args(args)
    with torch.device("meta"):
        model = VLA(cfg.model)
    for part, n in _parts(model).items():
        print(f"{part:>10}: {n:>15,}")
    print(f"{'total':>10}: {model.num_params():>15,}  ({model.num_params() / 1e9:.3f}B)")
    if cfg.model.head_spec.uses_expert:  # the action expert's tokens: pi0 has a state token, pi05 none
        suffix = cfg.model.action_horizon + (0 if cfg.model.state_in_prompt else 1)
        print(f"prefix tokens: {cfg.model.prefix_len}  suffix tokens: {suffix}")
    else:
        print(f"prefix tokens: {cfg.model.prefix_len}  (no action expert: the head decodes from the VLM)")
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    """Build the model, sample actions from random inputs, and take one training step."""
    from vlastack.batch import dummy_batch
    from vlastack.models import build_model

    cfg = config_from_args(args)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    batch = dummy_batch(cfg.model, batch_size=2)
    loss = model(batch)["loss"]
    loss.backward()
    model.eval()
    t0 = time.perf_counter()
    actions = model.sample_actions(batch)
    dt = time.perf_counter() - t0
    print(f"model: {model.num_params():,} parameters, head={cfg.model.head}")
    print(f"loss on random batch: {loss.item():.4f}")
    print(
        f"sampled actions {tuple(actions.shape)} in {dt * 1e3:.1f} ms; finite={bool(torch.isfinite(actions).all())}"
    )
    return 0


def cmd_import_hf(args: argparse.Namespace) -> int:
    from vlastack.models import build_model
    from vlastack.models.hf import config_from_paligemma, load_paligemma

    cfg = config_from_args(args)
    mcfg = config_from_paligemma(args.paligemma, cfg.model)
    model = build_model(mcfg)
    untouched = load_paligemma(model, args.paligemma)
    model.save_pretrained(args.out)
    print(
        f"imported {args.paligemma} -> {args.out} ({model.num_params():,} params; {len(untouched)} new tensors)"
    )
    return 0


def cmd_export_hf(args: argparse.Namespace) -> int:
    from vlastack.models.hf import export_paligemma
    from vlastack.models.vla import VLA

    export_paligemma(VLA.from_pretrained(args.model), args.out)
    print(f"wrote PaliGemma folder {args.out}")
    return 0


def register(sub, groups) -> None:
    p = sub.add_parser("info", help="parameter counts and token layout of a config")
    add_config_args(p)
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("smoke", help="build the model and sample actions from random inputs")
    add_config_args(p)
    p.set_defaults(func=cmd_smoke)
    p = sub.add_parser("import-hf", help="import a Hugging Face PaliGemma folder into a vlastack model")
    p.add_argument("--paligemma", required=True, help="folder with config.json + safetensors (+ tokenizer)")
    p.add_argument("--out", required=True)
    add_config_args(p)
    p.set_defaults(func=cmd_import_hf)
    p = sub.add_parser("export-hf", help="write a vlastack model's VLM as a Hugging Face PaliGemma folder")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_export_hf)
