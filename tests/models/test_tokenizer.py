import numpy as np
import pytest

from vlastack.models.tokenizer import ByteTokenizer, load_tokenizer


def test_byte_tokenizer_round_trip_and_padding():
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 260
    ids, mask = tok.tokenize("pick up the red block", 32)
    assert ids.dtype == np.int64 and ids.shape == (32,) and mask.sum() == len("pick up the red block\n") + 1
    assert ids[0] == tok.bos_id and (ids[~mask] == tok.pad_id).all()
    assert tok.decode(ids[mask].tolist()) == "pick up the red block\n"
    ids, mask = tok.tokenize("x" * 100, 8)
    assert mask.all()


def test_tokenizer_json_folder(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.train_from_iterator(
        ["pick up the red block", "push the blue cube"] * 20,
        trainers.BpeTrainer(vocab_size=80, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"]),
    )
    t.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path))
    ids, mask = tok.tokenize("pick up the red block", 16)
    assert ids[0] == tok.bos_id == t.token_to_id("<bos>") and tok.pad_id == 0
    assert tok.decode(ids[1 : mask.sum()].tolist()).replace(" ", "") == "pickuptheredblock"


def test_sentencepiece_folder(tmp_path):
    import sentencepiece as spm

    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(["pick up the red block", "push the blue cube onto the green pad"] * 50))
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(tmp_path / "tokenizer"),
        vocab_size=24,
        bos_id=2,
        eos_id=1,
        pad_id=0,
        unk_id=3,
    )
    tok = load_tokenizer(str(tmp_path))
    ids, mask = tok.tokenize("push the blue cube", 48)
    assert ids[0] == 2 and tok.decode(ids[1 : mask.sum()].tolist()).strip() == "push the blue cube"


def test_missing_tokenizer_folder(tmp_path):
    with pytest.raises(ValueError, match="tokenizer"):
        load_tokenizer(str(tmp_path))
