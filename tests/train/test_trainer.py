"""Training features on CPU: precisions, accumulation, bad steps, data checks, LoRA, freezing, EMA."""

from __future__ import annotations

import pytest
import torch
from train_helpers import TINY, FakeDataset, tiny_cfg

from vlastack.batch import dummy_batch
from vlastack.config import TrainConfig, load_config
from vlastack.models import build_model
from vlastack.models.vla import VLA
from vlastack.train.optim import lr_factor, param_groups, part_of
from vlastack.train.parallel import apply_activation_checkpointing
from vlastack.train.state import flatten, unflatten
from vlastack.train.trainer import Trainer, TrainingDiverged


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_on_cpu(tmp_path, precision):
    cfg = tiny_cfg("train.steps=3", f"train.precision={precision}", "train.save_every=100")
    tr = Trainer(cfg, run_dir=tmp_path, dataset=FakeDataset(cfg))
    seen: set[torch.dtype] = set()  # the dtype the decoder's matmuls really ran in
    hook = tr.model.decoder.layers[0].expert.mlp.gate_proj.register_forward_hook(
        lambda m, a, o: seen.add(o.dtype)
    )
    out = tr.fit()
    hook.remove()
    want = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert seen == {want}, (precision, seen)
    assert all(torch.isfinite(torch.tensor(out["losses"])))
    assert (tmp_path / "final" / "model.safetensors").exists()


def test_nan_loss_is_skipped_then_stops(tmp_path):
    cfg = tiny_cfg("train.steps=10", "train.max_bad_steps=3")
    ds = FakeDataset(cfg, nan_actions=True)
    tr = Trainer(cfg, run_dir=tmp_path, dataset=ds)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    with pytest.raises(TrainingDiverged, match="3 consecutive steps had a NaN/inf loss"):
        tr.fit()
    assert tr.bad_total == 3 and tr.step == 3
    assert all(torch.equal(before[k], v) for k, v in tr.model.state_dict().items())  # no update applied


def test_dataset_that_does_not_fit_is_refused(tmp_path):
    small = tiny_cfg("model.state_dim=4")
    with pytest.raises(ValueError, match=r"batch\['state'\] has shape \(1, 4\), expected \(1, 8\)"):
        Trainer(tiny_cfg(), run_dir=tmp_path, dataset=FakeDataset(small))


def test_grad_accumulation_matches_one_big_batch():
    cfg = tiny_cfg()
    b = dummy_batch(cfg.model, 4, seed=1)
    b["action_is_pad"][:] = False  # equal loss weight per sample
    g = torch.Generator().manual_seed(2)
    noise, time = torch.randn(b["actions"].shape, generator=g), torch.rand(4, generator=g)
    from vlastack.train.step import train_step

    states, norms = [], []
    for accum in (1, 2):
        torch.manual_seed(0)
        m = build_model(cfg.model)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)  # SGD: a wrong loss scale would show (Adam hides it)
        k = 4 // accum
        micro = [{n: v[i * k : (i + 1) * k] for n, v in b.items()} for i in range(accum)]
        kw = [{"noise": noise[i * k : (i + 1) * k], "time": time[i * k : (i + 1) * k]} for i in range(accum)]
        res = train_step(m, opt, micro, loss_kwargs=kw, grad_clip=0.5)
        assert res.ok and res.grad_norm > 0.5  # clipping was active
        states.append(m.state_dict())
        norms.append(res.grad_norm)
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)
    for k in states[0]:
        torch.testing.assert_close(states[0][k], states[1][k], atol=1e-6, rtol=1e-5)


def test_activation_checkpointing_same_gradients():
    cfg = tiny_cfg("model.vlm.depth=2", "model.expert.depth=2")
    torch.manual_seed(0)
    a = build_model(cfg.model)
    b = build_model(cfg.model)
    b.load_state_dict(a.state_dict())
    assert apply_activation_checkpointing(b) == 3  # 2 joint layers + 1 vision layer
    batch = dummy_batch(cfg.model, 2)
    kw = {"noise": torch.randn(batch["actions"].shape), "time": torch.rand(2)}
    for m in (a, b):
        m(batch, **kw)["loss"].backward()
    assert a.state_dict().keys() == b.state_dict().keys()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, msg=n)


def test_parts_freezing_and_lr(tmp_path):
    cfg = tiny_cfg("train.steps=2", "train.lr_vision=0", "train.lr_expert=5e-4", "train.save_every=100")
    tr = Trainer(cfg, run_dir=tmp_path, dataset=FakeDataset(cfg))
    vis = {k: v.clone() for k, v in tr.model.vision.state_dict().items()}
    names = {g["name"]: g["base_lr"] for g in tr.optimizer.param_groups}
    assert (
        not any(n.startswith("vision") for n in names)
        and names["expert"] == 5e-4
        and names["vlm"] == cfg.train.lr
    )
    tr.fit()
    assert all(torch.equal(v, tr.model.vision.state_dict()[k]) for k, v in vis.items())
    assert part_of("decoder.layers.0.expert.mlp.up_proj.weight") == "expert"
    assert part_of("decoder.layers.0.vlm.mlp.up_proj.weight") == "vlm"
    assert part_of("projector.weight") == "vision" and part_of("head.state_proj.weight") == "head"
    # Issue #36: the head's own layers are their own group: lr_head, else lr_expert for a head that
    # drives the action expert (flow), else lr (tokens: lr_expert used to drive it, with no expert).
    assert names["head"] == 5e-4
    # ... sorted beside the expert's, so the clipped norm sums parameters in the order it always did
    assert [n for n in names if n.split(".")[0] in ("expert", "head")] == [
        "expert.no_decay", "head.no_decay", "expert", "head"]  # fmt: skip
    tok = tiny_cfg("model.head=tokens", "train.lr_expert=5e-4", "train.lr_head=2e-4").train
    tok_model = build_model(tiny_cfg("model.head=tokens").model)
    assert {g["name"]: g["base_lr"] for g in param_groups(tok_model, tok)}["head"] == 2e-4
    tok = tiny_cfg("model.head=tokens", "train.lr_expert=5e-4").train
    assert {g["name"]: g["base_lr"] for g in param_groups(tok_model, tok)}["head"] == tok.lr
    with pytest.raises(ValueError, match="lr_head"):
        tiny_cfg("train.lr_head=-1")
    m = build_model(cfg.model)
    for g in param_groups(m, TrainConfig()):
        assert all(p.ndim >= 2 for p in g["params"]) == (g["weight_decay"] > 0)


def test_lora_trains_only_adapters_and_exports_merged(tmp_path):
    cfg0 = tiny_cfg()
    torch.manual_seed(3)
    base = build_model(cfg0.model)
    base.save_pretrained(tmp_path / "base")
    cfg = tiny_cfg(
        "train.steps=3", "train.lora_rank=4", f"train.init_from={tmp_path / 'base'}", "train.lr=1e-2"
    )
    tr = Trainer(cfg, run_dir=tmp_path / "run", dataset=FakeDataset(cfg))
    trainable = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    out = tr.fit()
    final = tmp_path / "run" / "final"
    from safetensors.torch import load_file

    adapters = load_file(str(final / "adapter.safetensors"))
    assert adapters and all(".lora_" in k for k in adapters)
    merged = VLA.from_pretrained(final)  # plain weights: LoRA merged at export
    batch = dummy_batch(cfg.model, 2)
    noise = torch.randn(2, cfg.model.action_horizon, cfg.model.action_dim)
    tr.model.eval()
    torch.testing.assert_close(
        merged.sample_actions(batch, noise=noise), tr.model.sample_actions(batch, noise=noise)
    )
    assert not torch.equal(merged.sample_actions(batch, noise=noise), base.sample_actions(batch, noise=noise))
    assert out["steps"] == 3
    # resume of a LoRA run rebuilds base + adapters exactly
    tr2 = Trainer(cfg, run_dir=tmp_path / "run", dataset=FakeDataset(cfg), resume=True)
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, tr2.model.state_dict()[k]), k


def test_lora_keeps_a_frozen_part_frozen(tmp_path):
    """lr_vision=0 with LoRA (the 24 GB Pi0.5 recipe's frozen vision): apply_lora used to make
    every adapter trainable, the vision tower's too, so it ran a backward and held activations
    for adapters whose learning rate is 0."""
    cfg = tiny_cfg("train.steps=1", "train.lora_rank=4", "train.lr_vision=0")
    tr = Trainer(cfg, run_dir=tmp_path / "run", dataset=FakeDataset(cfg))
    trainable = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    assert not [n for n in trainable if part_of(n) == "vision"]
    assert any(part_of(n) == "vision" and ".lora_" in n for n, _ in tr.model.named_parameters())
    assert "vision" not in {g["name"].split(".")[0] for g in tr.optimizer.param_groups}
    tr.fit()


def test_pi05_24gb_recipe_trains_on_the_tiny_preset(tmp_path):
    """The packaged ``pi05_lora_24gb`` recipe on the tiny preset's Pi0.5: adapters outside the
    vision tower train, the rest stays fixed (its full-size peak: docs/gpu.md, ``vla plan``)."""
    cfg = load_config(
        "tiny",
        "pi05_lora_24gb",
        [
            *TINY,
            "model.head_options.variant=pi05",
            "model.max_text_len=80",
            "train.steps=2",
            "train.batch_size=4",
        ],
    )
    assert cfg.train.lora_rank == 16 and cfg.train.lr_vision == 0 and cfg.train.activation_checkpointing
    assert cfg.train.grad_accum == 2
    tr = Trainer(cfg, run_dir=tmp_path / "run", dataset=FakeDataset(cfg))
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    out = tr.fit()
    assert out["steps"] == 2
    changed = {k for k, v in tr.model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(".lora_" in k and part_of(k) != "vision" for k in changed)


def test_adamw8bit_without_bitsandbytes_is_a_clear_error(tmp_path):
    pytest.importorskip  # noqa: B018 - documents that this test is about the missing package
    try:
        import bitsandbytes  # noqa: F401

        pytest.skip("bitsandbytes is installed")
    except ImportError:
        pass
    cfg = tiny_cfg("train.optimizer=adamw8bit")
    with pytest.raises(ValueError, match=r"pip install -e '\.\[bnb\]'"):
        Trainer(cfg, run_dir=tmp_path, dataset=FakeDataset(cfg))


def test_schedule_and_state_roundtrip():
    t = TrainConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, t) == pytest.approx(0.1) and lr_factor(9, t) == pytest.approx(1.0)
    assert lr_factor(10, t) == pytest.approx(1.0) and lr_factor(100, t) == pytest.approx(0.1)
    assert lr_factor(55, t) == pytest.approx(0.55)
    obj = {"a": {1: torch.arange(3), "x": (1.5, None, "s")}, "b": [torch.ones(2, 2), True]}
    skel, tensors = flatten(obj)
    back = unflatten(skel, tensors)
    assert torch.equal(back["a"][1], obj["a"][1]) and back["a"]["x"] == (1.5, None, "s")
    assert torch.equal(back["b"][0], obj["b"][0]) and back["b"][1] is True
    with pytest.raises(TypeError, match="no pickle"):
        flatten({"f": object()})


@pytest.mark.parametrize("tokenizer", ["bins", "fast"])
def test_token_head_trains_and_saves_its_action_tokenizer(tmp_path, tokenizer):
    cfg = tiny_cfg(
        "train.steps=2",
        "model.head=tokens",
        f"model.head_options.tokenizer={tokenizer}",
        "model.head_options.placement=new_rows",
        "data.norm.action=quantiles",
    )
    tr = Trainer(cfg, run_dir=tmp_path, dataset=FakeDataset(cfg))
    assert tr.model.head.tokenizer.action_dim == 6  # FakeDataset marks 6 of 8 action dims real
    out = tr.fit()
    assert all(torch.isfinite(torch.tensor(out["losses"])))
    final = tmp_path / "final"
    assert (final / "action_tokenizer").is_dir()
    loaded = VLA.from_pretrained(final).eval()
    tr.model.eval()
    batch = dummy_batch(cfg.model, 2, train=False)
    torch.testing.assert_close(loaded.sample_actions(batch), tr.model.sample_actions(batch))


def test_compile_failure_falls_back_to_eager_with_one_warning(tmp_path, capsys, monkeypatch):
    """train.compile on a machine where compiling fails (no C++ compiler): one warning, the
    model is eager again, and training goes on."""
    cfg = tiny_cfg("train.steps=2", "train.compile=true", "train.save_every=100")
    tr = Trainer(cfg, run_dir=tmp_path, dataset=FakeDataset(cfg))
    assert tr.model._compiled_call_impl is not None
    CppCompileError = type("CppCompileError", (RuntimeError,), {})  # as torch._inductor raises it
    real, calls = tr._train_step, []

    def step(micro, kw):
        calls.append(1)
        if len(calls) == 1:
            raise CppCompileError("C++ compile error: g++ not found")
        return real(micro, kw)

    monkeypatch.setattr(tr, "_train_step", step)
    out = tr.fit()
    assert out["steps"] == 2 and len(calls) == 3 and tr.model._compiled_call_impl is None
    err = capsys.readouterr()
    assert (err.out + err.err).count("train.compile: compiling failed (CppCompileError") == 1


def test_compile_removes_cached_kernels_cut_short(tmp_path, capsys, monkeypatch):
    """Kernel libraries left cut short in Inductor's cache by a killed build are deleted: the one
    the error names ("file too short"), after which the step compiles again in this run, and any
    other near-empty one (a CPU-feature probe's), which repairs the next run; a library outside
    the cache is never touched."""
    from vlastack.train.parallel import remove_corrupt_compile_artifacts, uncompile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    cut, probe, whole = (tmp_path / "cache" / d / f"c{d}.so" for d in ("r2", "3g", "ok"))
    for p, size in ((cut, 1000), (probe, 0), (whole, 1000)):
        p.parent.mkdir(parents=True)
        p.write_bytes(b"\x7fELF" + bytes(size))
    outside = tmp_path / "lib.so"
    outside.write_bytes(b"")
    CppCompileError = type("CppCompileError", (RuntimeError,), {})
    assert remove_corrupt_compile_artifacts(CppCompileError(f"ImportError: {outside}: file too short")) == (
        f"removed 1 cut-short cached kernel(s): {probe.resolve()}",
        False,
    )
    assert outside.exists() and not probe.exists() and whole.exists()

    cfg = tiny_cfg("train.steps=2", "train.compile=true", "train.save_every=100")
    tr = Trainer(cfg, run_dir=tmp_path / "run", dataset=FakeDataset(cfg))
    real, calls = tr._train_step, []

    def step(micro, kw):
        calls.append(1)
        if len(calls) == 1:
            raise CppCompileError(f"ImportError: {cut}: file too short")
        uncompile(tr.model)  # stands in for the rebuilt kernel: the test checks the retry, not Inductor
        return real(micro, kw)

    monkeypatch.setattr(tr, "_train_step", step)
    assert tr.fit()["steps"] == 2 and len(calls) == 3 and tr.compiled
    assert not cut.exists() and whole.exists()
    log = "".join(capsys.readouterr())
    assert (
        "note: train.compile: removed 1 cut-short cached kernel(s)" in log and "compiling failed" not in log
    )


@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path):
    """train.compile=true (the whole model, fullgraph) trains to the same losses as eager within
    fp32 reassociation noise; it does not change what is computed."""
    runs = {}
    for flag in ("false", "true"):
        cfg = tiny_cfg("train.steps=3", f"train.compile={flag}", "train.save_every=100")
        runs[flag] = Trainer(cfg, run_dir=tmp_path / flag, dataset=FakeDataset(cfg)).fit()["losses"]
    assert runs["true"] == pytest.approx(runs["false"], rel=1e-4), runs


def test_every_scalar_the_head_returns_is_logged(tmp_path):
    """Issue #36 item 4: the token head's ce, l1 and token_accuracy reach metrics.jsonl and the
    printed line, not only keys ending in _loss."""
    import json

    cfg = tiny_cfg("train.steps=2", "model.head=tokens", "model.head_options.decoding=parallel",
                   "model.head_options.regression_head=true", "train.save_every=100")  # fmt: skip
    Trainer(cfg, run_dir=tmp_path, dataset=FakeDataset(cfg)).fit()
    recs = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = next(r for r in reversed(recs) if "train/loss" in r)
    for k in ("train/ce", "train/l1", "train/token_accuracy"):
        assert k in last, sorted(last)
