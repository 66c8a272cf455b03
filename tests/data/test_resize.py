"""``vla data resize``: a copy whose video frames are exactly ``fit_image`` of the originals (up to
the lossless codec's RGB->YUV rounding), everything else unchanged; bad input and failures leave
nothing behind."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.data.conftest import write_dataset
from vlastack.data.check import check_dataset
from vlastack.data.reader import LeRobotDataset
from vlastack.data.transforms import fit_image

SCENE = "observation.images.scene"


def _fit(img: np.ndarray, size: int) -> np.ndarray:
    return fit_image(torch.from_numpy(img).permute(2, 0, 1), size).permute(1, 2, 0).numpy()


def test_resized_copy_holds_fit_image_of_every_frame(tmp_path):
    from vlastack.cli import main

    src, dst = tmp_path / "ds", tmp_path / "ds16"
    write_dataset(src)
    assert main(["data", "resize", str(src), "--size", "16", "--out", str(dst)]) == 0
    info = json.loads((dst / "meta/info.json").read_text())
    assert info["features"][SCENE]["shape"] == [16, 16, 3]
    assert info["features"][SCENE]["info"]["video.pix_fmt"] == "yuv444p"
    assert info["features"]["observation.images.wrist"]["shape"] == [16, 16, 3]  # an image feature: as it was
    a, b = LeRobotDataset(src, image_size=None), LeRobotDataset(dst, image_size=None)
    assert len(a) == len(b) and a.num_episodes == b.num_episodes
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert y[SCENE].shape == (16, 16, 3)
        err = np.abs(_fit(x[SCENE], 16).astype(int) - y[SCENE].astype(int))
        assert err.max() <= 2, (i, err.max())  # lossless H.264 up to the RGB<->YUV rounding
        for k in ("timestamp", "action", "observation.state", "observation.images.wrist"):
            np.testing.assert_array_equal(np.asarray(x[k]), np.asarray(y[k]))
    assert not [f for f in check_dataset(dst) if f.level == "error"]
    assert not (tmp_path / "ds16.tmp").exists()


def test_bad_arguments_and_failures_leave_nothing(tmp_path, monkeypatch):
    from vlastack.data import resize as mod

    src = tmp_path / "ds"
    write_dataset(src, lengths=(5,))
    with pytest.raises(ValueError, match="size must be"):
        mod.resize_dataset(src, tmp_path / "a", 4)
    with pytest.raises(ValueError, match="exists"):
        mod.resize_dataset(src, src, 16)

    def broken(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(mod, "resize_video", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        mod.resize_dataset(src, tmp_path / "b", 16)
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.tmp").exists()
