"""Freeze a tiny PI0Fast (pi0-FAST) policy and its decoded actions from the real `lerobot` as a fixture.

Same throwaway venv as scripts/make_lerobot_fixtures.py (lerobot 0.6.1, transformers 5.5.4), plus
scipy (pi0_fast's inverse DCT): ``/work/lrvenv/bin/pip install scipy``. From the repo root, offline:

    HF_HUB_OFFLINE=1 /work/lrvenv/bin/python scripts/make_pi0_fast_fixture.py            # the fixture
    HF_HUB_OFFLINE=1 /work/lrvenv/bin/python scripts/make_pi0_fast_fixture.py --export   # the way back

writes ``tests/fixtures/lerobot/pi0_fast/``: the ``pretrained_model`` folder exactly as LeRobot's
``save_pretrained`` writes it (config.json, model.safetensors, policy_{pre,post}processor*), the
PaliGemma stand-in ``tokenizer.model``, the FAST action tokenizer in ``fast_tokenizer/`` (what
``AutoProcessor.from_pretrained("lerobot/fast-action-tokenizer")`` would fetch: processor_config.json,
tokenizer.json, ...), and ``io.safetensors`` / ``io.json``: raw observations, LeRobot's prompt tokens,
the FAST tokens of the target chunks (``ActionTokenizerProcessorStep``), the greedily decoded token
ids (``sample_actions_fast_kv_cache``), the normalized actions (``predict_action_chunk``: cut at
"|", "Action: " removed, ids -> FAST -> BPE decode -> inverse DCT) and the final actions
(postprocessor).

Nothing is downloaded:
- the PaliGemma tokenizer is a tiny SentencePiece model (Gemma's special ids) in which "|", "Action"
  and ":" are single pieces, as in PaliGemma's vocabulary;
- the FAST processor is ``UniversalActionProcessor`` as lerobot 0.6.1 vendors it
  (``policies/molmoact2/molmoact2_hf_model/action_tokenizer.py``, the physical-intelligence code:
  DCT, round(scale * c) - min_token as characters, a ByteLevel BPE), fitted here on smooth random
  chunks; ``AutoProcessor.from_pretrained`` is pointed at it;
- the model is tiny (``get_gemma_config`` and the PaliGemma constructor patched, as for pi0).

A random-weight model does not emit "Action: <FAST tokens> |", so after re-randomizing every tensor
the policy is fitted (Adam, a few hundred steps) to emit the FAST tokens of two fixed target chunks
for the two fixed observations, in the layout that inference uses (``[images, prompt, <bos>]`` one
bidirectional block, then causal tokens; LeRobot's own ``forward`` puts ``<bos>`` in the causal
part, which inference does not). A third observation (an unseen prompt) decodes to whatever the
fitted model says: its tokens are frozen too (token parity), its actions are LeRobot's relaxed
decode (zero-padded or truncated DCT coefficients), which vlastack flags invalid instead.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_lerobot_fixtures as base  # noqa: E402

TOKENIZER_NAME = base.TOKENIZER_NAME
FAST_NAME = "lerobot/fast-action-tokenizer"
VOCAB = 320
SKIP = 4  # fast_skip_tokens: PaliGemma skips its 128 <seg> ids; the tiny vocabulary has no room
FAST_VOCAB = 120
SCALE = 10.0
STATE_DIM, ACTION_DIM, CHUNK = 6, 7, 5
MAX_TEXT = 64
MAX_ACTION_TOKENS = 40  # training pad length of ActionTokenizerProcessorStep
MAX_DECODING = 32
CAMERAS = base.CAMERAS
PROMPTS = ["pick up the red block", "open_the drawer slowly\n", "close the gripper"]
FIT_ROWS = 2  # the first two observations are fitted; the third is unseen
EXPORT_SEED = 7

TOKENIZER_TEXT = """Task: pick up the red block and put it in the bowl, State: 12 128 255 0 77 3;
Task: open the drawer slowly and then close it, State: 254 1 9 100 31 64;
Action: move the arm to the left|
close the gripper
"""


def build_tokenizer(folder: Path) -> Path:
    """The base script's tiny Gemma-style SentencePiece model, with pi0-FAST's prompt pieces kept whole."""
    return base.build_tokenizer(
        folder, text=TOKENIZER_TEXT, vocab=VOCAB, symbols=("\n", "|", "Action", ":", "\u2581")
    )


def smooth_chunks(n: int, seed: int) -> np.ndarray:
    """[n, CHUNK, ACTION_DIM] smooth random chunks, roughly in [-1, 1] (normalized units)."""
    g = np.random.default_rng(seed)
    t = np.linspace(0, 1, CHUNK)[None, :, None]
    a, b, c = (g.uniform(-0.8, 0.8, (n, 1, ACTION_DIM)) for _ in range(3))
    return (a + b * t + 0.3 * c * np.sin(np.pi * t)).astype(np.float64)


def build_fast(folder: Path) -> Path:
    from lerobot.policies.molmoact2.molmoact2_hf_model.action_tokenizer import UniversalActionProcessor

    proc = UniversalActionProcessor.fit(
        list(smooth_chunks(400, 0)),
        scale=SCALE,
        vocab_size=FAST_VOCAB,
        time_horizon=CHUNK,
        action_dim=ACTION_DIM,
    )
    proc.save_pretrained(str(folder))
    return folder


def patch_lerobot(tokenizer_dir: Path, fast_dir: Path) -> None:
    """Tiny PaliGemma, offline text tokenizer and FAST processor."""
    from lerobot.policies.molmoact2.molmoact2_hf_model.action_tokenizer import UniversalActionProcessor
    from lerobot.policies.pi0_fast import modeling_pi0_fast as mod
    from lerobot.processor import tokenizer_processor

    def tiny_gemma(variant: str):
        return mod.GemmaConfig(**base.VLM)

    def tiny_paligemma(cls):
        def make(config):
            vc = config.vision_config
            for k, v in base.VISION.items():
                setattr(vc, k, v)
            vc.projection_dim = config.text_config.hidden_size
            vc.image_size = base.IMAGE  # pi0 sets it from image_resolution, pi0_fast keeps 224
            config.text_config.vocab_size = VOCAB
            config._vocab_size = VOCAB
            config.image_token_index = VOCAB - 1
            return cls(config=config)

        return make

    mod.get_gemma_config = tiny_gemma
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

    class OfflineAutoProcessor:
        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            if name != FAST_NAME:
                raise ValueError(f"unexpected action tokenizer {name!r}")
            return UniversalActionProcessor.from_pretrained_local(str(FAST_DIR[0]))

    for m in (mod, tokenizer_processor):
        m.AutoTokenizer = OfflineAutoTokenizer
        m.AutoProcessor = OfflineAutoProcessor
    FAST_DIR[0] = fast_dir


FAST_DIR: list[Path] = [Path()]  # where OfflineAutoProcessor reads (the export check repoints it)


def make_stats(seed: int) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, d in (("observation.state", STATE_DIM), ("action", ACTION_DIM)):
        mean, std = torch.randn(d, generator=g), torch.rand(d, generator=g) + 0.5
        out[key] = {"mean": mean, "std": std, "min": mean - 3 * std, "max": mean + 3 * std,
                    "q01": mean - 1.5 * std, "q99": mean + 1.5 * std}  # fmt: skip
    return out


def raw_batch(seed: int, stats: dict) -> dict:
    """3 observations (camera 0 present, values k/255; camera 1 absent) and, for the fitted rows,
    target action chunks in env units (normalized targets are smooth_chunks)."""
    g = torch.Generator().manual_seed(seed)
    n = len(PROMPTS)
    img = torch.randint(0, 256, (n, 3, *base.RAW_HW), generator=g).float() / 255.0
    state = torch.randn(n, STATE_DIM, generator=g) * 1.3
    target = torch.from_numpy(smooth_chunks(n, seed + 1)).float()
    a = stats["action"]
    actions = target * a["std"] + a["mean"]
    return {CAMERAS[0]: img, "observation.state": state, "task": list(PROMPTS), "action": actions}


def make_policy(folder: Path, seed: int, stats: dict):
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.pi0_fast.configuration_pi0_fast import PI0FastConfig
    from lerobot.policies.pi0_fast.modeling_pi0_fast import PI0FastPolicy

    inputs = {c: PolicyFeature(type=FeatureType.VISUAL, shape=(3, *base.RAW_HW)) for c in CAMERAS}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    config = PI0FastConfig(
        input_features=inputs,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))},
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        image_resolution=(base.IMAGE, base.IMAGE),
        tokenizer_max_length=MAX_TEXT,
        max_action_tokens=MAX_ACTION_TOKENS,
        max_decoding_steps=MAX_DECODING,
        fast_skip_tokens=SKIP,
        device="cpu",
        dtype="float32",
    )
    policy = PI0FastPolicy(config)
    base.randomize(policy, seed)
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    return policy, pre, post, PI0FastPolicy


def inference_layout_loss(policy, batch: dict, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the target sequence ("Action: " FAST "|" <eos>) after [images, prompt,
    <bos>] (one bidirectional block), as sample_actions_fast_kv_cache decodes. -> (loss, all
    target tokens are the argmax)."""
    from lerobot.policies.common.vla_utils import prepare_attention_masks_4d
    from lerobot.utils.constants import (
        ACTION_TOKEN_MASK,
        ACTION_TOKENS,
        OBS_LANGUAGE_ATTENTION_MASK,
        OBS_LANGUAGE_TOKENS,
    )

    m = policy.model
    images, img_masks = policy._preprocess_images(batch)
    images, img_masks = [i[:rows] for i in images], [k[:rows] for k in img_masks]
    tokens, masks = batch[OBS_LANGUAGE_TOKENS][:rows], batch[OBS_LANGUAGE_ATTENTION_MASK][:rows].bool()
    bos = torch.full((rows, 1), policy._paligemma_tokenizer.bos_token_id, dtype=torch.long)
    tokens = torch.cat([tokens, bos], 1)
    masks = torch.cat([masks, torch.ones(rows, 1, dtype=torch.bool)], 1)
    tgt, tmask = batch[ACTION_TOKENS][:rows, 1:], batch[ACTION_TOKEN_MASK][:rows, 1:].bool()
    embs, pad, att, _, n = m.embed_prefix_fast(images, img_masks, tokens, masks, tgt, tmask)
    (out, _), _ = m.paligemma_with_expert.forward(
        attention_mask=prepare_attention_masks_4d(att, dtype=embs.dtype),
        position_ids=torch.cumsum(pad, dim=1) - 1,
        past_key_values=None,
        inputs_embeds=[embs, None],
        use_cache=False,
        adarms_cond=[None, None],
    )
    logits = m.paligemma_with_expert.paligemma.lm_head(out[:, -n - 1 : -1])
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none")
    w = tmask.flatten().float()
    ok = ((logits.argmax(-1) == tgt) | ~tmask).all()
    return (ce * w).sum() / w.sum(), ok


def fit(policy, processed: dict, steps: int = 600) -> int:
    opt = torch.optim.Adam(policy.parameters(), lr=2e-3)
    policy.train()
    for i in range(steps):
        loss, ok = inference_layout_loss(policy, processed, FIT_ROWS)
        if ok and i > 20:
            policy.eval()
            return i
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i % 50 == 0:
            print(f"  fit step {i}: loss {loss.item():.4f}")
    raise RuntimeError("the tiny policy did not learn the target tokens")


@torch.no_grad()
def first_logits(policy, processed: dict) -> torch.Tensor:
    """The logits of the first generated token: the prefill of sample_actions_fast_kv_cache."""
    from lerobot.policies.common.vla_utils import prepare_attention_masks_4d
    from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

    m = policy.model
    images, img_masks = policy._preprocess_images(processed)
    tokens, masks = processed[OBS_LANGUAGE_TOKENS], processed[OBS_LANGUAGE_ATTENTION_MASK].bool()
    b = tokens.shape[0]
    tokens = torch.cat([tokens, torch.full((b, 1), policy._paligemma_tokenizer.bos_token_id)], 1)
    masks = torch.cat([masks, torch.ones(b, 1, dtype=torch.bool)], 1)
    embs, pad, att, _, _ = m.embed_prefix_fast(images, img_masks, tokens, masks)
    (out, _), _ = m.paligemma_with_expert.forward(
        attention_mask=prepare_attention_masks_4d(att, dtype=embs.dtype),
        position_ids=torch.cumsum(pad, dim=1) - 1,
        past_key_values=None,
        inputs_embeds=[embs, None],
        use_cache=False,
        adarms_cond=[None, None],
    )
    return m.paligemma_with_expert.paligemma.lm_head(out[:, -1])


@torch.no_grad()
def decode(policy, processed: dict) -> dict:
    from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

    logits = first_logits(policy, processed)
    images, img_masks = policy._preprocess_images(processed)
    tokens = policy.model.sample_actions_fast_kv_cache(
        images,
        img_masks,
        processed[OBS_LANGUAGE_TOKENS],
        processed[OBS_LANGUAGE_ATTENTION_MASK],
        max_decoding_steps=policy.config.max_decoding_steps,
        temperature=0.0,
    )
    # the third (unseen) row need not start with "Action:"; LeRobot's check is for all rows
    policy.config.validate_action_token_prefix = False
    normalized = policy.predict_action_chunk(processed)
    return {"tokens": tokens, "normalized": normalized, "image": images[0], "logits": logits}


def run(out: Path, tok_dir: Path, fast_dir: Path, seed: int) -> None:
    import lerobot
    import transformers
    from lerobot.utils.constants import ACTION_TOKEN_MASK, ACTION_TOKENS
    from safetensors.torch import save_file

    folder = out / "pi0_fast"
    if folder.exists():
        shutil.rmtree(folder)
    stats = make_stats(seed + 1)
    policy, pre, post, cls = make_policy(folder, seed, stats)
    raw = raw_batch(seed + 2, stats)
    processed = pre({k: (v.clone() if torch.is_tensor(v) else list(v)) for k, v in raw.items()})
    steps = fit(policy, processed)
    print(f"fitted in {steps} steps")
    policy.save_pretrained(folder)
    pre.save_pretrained(folder)
    post.save_pretrained(folder)
    shutil.copy(tok_dir / "tokenizer.model", folder / "tokenizer.model")
    shutil.copytree(fast_dir, folder / "fast_tokenizer")
    loaded = cls.from_pretrained(folder, strict=True).eval()
    for k, v in policy.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    from lerobot.policies.factory import make_pre_post_processors

    pre, post = make_pre_post_processors(loaded.config, pretrained_path=str(folder))
    obs = {k: v for k, v in raw.items() if k != "action"}
    processed_inf = pre({k: (v.clone() if torch.is_tensor(v) else list(v)) for k, v in obs.items()})
    got = decode(loaded, processed_inf)
    final = post(got["normalized"].clone())
    bar = loaded._paligemma_tokenizer.convert_tokens_to_ids("|")
    tensors = {
        "raw.image": raw[CAMERAS[0]],
        "raw.state": raw["observation.state"],
        "raw.target_actions": raw["action"][:FIT_ROWS],
        "pre.tokens": processed_inf["observation.language.tokens"],
        "pre.token_mask": processed_inf["observation.language.attention_mask"].bool(),
        "pre.image": got["image"],
        "pre.action_tokens": processed[ACTION_TOKENS][:FIT_ROWS],
        "pre.action_token_mask": processed[ACTION_TOKEN_MASK][:FIT_ROWS].bool(),
        "out.first_logits": got["logits"],
        "out.tokens": got["tokens"],
        "out.normalized_actions": got["normalized"],
        "out.actions": final,
    }
    save_file({k: x.contiguous() for k, x in tensors.items()}, str(folder / "io.safetensors"))
    ends = [(row == bar).nonzero()[:1].flatten().tolist() for row in got["tokens"]]
    meta = {
        "kind": "pi0_fast",
        "lerobot": lerobot.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "prompts": PROMPTS,
        "fitted_rows": FIT_ROWS,
        "cameras_present": [CAMERAS[0]],
        "cameras_absent": [CAMERAS[1]],
        "end_token": "|",
        "end_positions": ends,
        "fit_steps": steps,
        "overrides": [f"model.vision.heads={base.VISION['num_attention_heads']}"],
    }
    (folder / "io.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"wrote {folder} ({size / 1e6:.2f} MB); tokens {got['tokens'].tolist()}; ends {ends}")
    print(f"actions[0, 0] = {final[0, 0].tolist()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests/fixtures/lerobot")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--export", action="store_true", help="check vla export-lerobot on the fixture")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        if args.export:
            src = args.out / "pi0_fast"
            tok_dir, fast_dir = (
                base.build_tokenizer(Path(tmp) / "tok", src / "tokenizer.model"),
                src / "fast_tokenizer",
            )
        else:
            tok_dir, fast_dir = build_tokenizer(Path(tmp) / "tok"), build_fast(Path(tmp) / "fast")
        patch_lerobot(tok_dir, fast_dir)
        if args.export:
            run_export(args.out, EXPORT_SEED)
        else:
            run(args.out, tok_dir, fast_dir, args.seed)


PERTURB = 0.02  # small enough that the perturbed model still writes valid FAST sequences


def perturb(model: torch.nn.Module, seed: int) -> None:
    """A stand-in for fine-tuning (tests/models/test_pi0_fast_parity.py does the same)."""
    base.perturb(model, seed, PERTURB)


def run_export(out: Path, seed: int) -> None:
    """vla import -> perturb -> vla export-lerobot -> LeRobot loads it strictly -> freeze its outputs."""
    from safetensors.torch import load_file, save_file

    sys.path.insert(0, str(ROOT))
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.pi0_fast.modeling_pi0_fast import PI0FastPolicy

    from vlastack.infer.export_lerobot import export_lerobot
    from vlastack.infer.importer import import_checkpoint
    from vlastack.models.vla import VLA

    src = out / "pi0_fast"
    meta = json.loads((src / "io.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        ours = import_checkpoint(src, Path(tmp) / "ours", meta["overrides"])
        model = VLA.from_pretrained(ours)
        perturb(model, seed)
        model.save_pretrained(ours)
        exported = export_lerobot(ours, Path(tmp) / "exported")
        FAST_DIR[0] = exported / "fast_tokenizer"  # LeRobot reads the processor files we wrote
        policy = PI0FastPolicy.from_pretrained(exported, strict=True).eval()
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
        got = decode(policy, pre(raw))
        final = post(got["normalized"].clone())
    tensors = {"out.first_logits": got["logits"], "out.tokens": got["tokens"],
               "out.normalized_actions": got["normalized"], "out.actions": final}  # fmt: skip
    save_file({k: x.contiguous() for k, x in tensors.items()}, str(src / "export_io.safetensors"))
    meta["export"] = {"perturb_seed": seed, "perturb_scale": PERTURB, "lerobot_loaded_strictly": True}
    (src / "io.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"LeRobot loaded the vlastack export strictly; tokens {got['tokens'].tolist()}")


if __name__ == "__main__":
    main()
