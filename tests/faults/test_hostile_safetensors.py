"""Hostile or corrupt ``.safetensors`` headers are refused before anything is allocated, naming the
file and the tensor, on every reader: ``load_safetensors`` (vlastack folders, training state,
normalizers), ``open_safetensors`` and the LeRobot importer's own header reader (issue #34, items
11 and 12)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from vlastack.fileio import BadFileError, load_safetensors, open_safetensors, safetensors_header
from vlastack.models.convert.safetensors_io import read_header


def _write(path, header: dict, data: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


CASES = {
    "offsets_claim_1TiB": ({"w": {"dtype": "F32", "shape": [2**38], "data_offsets": [0, 2**40]}}, b"\0" * 16,
                           "outside the file"),
    "shape_disagrees_with_bytes": ({"w": {"dtype": "F32", "shape": [3, 3], "data_offsets": [0, 16]}}, b"\0" * 16,
                                   "is 36 bytes but its data_offsets span 16"),
    "dtype_disagrees_with_bytes": ({"w": {"dtype": "F64", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16,
                                   "is 32 bytes"),
    "unknown_dtype": ({"w": {"dtype": "Q7", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown dtype"),
    "negative_dim": ({"w": {"dtype": "U8", "shape": [-4], "data_offsets": [0, 4]}}, b"\0" * 4, "bad shape"),
    "overlap": ({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                 "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}}, b"\0" * 12, "overlapping tensors"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("reader", [load_safetensors, open_safetensors, read_header])
def test_hostile_header_is_refused_naming_file_and_tensor(tmp_path, case, reader):
    header, data, says = CASES[case]
    f = tmp_path / "model.safetensors"
    _write(f, header, data)
    with pytest.raises(BadFileError) as e:
        reader(f)
    msg = str(e.value)
    assert str(f) in msg and says in msg, msg
    if case != "overlap":
        assert "tensor 'w'" in msg


def test_truncated_file_and_garbage_name_the_file(tmp_path):
    good = tmp_path / "good.safetensors"
    save_file({"w": torch.zeros(300)}, str(good))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:1000])  # header intact, data cut short
    with pytest.raises(BadFileError, match=r"cut\.safetensors.*outside the file"):
        load_safetensors(cut)
    short = tmp_path / "short.safetensors"
    short.write_bytes(good.read_bytes()[:60])  # inside the header
    with pytest.raises(BadFileError, match=r"short\.safetensors.*truncated or corrupt"):
        load_safetensors(short)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(struct.pack("<Q", 20) + b"\xff" * 40)
    with pytest.raises(BadFileError, match=r"junk\.safetensors.*corrupt header"):
        load_safetensors(junk)
    assert safetensors_header(good)[1]["w"]["shape"] == [300]
    assert torch.equal(load_safetensors(good)["w"], torch.zeros(300))


@pytest.mark.parametrize("broken", ["policy_preprocessor.json", "tokenizer.model", "normalizer"])
def test_lerobot_folder_fails_before_reading_weights(tmp_path, broken):
    """Issue #34 item 13: a wrong processor, tokenizer or normalizer file is reported before the
    weights are read (a full-size folder spent 21-23 s reading 13.4 GB first)."""
    import json
    import shutil
    from pathlib import Path
    from unittest import mock

    from vlastack.infer.readers import load_parts

    src = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "pi05"
    folder = tmp_path / "pi05"
    shutil.copytree(src, folder)
    overrides = json.loads((src / "io.json").read_text())["overrides"]
    if broken == "normalizer":
        (folder / "policy_preprocessor_step_3_normalizer_processor.safetensors").write_bytes(b"\x10" * 40)
    elif broken == "tokenizer.model":
        (folder / "tokenizer.model").unlink()
    else:
        (folder / broken).write_text("{ not json")
    with (
        mock.patch(
            "vlastack.models.convert.lerobot.load_weights", side_effect=AssertionError("weights were read")
        ),
        pytest.raises(ValueError) as e,
    ):
        load_parts(folder, overrides)
    assert "weights were read" not in str(e.value) and str(folder) in str(e.value), e.value
