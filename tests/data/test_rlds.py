import numpy as np
import pytest

from vlastack.cli import main
from vlastack.data.lerobot import LeRobotDataset
from vlastack.data.rlds import convert_rlds_to_lerobot, iter_episodes, write_rlds
from vlastack.data.tfrecord import (
    crc32c,
    crc32c_py,
    encode_example,
    parse_example,
    parse_sequence_example,
    read_tfrecord,
    write_tfrecord,
)


def _episodes(n=3, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for e in range(n):
        t = 5 + e
        img = np.zeros((t, 24, 24, 3), np.uint8)
        img[:, :6, :6] = (np.arange(t) * 20 + e)[:, None, None, None]
        out.append({
            "images": {"image": img, "wrist_image": rng.integers(0, 255, (t, 16, 16, 3), dtype=np.uint8)},
            "state": rng.normal(size=(t, 7)).astype(np.float32),
            "action": rng.normal(size=(t, 4)).astype(np.float32),
            "instruction": f"open drawer {e}",
        })  # fmt: skip
    return out


def test_crc32c_known_values():
    assert crc32c_py(b"123456789") == 0xE3069283 == crc32c(b"123456789")
    assert crc32c_py(b"") == 0 and crc32c_py(bytes(32)) == 0x8A9136AA


def test_example_wire_format_roundtrip():
    ex = {"b": [b"x", b""], "f": np.array([1.5, -2.0], np.float32), "i": np.array([-3, 0, 2**40])}
    back = parse_example(encode_example(ex))
    assert back["b"] == [b"x", b""]
    np.testing.assert_array_equal(back["f"], ex["f"])
    np.testing.assert_array_equal(back["i"], ex["i"])
    # Unpacked int64 (wire type 0 per value) and a SequenceExample built by hand.
    unpacked_int = b"\x1a\x04" + b"\x08\x05\x08\x07"  # Feature{int64_list{value: 5, value: 7}}
    entry = b"\x0a\x01k" + b"\x12" + bytes([len(unpacked_int)]) + unpacked_int
    ex2 = b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
    assert parse_example(ex2)["k"].tolist() == [5, 7]
    flist = b"\x0a" + bytes([len(unpacked_int)]) + unpacked_int  # FeatureList{feature}
    fl_entry = b"\x0a\x01s" + b"\x12" + bytes([len(flist)]) + flist
    seq = b"\x12" + bytes([len(fl_entry) + 2]) + b"\x0a" + bytes([len(fl_entry)]) + fl_entry
    ctx, lists = parse_sequence_example(seq)
    assert ctx == {} and lists["s"][0].tolist() == [5, 7]


def test_tfrecord_crc_and_truncation(tmp_path):
    f = tmp_path / "x.tfrecord"
    write_tfrecord(f, [b"hello", b"world!"])
    assert list(read_tfrecord(f)) == [b"hello", b"world!"]
    raw = bytearray(f.read_bytes())
    raw[12 + 5 + 4 + 12 + 2] ^= 0xFF  # flip a byte in record 1's data
    f.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"x.tfrecord: record 1: data CRC mismatch"):
        list(read_tfrecord(f))
    raw[12 + 5 + 4 + 12 + 2] ^= 0xFF
    f.write_bytes(bytes(raw[:-3]))
    with pytest.raises(ValueError, match="record 1: truncated"):
        list(read_tfrecord(f))


@pytest.mark.parametrize("features_json", [True, False])
def test_rlds_read(tmp_path, features_json):
    eps = _episodes()
    write_rlds(tmp_path / "r", eps, shards=2, features_json=features_json)
    got = list(iter_episodes(tmp_path / "r"))
    assert len(got) == 3
    where, ep = got[2]
    assert "episode 0" in where  # third episode = first record of shard 2
    np.testing.assert_allclose(ep["steps/action"], eps[2]["action"])
    assert ep["steps/observation/state"].shape == (7, 7)
    assert ep["steps/language_instruction"][0] == b"open drawer 2"


def test_convert_cli(tmp_path, capsys):
    eps = _episodes()
    write_rlds(tmp_path / "r", eps, image_format="jpeg")
    assert (
        main(["data", "convert", "--from", "rlds", str(tmp_path / "r"), "--out", str(tmp_path / "lr")]) == 0
    )
    ds = LeRobotDataset(tmp_path / "lr")
    assert len(ds) == 5 + 6 + 7 and ds.tasks == ["open drawer 0", "open drawer 1", "open drawer 2"]
    assert sorted(ds.camera_keys) == ["observation.images.image", "observation.images.wrist_image"]
    it = ds[5 + 3]
    np.testing.assert_allclose(it["action"], eps[1]["action"][3], rtol=1e-6)
    assert abs(int(it["observation.images.image"][2, 2, 0]) - 61) <= 6  # jpeg + h264
    assert main(["data", "info", str(tmp_path / "lr")]) == 0
    assert "episodes 3  frames 18" in capsys.readouterr().out
    out = tmp_path / "sheet.png"
    assert main(["data", "view", str(tmp_path / "lr"), "--episode", "1", "--out", str(out)]) == 0
    from PIL import Image

    assert Image.open(out).size == (128 * 6, 128 * 2)
    assert (
        main(["data", "view", str(tmp_path / "lr"), "--episode", "0", "--out", str(tmp_path / "e.mp4")]) == 0
    )
    assert (tmp_path / "e.mp4").stat().st_size > 0


def test_convert_errors(tmp_path, capsys):
    eps = _episodes()
    eps[1]["action"] = np.zeros((6, 5), np.float32)  # shape mismatch between episodes
    write_rlds(tmp_path / "r", eps)
    with pytest.raises(ValueError, match=r"tfrecord-00000-of-00001: episode 1: steps/action has 30 values"):
        convert_rlds_to_lerobot(tmp_path / "r", tmp_path / "out")
    write_rlds(tmp_path / "r0", eps, features_json=False)  # shapes inferred: the writer catches it
    with pytest.raises(ValueError, match=r"episode 1: .*action has per-frame shape \(5,\), expected \(4,\)"):
        convert_rlds_to_lerobot(tmp_path / "r0", tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    shard = next((tmp_path / "r").glob("*.tfrecord*"))
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0x55
    shard.write_bytes(bytes(raw))
    assert (
        main(["data", "convert", "--from", "rlds", str(tmp_path / "r"), "--out", str(tmp_path / "o2")]) == 2
    )
    assert "CRC mismatch" in capsys.readouterr().err
    write_rlds(tmp_path / "r3", _episodes(1))
    with pytest.raises(ValueError, match="missing key 'steps/observation/joint'"):
        convert_rlds_to_lerobot(tmp_path / "r3", tmp_path / "o3", state_key="steps/observation/joint")
