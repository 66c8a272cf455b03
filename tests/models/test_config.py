import pickle

import pytest

from vlastack.config import ConfigError, from_dict, load_config, load_yaml, save_yaml, to_dict


def test_presets_build_and_round_trip_yaml(tmp_path):
    for name in ("tiny", "small", "pi0"):
        cfg = load_config(name)
        save_yaml(cfg, tmp_path / f"{name}.yaml")
        assert load_yaml(tmp_path / f"{name}.yaml") == cfg
        assert from_dict(to_dict(cfg)) == cfg


def test_packaged_tiny_recipes_load_and_round_trip(tmp_path):
    """The packaged recipes written on top of the tiny preset (``vla train --config NAME``) are valid
    config trees (unknown keys and bad values would raise) that survive a YAML round trip."""
    for name in ("demo", "demo_tokens", "demo_oft", "metaworld_mt10", "metaworld_mt50", "libero_object"):
        cfg = load_config("tiny", name)
        save_yaml(cfg, tmp_path / f"{name}.yaml")
        assert load_yaml(tmp_path / f"{name}.yaml") == cfg, name
    lib = load_config("tiny", "libero_object")
    assert lib.model.camera_names == ("image", "image2") and lib.eval.suite == "libero_object"
    assert lib.model.grounding.points == 0 and lib.eval.image_size == lib.model.vision.image_size == 128


def test_pi0_preset_has_the_exact_shapes():
    m = load_config("pi0").model
    assert (m.vision.width, m.vision.depth, m.vision.heads, m.vision.mlp_dim, m.vision.num_patches) == (
        1152, 27, 16, 4304, 256,
    )  # fmt: skip
    assert (m.vlm.width, m.vlm.depth, m.vlm.heads, m.vlm.kv_heads, m.vlm.head_dim, m.vlm.mlp_dim) == (
        2048, 18, 8, 1, 256, 16384,
    )  # fmt: skip
    assert m.vlm.vocab_size == 257152
    assert (m.expert.width, m.expert.mlp_dim, m.expert.depth) == (1024, 4096, 18)
    assert (m.action_horizon, m.action_dim, m.num_cameras, m.max_text_len) == (50, 32, 3, 48)


def test_dotted_overrides_apply_and_coerce():
    cfg = load_config(
        "tiny", overrides=["model.expert.mlp_dim=96", "train.lr=1e-4", "model.camera_names=[a,b,c]"]
    )
    assert cfg.model.expert.mlp_dim == 96
    assert cfg.train.lr == 1e-4 and isinstance(cfg.train.lr, float)
    assert cfg.model.camera_names == ("a", "b", "c")


def test_yaml_on_top_of_preset(tmp_path):
    (tmp_path / "x.yaml").write_text("train:\n  steps: 7\nmodel:\n  action_horizon: 12\n")
    cfg = load_config("tiny", tmp_path / "x.yaml", ["train.steps=9"])
    assert cfg.train.steps == 9 and cfg.model.action_horizon == 12
    assert cfg.model.vision.image_size == 64  # untouched keys keep the preset's values


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.expert.deptth=6", "model.expert.deptth"),
        ("model.expert.depth=6", "model.expert.depth"),
        ("train.precision=fp8", "train.precision"),
        ("train.lr=fast", "train.lr"),
        ("model.vision.image_size=65", "model.vision.image_size"),
        ("train.batch_size=0", "train.batch_size"),
        ("model.head=diffusion", "model.head"),
        ("data.num_workers=true", "data.num_workers"),
        ("nosuchsection.x=1", "nosuchsection"),
    ],
)
def test_bad_keys_and_values_name_the_key(override, key):
    with pytest.raises(ValueError) as e:
        load_config("tiny", overrides=[override])
    assert isinstance(e.value, ConfigError)
    assert e.value.key == key, str(e.value)
    assert str(e.value).startswith(key)
    # Eval and data workers send errors back by pickle; the key and message must survive it.
    back = pickle.loads(pickle.dumps(e.value))
    assert isinstance(back, ConfigError) and (back.key, str(back)) == (key, str(e.value))


def test_unknown_yaml_key_is_rejected(tmp_path):
    (tmp_path / "bad.yaml").write_text("model:\n  vision:\n    widht: 3\n")
    with pytest.raises(ValueError, match=r"model\.vision\.widht"):
        load_config("tiny", tmp_path / "bad.yaml")


def test_unknown_preset():
    with pytest.raises(ValueError, match="preset"):
        load_config("huge")


def test_grounding_on_a_head_without_a_grounded_variant_is_refused(monkeypatch):
    """Issue #36 item 2: a head with no grounded class is refused at config time, not silently
    built as the grounded flow head."""
    import dataclasses

    import pytest as _pytest

    from vlastack.config import HEAD_SPECS

    monkeypatch.setitem(HEAD_SPECS, "tokens", dataclasses.replace(HEAD_SPECS["tokens"], grounded=None))
    with _pytest.raises(ValueError, match="head 'tokens' does not take the grounding add-on"):
        load_config("tiny", overrides=["model.head=tokens", "model.grounding.points=2",
                                       "model.head_options.state_input=continuous"])  # fmt: skip


def test_head_without_a_compilable_decode_step_warns(monkeypatch):
    """Issue #36 item 3: Policy(compile=True) on a head without a compilable decode step is a
    one-line warning, not a silent no-op."""
    import pytest as _pytest

    from vlastack.infer.policy import Policy
    from vlastack.models.heads.base import HeadBase
    from vlastack.models.vla import build_model

    with _pytest.warns(UserWarning, match="HeadBase has no compile_decoding"):
        HeadBase().compile_decoding()
    model = build_model(load_config("tiny").model)
    # a head without its own compile_decoding: HeadBase's, which warns
    monkeypatch.setattr(type(model.head), "compile_decoding", HeadBase.compile_decoding)
    with _pytest.warns(UserWarning, match="FlowHead has no compile_decoding"):
        Policy(model, compile=True)
