"""Freeze tiny PI0 / PI05 policies and their outputs from the real `lerobot` as test fixtures.

lerobot 0.6.1 needs Python 3.12 and pins torch<2.12, so it lives in a throwaway venv OUTSIDE the
repo (tested: Python 3.12.1, lerobot 0.6.1, transformers 5.5.4, torch 2.13.0, Debian 12):

    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/lrvenv
    /work/lrvenv/bin/pip install torch==2.13.0
    /work/lrvenv/bin/pip install --no-deps lerobot==0.6.1 torchvision==0.28.0
    /work/lrvenv/bin/pip install "numpy>=2,<2.3" "Pillow>=10,<13" "einops>=0.8,<0.9" \\
        "draccus>=0.11.6,<0.12" "huggingface-hub>=1.6,<2" requests "safetensors>=0.4.3,<1" \\
        "packaging>=24.2,<26" termcolor tqdm "gymnasium>=1.1.1,<2" "opencv-python-headless<4.14" \\
        "transformers>=5.4,<5.6" sentencepiece protobuf

(the rest of lerobot's Requires-Dist, e.g. cmake and the dataset/video stack, is not needed to
build PI0/PI05 policies and their processors). Then, from the repo root, with no Hub access:

    HF_HUB_OFFLINE=1 /work/lrvenv/bin/python scripts/make_lerobot_fixtures.py

writes ``tests/fixtures/lerobot/{pi0,pi05}/``: a LeRobot ``pretrained_model`` folder exactly as
``save_pretrained`` writes it (config.json, model.safetensors, policy_{pre,post}processor*.json and
their normalizer .safetensors) + ``tokenizer.model``, and ``io.safetensors`` / ``io.json`` with the
raw observations, the noise, and LeRobot's outputs: the velocity at a fixed (x_t, t), the normalized
actions and the final actions through preprocessor -> model -> postprocessor.

With ``--export`` it checks the other direction instead: each fixture is imported into vlastack
(``vla import``), its weights perturbed as a stand-in for fine-tuning (``perturb``), written back
with ``vla export-lerobot``, loaded by LeRobot (every tensor compared with the file: LeRobot's own
``from_pretrained`` only warns), and LeRobot's outputs on the same inputs are frozen as
``tests/fixtures/lerobot/<kind>/export_io.safetensors``.

Nothing is downloaded:
- the PaliGemma tokenizer is a tiny SentencePiece BPE model trained here with Gemma's conventions
  (``<pad>``=0, ``<eos>``=1, ``<bos>``=2, ``<unk>``=3, no dummy prefix, byte fallback), and LeRobot's
  ``AutoTokenizer.from_pretrained("google/paligemma-3b-pt-224")`` is pointed at it;
- the model is tiny: lerobot only knows the ``gemma_2b`` / ``gemma_300m`` variants and a SigLIP
  so400m vision tower, so ``get_gemma_config`` and the PaliGemma constructor are patched to small
  widths (the saved config.json keeps the variant names; the shapes live in the tensors). Heads
  stay 8 for both decoders: lerobot's joint attention reshapes to ``8 * head_dim``.

Every tensor is re-randomized (norm scales and biases included, and the adaRMS dense layers that
lerobot zero-initializes), so a weight our importer drops or misplaces changes the outputs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_NAME = "google/paligemma-3b-pt-224"

# Tiny shapes. VLM and expert widths differ so a swapped weight cannot go unnoticed.
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=8)
VLM = dict(width=64, depth=2, mlp_dim=96, num_heads=8, num_kv_heads=1, head_dim=8)
EXPERT = dict(width=32, depth=2, mlp_dim=48, num_heads=8, num_kv_heads=1, head_dim=8)
IMAGE = 32
VOCAB = 300
STATE_DIM, ACTION_DIM, CHUNK, STEPS = 6, 7, 5, 4
CAMERAS = ("observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb")  # the 2nd is absent
RAW_HW = (24, 40)  # non-square: exercises resize-with-pad
PROMPTS = ["pick up the red block", "open_the drawer slowly and then close it\n"]
MAX_TOKENS = {"pi0": 24, "pi05": 96}  # pi05: both prompts fit (64 and 83 tokens)
EXPORT_SEED = 7
SEED_OFFSET = {"pi0": 0, "pi05": 10}

TOKENIZER_TEXT = """pick up the red block and put it in the bowl
open the drawer slowly and then close it
Task: stack the cubes, State: 12 128 255 0 77 3 254 1 9;
Action: move the arm to the left
close the gripper
"""


def build_tokenizer(
    folder: Path,
    existing: Path | None = None,
    text: str = TOKENIZER_TEXT,
    vocab: int = VOCAB,
    symbols: tuple[str, ...] = ("\n",),
) -> Path:
    """Train a tiny SentencePiece BPE model with Gemma's special ids and layout (or reuse
    ``existing``) -> its HF folder. ``symbols``: pieces kept whole (pi0-FAST adds "|", "Action"...)."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    if existing is not None:
        shutil.copy(existing, folder / "tokenizer.model")
        cfg = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False}
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
        return folder
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines() * 20),
        model_prefix=str(folder / "tokenizer"),
        vocab_size=vocab,
        model_type="bpe",
        add_dummy_prefix=False,
        byte_fallback=True,
        split_digits=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        user_defined_symbols=list(symbols),
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        num_threads=1,
        minloglevel=2,
    )
    (folder / "tokenizer.vocab").unlink()
    cfg = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def patch_lerobot(tokenizer_dir: Path) -> None:
    """Tiny variants and an offline tokenizer (see the module docstring)."""
    import transformers
    from lerobot.policies.pi0 import modeling_pi0
    from lerobot.policies.pi05 import modeling_pi05
    from lerobot.processor import tokenizer_processor

    def tiny_gemma(variant: str):
        dims = {"gemma_2b": VLM, "gemma_300m": EXPERT}[variant]
        return modeling_pi0.GemmaConfig(**dims)

    class TinyConfigs:
        def __init__(self, real):
            self.real = real

        def __getitem__(self, name):
            make = self.real[name]
            if name != "gemma":
                return make

            def gemma(**kw):  # the expert's (unused) vocabulary: small, or its lm_head is 33 MB
                return make(**{**kw, "vocab_size": VOCAB})

            return gemma

    def tiny_paligemma(base):
        def make(config):
            vc = config.vision_config
            for k, v in VISION.items():
                setattr(vc, k, v)
            vc.projection_dim = config.text_config.hidden_size
            config.text_config.vocab_size = VOCAB
            config._vocab_size = VOCAB
            config.image_token_index = VOCAB - 1
            return base(config=config)

        return make

    for mod in (modeling_pi0, modeling_pi05):
        mod.get_gemma_config = tiny_gemma
        mod.CONFIG_MAPPING = TinyConfigs(transformers.models.auto.CONFIG_MAPPING)
        mod.PaliGemmaForConditionalGenerationWithPiGemma = tiny_paligemma(
            mod.PaliGemmaForConditionalGenerationWithPiGemma
        )

    real_auto = tokenizer_processor.AutoTokenizer

    class OfflineAutoTokenizer:
        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            if name != TOKENIZER_NAME:
                raise ValueError(f"unexpected tokenizer {name!r}")
            return real_auto.from_pretrained(str(tokenizer_dir), *args, **kwargs)

    tokenizer_processor.AutoTokenizer = OfflineAutoTokenizer


@torch.no_grad()
def randomize(policy: torch.nn.Module, seed: int) -> None:
    """Every tensor non-default: matrices N(0, 1/fan_in), vectors N(0, 0.2) (LayerNorm scales
    around 1), so no norm scale is 0/1 and no bias is 0."""
    g = torch.Generator().manual_seed(seed)
    for name, p in policy.named_parameters():
        if p.ndim >= 2:
            fan_in = p[0].numel()
            p.copy_(torch.randn(p.shape, generator=g) * fan_in**-0.5)
        else:
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            if "vision_tower" in name and "norm" in name and name.endswith("weight"):
                p.add_(1.0)


def make_stats(kind: str, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, d in (("observation.state", STATE_DIM), ("action", ACTION_DIM)):
        mean = torch.randn(d, generator=g)
        std = torch.rand(d, generator=g) + 0.5
        out[key] = {
            "mean": mean,
            "std": std,
            "min": mean - 3 * std,
            "max": mean + 3 * std,
            # narrower than the data: some normalized states land outside [-1, 1] (no clipping)
            "q01": mean - 1.5 * std,
            "q99": mean + 1.5 * std,
        }
    return out


def raw_batch(seed: int) -> dict:
    """Batch 2, camera 0 present (float [0, 1], values k/255 so uint8 reproduces them), camera 1 absent."""
    g = torch.Generator().manual_seed(seed)
    img = torch.randint(0, 256, (2, 3, *RAW_HW), generator=g).float() / 255.0
    state = torch.randn(2, STATE_DIM, generator=g) * 1.3
    return {CAMERAS[0]: img, "observation.state": state, "task": list(PROMPTS)}


def make_policy(kind: str, folder: Path, seed: int):
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_pre_post_processors

    if kind == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config as Config
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy as Policy
    else:
        from lerobot.policies.pi05.configuration_pi05 import PI05Config as Config
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy as Policy

    inputs = {c: PolicyFeature(type=FeatureType.VISUAL, shape=(3, *RAW_HW)) for c in CAMERAS}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    config = Config(
        input_features=inputs,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))},
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        num_inference_steps=STEPS,
        image_resolution=(IMAGE, IMAGE),
        tokenizer_max_length=MAX_TOKENS[kind],
        device="cpu",
        dtype="float32",
    )
    policy = Policy(config)
    randomize(policy, seed)
    pre, post = make_pre_post_processors(config, dataset_stats=make_stats(kind, seed + 1))
    policy.save_pretrained(folder)
    pre.save_pretrained(folder)
    post.save_pretrained(folder)
    # Reload everything the way a user does (strict), and run the reloaded objects.
    loaded = Policy.from_pretrained(folder, strict=True)
    loaded_cfg = loaded.config
    pre, post = make_pre_post_processors(loaded_cfg, pretrained_path=str(folder))
    for k, v in policy.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    return loaded.eval(), pre, post


@torch.no_grad()
def velocity(kind: str, policy, batch: dict, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """LeRobot's cached denoise step at (x_t, t): the prefix pass of ``sample_actions``."""
    from lerobot.policies.common.vla_utils import make_att_2d_masks, prepare_attention_masks_4d

    m = policy.model
    images, img_masks = policy._preprocess_images(batch)
    tokens = batch["observation.language.tokens"]
    masks = batch["observation.language.attention_mask"]
    emb, pad, att = m.embed_prefix(images, img_masks, tokens, masks)
    mask4 = prepare_attention_masks_4d(make_att_2d_masks(pad, att))
    m.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = "eager"
    _, kv = m.paligemma_with_expert.forward(
        attention_mask=mask4,
        position_ids=torch.cumsum(pad, dim=1) - 1,
        past_key_values=None,
        inputs_embeds=[emb, None],
        use_cache=True,
    )
    if kind == "pi0":
        return m.denoise_step(policy.prepare_state(batch), pad, kv, x_t, t)
    return m.denoise_step(pad, kv, x_t, t)


def run(kind: str, out: Path, tokenizer_dir: Path, seed: int) -> dict:
    import lerobot
    import transformers
    from safetensors.torch import save_file

    folder = out / kind
    if folder.exists():
        shutil.rmtree(folder)
    policy, pre, post = make_policy(kind, folder, seed)
    shutil.copy(tokenizer_dir / "tokenizer.model", folder / "tokenizer.model")

    raw = raw_batch(seed + 2)
    processed = pre({k: (v.clone() if torch.is_tensor(v) else list(v)) for k, v in raw.items()})
    g = torch.Generator().manual_seed(seed + 3)
    noise = torch.randn(2, CHUNK, 32, generator=g)
    x_t = torch.randn(2, CHUNK, 32, generator=g)
    t = torch.tensor([0.37, 0.81])
    v = velocity(kind, policy, processed, x_t, t)
    images, _ = policy._preprocess_images(processed)
    normalized = policy.predict_action_chunk(processed, noise=noise.clone())
    final = post(normalized.clone())
    tensors = {
        "raw.image": raw[CAMERAS[0]],
        "raw.state": raw["observation.state"],
        "noise": noise,
        "x_t": x_t,
        "t": t,
        "pre.tokens": processed["observation.language.tokens"],
        "pre.token_mask": processed["observation.language.attention_mask"].bool(),
        "pre.state": processed["observation.state"],
        "pre.image": images[0],  # after resize-with-pad and [-1, 1]
        "out.velocity": v,
        "out.normalized_actions": normalized,
        "out.actions": final,
    }
    save_file({k: x.contiguous() for k, x in tensors.items()}, str(folder / "io.safetensors"))
    meta = {
        "kind": kind,
        "lerobot": lerobot.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "prompts": PROMPTS,
        "cameras_present": [CAMERAS[0]],
        "cameras_absent": [CAMERAS[1]],
        "num_steps": STEPS,
        # Head counts are not in the tensors; the config's variant names say 8 for both decoders,
        # but the tiny vision tower's 4 heads differ from so400m's 16: an explicit override.
        "overrides": [f"model.vision.heads={VISION['num_attention_heads']}"],
        "velocity_note": "denoise_step at x_t, t (prefix cached as in sample_actions), padded to 32 dims",
    }
    (folder / "io.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = sum(f.stat().st_size for f in folder.iterdir())
    print(f"{kind}: wrote {folder} ({size / 1e6:.2f} MB); actions[0,0] = {final[0, 0].tolist()}")
    return meta


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """A deterministic stand-in for fine-tuning (tests/models/test_lerobot_parity.py does the same)."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=g) * scale)


def run_export(kind: str, fixtures: Path, seed: int) -> None:
    """vlastack import -> perturb -> export-lerobot -> LeRobot loads it -> freeze LeRobot's outputs."""
    from safetensors.torch import load_file, save_file

    sys.path.insert(0, str(ROOT))
    from vlastack.infer.export_lerobot import export_lerobot
    from vlastack.infer.importer import import_checkpoint
    from vlastack.models.vla import VLA

    if kind == "pi0":
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy as Policy
    else:
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy as Policy
    from lerobot.policies.factory import make_pre_post_processors

    src = fixtures / kind
    meta = json.loads((src / "io.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        ours = import_checkpoint(src, Path(tmp) / "ours", meta["overrides"])
        model = VLA.from_pretrained(ours)
        perturb(model, seed)
        model.save_pretrained(ours)
        exported = export_lerobot(ours, Path(tmp) / "exported")
        policy = Policy.from_pretrained(exported, strict=True).eval()
        written = load_file(str(exported / "model.safetensors"))
        loaded = policy.state_dict()
        assert set(written) == set(loaded), sorted(set(written) ^ set(loaded))[:10]
        for k, v in written.items():
            assert torch.equal(v, loaded[k]), f"LeRobot did not load {k}"
        pre, post = make_pre_post_processors(policy.config, pretrained_path=str(exported))
        io = load_file(str(src / "io.safetensors"))
        raw = {
            CAMERAS[0]: io["raw.image"],
            "observation.state": io["raw.state"],
            "task": list(meta["prompts"]),
        }
        processed = pre(raw)
        normalized = policy.predict_action_chunk(processed, noise=io["noise"].clone())
        final = post(normalized.clone())
        v = velocity(kind, policy, processed, io["x_t"], io["t"])
    out = {"out.velocity": v, "out.normalized_actions": normalized, "out.actions": final}
    save_file({k: x.contiguous() for k, x in out.items()}, str(src / "export_io.safetensors"))
    meta["export"] = {"perturb_seed": seed, "lerobot_loaded_strictly": True}
    (src / "io.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{kind}: LeRobot loaded the vlastack export strictly; froze {src / 'export_io.safetensors'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests/fixtures/lerobot")
    ap.add_argument("--kinds", nargs="+", default=["pi0", "pi05"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--export", action="store_true", help="check vla export-lerobot on existing fixtures")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        existing = args.out / args.kinds[0] / "tokenizer.model" if args.export else None
        tok = build_tokenizer(Path(tmp) / "tokenizer", existing)
        patch_lerobot(tok)
        for kind in args.kinds:
            if args.export:
                run_export(kind, args.out, EXPORT_SEED)
            else:
                run(kind, args.out, tok, args.seed + SEED_OFFSET[kind])


if __name__ == "__main__":
    main()
