"""Action tokenizers: bins and FAST round trips, LM id placement, determinism, invalid sequences."""

from __future__ import annotations

import numpy as np
import pytest

from vlastack.config import TokenHeadConfig
from vlastack.models.action_tokens import (
    ActionTokenizer,
    BinTokenizer,
    TokenPlacement,
    load_action_tokenizer,
    make_action_tokenizer,
)
from vlastack.models.action_tokens.fast import FastTokenizer, dct_matrix, fast_error_bound

H, A = 16, 4
VOCAB = 2000
SPECIALS = [0, 1, 2, 3]


def smooth_chunks(n: int, horizon: int = H, dim: int = A, seed: int = 0) -> np.ndarray:
    """Sums of two low-frequency sines per dim, in [-0.9, 0.9]: [n, horizon, dim]."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, horizon)[None, :, None]
    out = np.zeros((n, horizon, dim))
    for _ in range(2):
        f = rng.uniform(0.1, 1.0, (n, 1, dim))
        ph = rng.uniform(0, 2 * np.pi, (n, 1, dim))
        out += rng.uniform(0.1, 0.45, (n, 1, dim)) * np.sin(2 * np.pi * f * t + ph)
    return out


def fast(
    placement: str = "new_rows", data: np.ndarray | None = None, vocab: int = VOCAB, **kw
) -> FastTokenizer:
    cfg = TokenHeadConfig(
        tokenizer="fast", placement=placement, fast_vocab_size=kw.pop("fast_vocab_size", 512)
    )
    tok = make_action_tokenizer(cfg, vocab, H, A, kw.pop("specials", SPECIALS))
    return tok.fit(smooth_chunks(300) if data is None else data)


def bins(placement: str = "overwrite_last", vocab: int = VOCAB, specials=SPECIALS) -> BinTokenizer:
    return make_action_tokenizer(TokenHeadConfig(placement=placement), vocab, H, A, specials)


# ----------------------------------------------------------------------------- bins


def test_bins_round_trip_within_half_bin() -> None:
    tok = bins()
    x = np.random.default_rng(1).uniform(-1, 1, (64, H, A))
    x[0, 0, :] = [-1.0, 1.0, 0.0, 1.0 - 1e-9]  # edges land in the outermost bins
    ids = tok.encode_batch(x)
    assert all(len(t) == H * A == tok.fixed_length for t in ids)
    dec, valid = tok.decode_batch(np.stack(ids))
    assert valid.all() and dec.dtype == np.float32
    assert np.abs(dec - x).max() <= 1 / 256 + 1e-6
    # Bin centers are fixed points; out-of-range values clip to the edge bins.
    centers = -1 + (np.arange(256) + 0.5) / 128
    c = centers[np.random.default_rng(2).integers(0, 256, (H, A))]
    np.testing.assert_allclose(tok.decode(tok.encode(c))[0], c, atol=1e-6)
    over = np.full((H, A), 3.0)
    np.testing.assert_array_equal(tok.encode(over), tok.encode(np.ones((H, A))))
    assert len(np.unique(tok.encode_batch(x)[1:])) > 200  # all of the range is used


def test_bins_wrong_length_or_foreign_id_is_invalid() -> None:
    tok = bins()
    ids = tok.encode(smooth_chunks(1)[0])
    chunk, ok = tok.decode(ids[:-1])
    assert not ok and chunk.shape == (H, A)
    assert not tok.decode(np.concatenate([ids, ids[:1]]))[1]
    bad = ids.copy()
    bad[5] = 10  # a text token, not an action bin
    assert not tok.decode(bad)[1]
    with pytest.raises(ValueError, match="full"):
        tok.decode(bad, strict=True)


# ----------------------------------------------------------------------------- placement


def test_placement_ranges() -> None:
    ow = TokenPlacement("overwrite_last", 256, VOCAB, SPECIALS)
    assert ow.ids[0] == VOCAB - 1 and set(ow.ids.tolist()) == set(range(VOCAB - 256, VOCAB))
    assert ow.required_vocab_size == VOCAB
    new = TokenPlacement("new_rows", 256, VOCAB, SPECIALS)
    assert new.ids.tolist() == list(range(VOCAB, VOCAB + 256)) and new.required_vocab_size == VOCAB + 256
    # openpi: specials are the top 128 ids, action token t -> vocab - 1 - 128 - t.
    top = list(range(VOCAB - 128, VOCAB))
    sk = TokenPlacement("skip_special", 256, VOCAB, top)
    assert sk.ids.tolist() == [VOCAB - 1 - 128 - t for t in range(256)]
    # Scattered specials are skipped and the ids stay the highest free ones.
    scattered = [VOCAB - 1, VOCAB - 7, VOCAB - 100, 5]
    sk2 = TokenPlacement("skip_special", 256, VOCAB, scattered)
    assert not set(sk2.ids.tolist()) & set(scattered) and len(set(sk2.ids.tolist())) == 256
    assert sk2.ids.min() == VOCAB - 256 - 3
    for p in (ow, new, sk, sk2):
        np.testing.assert_array_equal(p.from_lm(p.to_lm(np.arange(256))), np.arange(256))
        assert (p.from_lm(np.array([-1, 7, 10**9])) == -1).all()


def test_placement_refuses_unsafe_layouts() -> None:
    with pytest.raises(ValueError, match="skip_special"):
        TokenPlacement("overwrite_last", 256, VOCAB, [VOCAB - 3])
    with pytest.raises(ValueError, match="new_rows"):
        TokenPlacement("overwrite_last", 256, 100, [])
    with pytest.raises(ValueError, match="new_rows"):
        TokenPlacement("skip_special", 256, 258, [0, 1, 2])
    with pytest.raises(ValueError, match="placement"):
        TokenPlacement("middle", 256, VOCAB, [])


@pytest.mark.parametrize("kind", ["bins", "fast"])
@pytest.mark.parametrize("placement", ["overwrite_last", "skip_special", "new_rows"])
def test_encoded_ids_in_range_and_not_special(kind: str, placement: str) -> None:
    specials = [0, 1, 2, VOCAB - 2] if placement == "skip_special" else SPECIALS
    tok = bins(placement, specials=specials) if kind == "bins" else fast(placement, specials=specials)
    x = smooth_chunks(40, seed=3)
    ids = np.concatenate(tok.encode_batch(x))
    assert not np.isin(ids, specials).any()
    assert np.isin(ids, tok.action_token_ids).all()
    assert ids.min() >= 0 and ids.max() < tok.required_vocab_size
    if placement == "new_rows":
        assert ids.min() >= VOCAB
    else:
        assert ids.max() < VOCAB and tok.required_vocab_size == VOCAB
    dec, valid = tok.decode_batch(*_pad(tok.encode_batch(x)))
    assert valid.all() and np.abs(dec - x).max() < 0.2


# ----------------------------------------------------------------------------- FAST


def _pad(seqs: list[np.ndarray], pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(s) for s in seqs])
    out = np.full((len(seqs), lengths.max()), pad, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out, lengths


def test_dct_matrix_is_orthonormal_dct2() -> None:
    d = dct_matrix(H)
    np.testing.assert_allclose(d @ d.T, np.eye(H), atol=1e-12)
    x = np.random.default_rng(0).normal(size=H)
    assert np.isclose((d @ x)[0], x.sum() / np.sqrt(H))
    assert fast_error_bound(H, 10.0) <= 0.5 * np.sqrt(H) / 10.0 + 1e-12


@pytest.mark.parametrize("scale", [10.0, 50.0])
def test_fast_round_trip_bounded_by_quantization(scale: float) -> None:
    cfg = TokenHeadConfig(tokenizer="fast", placement="new_rows", fast_scale=scale, fast_vocab_size=512)
    tok = make_action_tokenizer(cfg, VOCAB, H, A, SPECIALS).fit(smooth_chunks(300))
    # Held-out smooth chunks and white noise (never seen in fit: the alphabet still covers it).
    for x in (smooth_chunks(50, seed=7), np.random.default_rng(8).uniform(-1, 1, (20, H, A))):
        dec, valid = tok.decode_batch(*_pad(tok.encode_batch(x)))
        assert valid.all()
        err = dec - x
        assert np.abs(err).max() <= fast_error_bound(H, scale) + 1e-6
        assert np.sqrt((err**2).mean(axis=1)).max() <= 0.5 / scale + 1e-6  # per-dim RMS over time
    assert np.abs(err).max() > 0  # quantization is lossy: the bound is being exercised


def test_fast_compresses_smooth_chunks() -> None:
    tok = fast()
    x = smooth_chunks(100, seed=11)
    n_fast = np.mean([len(t) for t in tok.encode_batch(x)])
    ratio = H * A / n_fast
    print(f"FAST {n_fast:.1f} tokens vs {H * A} bin tokens per chunk: ratio {ratio:.2f}")
    assert ratio > 2.0


def test_fast_fit_is_deterministic(tmp_path) -> None:
    data = smooth_chunks(300)
    fast(data=data).save(tmp_path / "a")
    # Same data as an iterable of single chunks: same merges.
    fast(data=iter(list(data))).save(tmp_path / "b")
    fast(data=smooth_chunks(300, seed=5)).save(tmp_path / "c")
    for name in ("action_tokenizer.json", "fast_bpe.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "fast_bpe.json").read_bytes() != (tmp_path / "c" / "fast_bpe.json").read_bytes()


def test_fast_invalid_sequences_never_silent() -> None:
    tok = fast("skip_special")
    x = smooth_chunks(1, seed=4)[0]
    ids = tok.encode(x)
    assert len(ids) > 1
    cases = {
        "truncated": ids[:-1],
        "extra": np.concatenate([ids, ids[-1:]]),
        "empty": ids[:0],
        "text token": np.concatenate([[7], ids[1:]]),
    }
    unused = np.setdiff1d(tok.action_token_ids, tok.placement.to_lm(np.arange(tok.bpe_vocab_size)))
    if unused.size:  # reserved for the configured BPE size but not learned
        cases["unused"] = np.concatenate([ids, unused[:1]])
    for name, seq in cases.items():
        chunk, ok = tok.decode(seq)
        assert not ok and chunk.shape == (H, A) and not chunk.any(), name  # flagged, never executed
        with pytest.raises(ValueError, match="full"):
            tok.decode(seq, strict=True)
    padded, lengths = _pad([ids, ids[:-1], ids], pad=ids[0])
    dec, valid = tok.decode_batch(padded, lengths)
    assert valid.tolist() == [True, False, True]
    np.testing.assert_array_equal(dec[0], tok.decode(ids)[0])
    with pytest.raises(ValueError, match="lengths"):
        tok.decode_batch(padded, np.array([1, 2]))


def test_fast_errors_are_actionable() -> None:
    cfg = TokenHeadConfig(tokenizer="fast", placement="new_rows", fast_vocab_size=64)
    with pytest.raises(ValueError, match="fast_vocab_size"):
        make_action_tokenizer(cfg, VOCAB, 50, A, SPECIALS)
    tok = make_action_tokenizer(
        TokenHeadConfig(tokenizer="fast", placement="new_rows"), VOCAB, H, A, SPECIALS
    )
    assert tok.required_vocab_size == VOCAB + 1024  # known before fitting
    with pytest.raises(ValueError, match="not fitted"):
        tok.encode(np.zeros((H, A)))
    with pytest.raises(ValueError, match=r"\[N, 16, 4\]"):
        tok.fit(np.zeros((3, H, A + 1)))
    with pytest.raises(ValueError, match="NaN"):
        tok.fit(np.full((3, H, A), np.nan))


# ----------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("kind", ["bins", "fast"])
def test_save_load_round_trip(kind: str, tmp_path) -> None:
    tok = bins("skip_special") if kind == "bins" else fast("overwrite_last")
    tok.save(tmp_path)
    assert not list(tmp_path.glob("*.pkl"))
    loaded = load_action_tokenizer(tmp_path)
    assert type(loaded) is type(tok) and ActionTokenizer.load(tmp_path).kind == kind
    x = smooth_chunks(20, seed=9)
    for a, b in zip(tok.encode_batch(x), loaded.encode_batch(x), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(tok.decode(a)[0], loaded.decode(b)[0])
    np.testing.assert_array_equal(tok.action_token_ids, loaded.action_token_ids)
    other = FastTokenizer if kind == "bins" else BinTokenizer
    with pytest.raises(ValueError, match="not"):
        other.load(tmp_path)
    with pytest.raises(ValueError, match="saved"):
        load_action_tokenizer(tmp_path / "missing")
