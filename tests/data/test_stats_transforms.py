import numpy as np
import pytest
import torch

from vlastack.data.stats import Normalizer, RunningStats, exact_stats
from vlastack.data.transforms import augment, color_jitter, random_resized_crop, resize


def test_running_stats_match_exact():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(3, 2, (5000, 3)), rng.uniform(-50, 90, (5000, 3))])
    x[:, 2] = 7.0  # zero-variance dim
    rs = RunningStats([3], bins=4096)
    for chunk in np.array_split(rng.permutation(x), 17):  # range grows several times
        rs.update(chunk)
    got, ref = rs.result(), exact_stats(x)
    for k in ("mean", "std", "min", "max"):
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-9, atol=1e-9)
    span = x.max(0) - x.min(0)
    for q in ("q01", "q10", "q50", "q90", "q99"):
        assert (np.abs(got[q] - ref[q]) <= 2 * span / 4096 + 1e-9).all(), q
    assert got["q50"][2] == 7.0 and got["count"][0] == 10000


@pytest.mark.parametrize("mode", ["mean_std", "min_max", "quantiles", "identity"])
def test_normalizer_inverse(mode):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1000, 4)) * [1, 10, 0.1, 0]
    st = exact_stats(x)
    n = Normalizer({"action": st}, {"action": mode})
    lo, hi = st["q01"], st["q99"]
    inside = np.clip(x, lo, hi) if mode == "quantiles" else x
    y = n.normalize("action", inside)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(n.unnormalize("action", y), inside, atol=1e-9)
    if mode == "quantiles":
        assert np.abs(n.normalize("action", x * 100)).max() <= 1.0
    t = torch.tensor(inside, dtype=torch.float64)
    np.testing.assert_allclose(n.normalize("action", t).numpy(), y, atol=1e-9)
    n2 = Normalizer.from_dict(n.to_dict())
    np.testing.assert_allclose(n2.normalize("action", inside), y)


def test_normalizer_errors():
    with pytest.raises(ValueError, match="must be one of"):
        Normalizer({}, {"action": "zscore"})
    with pytest.raises(ValueError, match="no statistics"):
        Normalizer({}, {"action": "mean_std"})


def test_transforms_uint8_shapes_and_determinism():
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (2, 3, 3, 40, 48), dtype=torch.uint8, generator=g)
    r = resize(img, 32)
    assert r.shape == (2, 3, 3, 32, 32) and r.dtype == torch.uint8
    flat = torch.full((1, 3, 8, 8), 100, dtype=torch.uint8)
    assert (resize(flat, (4, 4)) == 100).all()
    c1 = random_resized_crop(img, (0.5, 1.0), size=24, generator=torch.Generator().manual_seed(1))
    c2 = random_resized_crop(img, (0.5, 1.0), size=24, generator=torch.Generator().manual_seed(1))
    assert c1.shape == (2, 3, 3, 24, 24) and torch.equal(c1, c2)
    full = random_resized_crop(img, (1.0, 1.0))
    assert (full.int() - img.int()).abs().max() <= 1  # scale 1 = identity crop
    j = color_jitter(img, 0.3, generator=torch.Generator().manual_seed(2))
    assert j.dtype == torch.uint8 and not torch.equal(j, img)
    assert torch.equal(augment(img), img)
    with pytest.raises(ValueError, match=r"\[..., 3, H, W\]"):
        resize(torch.zeros(4, 5, 6, dtype=torch.uint8), 3)


def test_crop_moves_the_attention_targets_with_the_pixels():
    """A random crop shifts and scales the image under the attention supervision's (u, v)
    targets; augment(..., uv=) moves them with the first camera's crop, so each target still
    names the pixel of its point."""
    from vlastack.data.transforms import augment

    b, size = 16, 64
    gen = torch.Generator().manual_seed(0)
    uv = torch.rand(b, 4, generator=gen) * 0.6 + 0.2  # two points per sample, inside the image
    img = torch.zeros(b, 2, 3, size, size, dtype=torch.uint8)
    for i in range(b):  # a bright 3x3 dot at the first point, in camera 0 only
        x, y = int(uv[i, 0] * size), int(uv[i, 1] * size)
        img[i, 0, :, y - 1 : y + 2, x - 1 : x + 2] = 255
    out, moved = augment(img, 0.6, 0.0, generator=gen, uv=uv)
    assert moved.shape == uv.shape and not torch.allclose(moved, uv)
    for i in range(b):
        heat = out[i, 0, 0].float()
        y, x = divmod(int(heat.argmax()), size)
        assert (
            abs((x + 0.5) / size - moved[i, 0]) <= 2.5 / size
            and abs((y + 0.5) / size - moved[i, 1]) <= 2.5 / size
        )
    _, kept = augment(img, 1.0, 0.3, generator=gen, uv=uv)  # no crop: the targets stay
    assert torch.equal(kept, uv)
