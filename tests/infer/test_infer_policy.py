import numpy as np
import pytest
import torch

from tests.infer.conftest import ACTION_DIM, STATE_DIM, make_normalizer, make_obs, micro_config
from vlastack.infer.obs import ObsError, build_batch
from vlastack.infer.policy import Policy
from vlastack.models import build_model


@pytest.fixture(scope="module")
def policy(policy_dir):
    return Policy.from_pretrained(policy_dir, seed=0)


def test_from_pretrained_reads_dims_and_metadata(policy):
    md = policy.metadata
    assert (md["state_dim"], md["action_dim"]) == (STATE_DIM, ACTION_DIM)
    assert md["camera_names"] == ["scene", "wrist"] and md["image_size"] == 64
    out = policy.infer(make_obs())["actions"]
    assert out.dtype == np.float32 and out.shape == (16, ACTION_DIM) and np.isfinite(out).all()


def test_infer_unnormalizes_the_models_output(policy):
    obs = policy.check(make_obs(1))
    noise = torch.randn(1, 16, 8, generator=torch.Generator().manual_seed(3))
    got = policy.infer_checked([obs], noise=noise)[0]
    c = policy.cfg
    batch = build_batch([obs], policy.spec, c.state_dim, c.max_text_len, policy.tokenizer, policy.normalizer)
    assert torch.allclose(
        batch["state"][0, :STATE_DIM],
        torch.from_numpy((obs.state - np.arange(6, dtype=np.float32)) / 2),
        atol=1e-5,
    )
    assert (batch["state"][0, STATE_DIM:] == 0).all() and batch["image_mask"].tolist() == [[True, False]]
    norm = policy.model.sample_actions(batch, noise=noise)[0, :, :ACTION_DIM].numpy()
    np.testing.assert_allclose(got, norm * 2 + 1, atol=1e-5)  # quantiles [-1, 3] -> scale 2, shift 1


def test_missing_camera_is_masked_and_resizing(policy):
    obs = make_obs(2)
    a = policy.check(obs)
    other = dict(obs, images={**obs["images"], "wrist": np.zeros((10, 10, 3), np.uint8)})
    b = policy.check(other)
    c = policy.cfg
    ba = build_batch([a, b], policy.spec, c.state_dim, c.max_text_len, policy.tokenizer, policy.normalizer)
    assert ba["images"].shape == (2, 2, 3, 64, 64)
    assert ba["image_mask"].tolist() == [[True, False], [True, True]]
    noise = torch.randn(2, 16, 8)
    out = policy.infer_checked([a, b], noise=noise)
    assert not np.allclose(out[0], out[1])  # the wrist camera is seen when present


def test_flat_openpi_keys_and_chw_match_nested(policy):
    obs = make_obs(3)
    flat = {
        "observation/image": obs["images"]["scene"].transpose(2, 0, 1),
        "observation/state": obs["state"],
        "prompt": obs["prompt"],
    }
    noise = torch.randn(1, 16, 8)
    a = policy.infer_checked([policy.check(obs)], noise=noise)
    b = policy.infer_checked([policy.check(flat)], noise=noise)
    np.testing.assert_array_equal(a, b)


def test_infer_batch_matches_single(policy):
    obs = [make_obs(i) for i in range(3)]
    noise = torch.randn(3, 16, 8)
    batched = policy.infer_checked([policy.check(o) for o in obs], noise=noise)
    for i, o in enumerate(obs):
        single = policy.infer_checked([policy.check(o)], noise=noise[i : i + 1])[0]
        np.testing.assert_allclose(batched[i], single, atol=1e-5)
    assert len(policy.infer_batch(obs)) == 3


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"state": np.zeros(6, np.float32), "prompt": "x"}, "no image"),
        (
            {
                "images": {"cam9": np.zeros((8, 8, 3), np.uint8)},
                "state": np.zeros(6, np.float32),
                "prompt": "x",
            },
            "unknown camera",
        ),
        (
            {
                "images": {"scene": np.full((8, 8, 3), 2.0, np.float32)},
                "state": np.zeros(6, np.float32),
                "prompt": "x",
            },
            r"uint8 \(0..255\) or float32 in \[0, 1\], got dtype float32 with values \[2.0, 2.0\]",
        ),
        (
            {
                "images": {"scene": np.zeros((8, 8, 3), np.uint8)},
                "state": np.zeros(5, np.float32),
                "prompt": "x",
            },
            "shape",
        ),
        (
            {
                "images": {"scene": np.zeros((8, 8, 3), np.uint8)},
                "state": np.full(6, np.nan, np.float32),
                "prompt": "x",
            },
            "NaN",
        ),
        ({"images": {"scene": np.zeros((8, 8, 3), np.uint8)}, "state": np.zeros(6, np.float32)}, "prompt"),
        (
            {
                "images": {"scene": np.zeros((8, 8, 3), np.uint8)},
                "state": np.zeros(6, np.float32),
                "prompt": "x",
                "foo": 1,
            },
            "unknown",
        ),
    ],
)
def test_bad_observations_raise_with_reason(policy, bad, match):
    with pytest.raises(ObsError, match=match):
        policy.infer(bad)


def test_select_action_replans_and_ensembles():
    torch.manual_seed(0)
    pol = Policy(build_model(micro_config()), make_normalizer(), replan_steps=4)
    calls = []
    chunks = [np.full((16, ACTION_DIM), float(i), np.float32) for i in range(10)]
    pol.infer = lambda obs: calls.append(1) or {"actions": chunks[len(calls) - 1]}
    acts = [pol.select_action({})[0] for _ in range(9)]
    assert len(calls) == 3 and acts == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    pol.reset()
    pol.temporal_ensemble = 0.5
    calls.clear()
    for _ in range(5):
        a = pol.select_action({})
    w = np.exp(-0.5 * np.arange(2))  # at step 4 two chunks (values 0 and 1) cover the step
    assert np.isclose(a[0], (w * [0.0, 1.0]).sum() / w.sum())


def test_ema_and_missing_norm_stats(tmp_path):
    torch.manual_seed(0)
    m = build_model(micro_config())
    m.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="ema"):
        Policy.from_pretrained(tmp_path, ema=True)
    m.save_pretrained(tmp_path / "ema")
    pol = Policy.from_pretrained(tmp_path, ema=True)
    assert (pol.state_dim, pol.action_dim) == (8, 8)  # identity normalization: model dims
    obs = make_obs()
    obs["state"] = np.zeros(8, np.float32)
    assert pol.infer(obs)["actions"].shape == (16, 8)


def test_bf16_runs(policy_dir):
    pol = Policy.from_pretrained(policy_dir, dtype="bf16", seed=0)
    ref = Policy.from_pretrained(policy_dir, seed=0)
    a, b = pol.infer(make_obs())["actions"], ref.infer(make_obs())["actions"]
    assert a.dtype == np.float32 and np.abs(a - b).max() < 0.5


@pytest.mark.slow
def test_compiled_policy_matches_eager(policy_dir):
    eager = Policy.from_pretrained(policy_dir)
    compiled = Policy.from_pretrained(policy_dir, compile=True)
    obs = [eager.check(make_obs(i)) for i in range(2)]
    noise = torch.randn(2, 16, 8)
    np.testing.assert_allclose(
        compiled.infer_checked(obs, noise=noise), eager.infer_checked(obs, noise=noise), atol=1e-4
    )
