import numpy as np
import pytest
import torch

from vlastack.batch import validate_batch
from vlastack.config import load_config
from vlastack.data.loader import batch_to_device, build_dataloader
from vlastack.data.samples import StreamingDataset, VLADataset, make_dataset
from vlastack.data.stats import Normalizer


def _cfg(*extra):
    return load_config("tiny", overrides=["model.camera_names=[scene,wrist,top]", *extra])


def test_sample_format(dataset):
    root, _data = dataset
    cfg = _cfg()
    ds = make_dataset(cfg, root)
    s = ds[12 + 18]
    assert s["images"].shape == (3, 3, 64, 64) and s["images"].dtype == torch.uint8
    assert s["image_mask"].tolist() == [True, True, False] and s["images"][2].sum() == 0
    assert s["actions"].shape == (16, 8) and s["action_dim_mask"].tolist() == [True] * 3 + [False] * 5
    assert s["action_is_pad"][:2].tolist() == [False, False] and s["action_is_pad"][2:].all()
    assert (s["actions"][2:] == 0).all() and (s["actions"][:, 3:] == 0).all() and (s["state"][5:] == 0).all()
    raw = ds.normalizer.unnormalize("action", s["actions"][:2, :3].numpy())
    np.testing.assert_allclose(raw[:, 0], [1018, 1019], rtol=1e-5)
    assert s["token_mask"].sum() == len("task 1\n") + 1  # bytes + BOS
    batch = next(iter(build_dataloader(ds, cfg, batch_size=4, num_workers=0)))
    assert validate_batch(batch_to_device(batch, "cpu"), cfg.model, train=True) == 4


def test_dataloader_workers(dataset):
    root, _ = dataset
    cfg = _cfg("data.num_workers=2")
    ds = VLADataset(cfg, root, return_index=True)
    seen = []
    for b in build_dataloader(ds, cfg, batch_size=8, drop_last=False):
        validate_batch(b, cfg.model, train=True)
        seen += b["index"].tolist()
    assert sorted(seen) == list(range(41))


def test_missing_camera_and_dims(dataset):
    root, _ = dataset
    with pytest.raises(ValueError, match="none of the model's cameras"):
        VLADataset(_cfg("model.camera_names=[left]"), root)
    with pytest.raises(ValueError, match=r"model\.action_dim"):
        VLADataset(_cfg("model.action_dim=2"), root)
    with pytest.raises(ValueError, match=r"observation\.environment_state"):
        VLADataset(_cfg("model.grounding.points=2"), root)  # a grounding model needs the targets


def test_streaming_exactly_once(dataset):
    root, _ = dataset
    cfg = _cfg("data.streaming=true", "data.shuffle_buffer=4")
    base = VLADataset(cfg, root, return_index=True)
    orders = {}
    for epoch in (0, 1):
        seen = []
        for rank in range(2):
            ds = StreamingDataset(base, shuffle_buffer=4, seed=3, rank=rank, world_size=2)
            ds.set_epoch(epoch)
            loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=3, persistent_workers=True)
            got = [i for b in loader for i in b["index"].tolist()]
            assert len(got) == len(ds)
            seen += got
        assert sorted(seen) == list(range(41)), "duplicates or gaps across 2 ranks x 3 workers"
        orders[epoch] = seen
    assert orders[0] != orders[1]  # reseeded per epoch
    again = StreamingDataset(base, shuffle_buffer=4, seed=3, rank=0, world_size=2)
    assert len({int(s["index"]) for s in again}) == len(again) == 20  # rank 0 alone, no workers
    assert isinstance(make_dataset(cfg, root), StreamingDataset)


def test_streaming_deterministic(dataset):
    root, _ = dataset
    base = VLADataset(_cfg(), root, return_index=True)
    a = [int(s["index"]) for s in StreamingDataset(base, shuffle_buffer=8, seed=1)]
    b = [int(s["index"]) for s in StreamingDataset(base, shuffle_buffer=8, seed=1)]
    c = [int(s["index"]) for s in StreamingDataset(base, shuffle_buffer=8, seed=2)]
    assert a == b and a != c and sorted(a) == list(range(41))


def test_normalizer_roundtrip_from_dataset(dataset, tmp_path):
    root, _ = dataset
    ds = VLADataset(_cfg("data.norm.action=quantiles"), root)
    ds.normalizer.save(tmp_path / "norm_stats.json")
    n2 = Normalizer.load(tmp_path / "norm_stats.json")
    x = np.array([[5.0, 5.0, 5.0]], np.float32)
    np.testing.assert_allclose(n2.normalize("action", x), ds.normalizer.normalize("action", x))


def test_set_epoch_reaches_persistent_workers(dataset):
    root, _ = dataset
    ds = StreamingDataset(VLADataset(_cfg(), root, return_index=True), shuffle_buffer=4, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=41, num_workers=2, persistent_workers=True)
    first = torch.cat([b["index"] for b in loader]).tolist()
    ds.set_epoch(1)
    second = torch.cat([b["index"] for b in loader]).tolist()
    assert sorted(first) == sorted(second) == list(range(41)) and first != second


def test_training_images_are_resized_as_policy_resizes_them(dataset):
    """A training sample's image is the stored frame resized exactly as ``Policy`` resizes a live
    frame (``fit_image``: antialiased bilinear), not by the video decoder's own scaler."""
    from vlastack.data.reader import LeRobotDataset
    from vlastack.data.transforms import fit_image

    root, _ = dataset
    ds = make_dataset(_cfg("model.vision.image_size=24", "model.vision.patch_size=8"), root)
    native = LeRobotDataset(root)
    for i in (0, 20):
        frame = torch.from_numpy(native.image("observation.images.scene", i)).permute(2, 0, 1)
        assert torch.equal(ds[i]["images"][0], fit_image(frame, 24))
