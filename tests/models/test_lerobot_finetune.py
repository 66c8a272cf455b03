"""Fine-tuning an imported LeRobot checkpoint on a LeRobot v3 dataset, then serving the result.

The checkpoint is the tiny real-`lerobot` pi0 fixture (tests/fixtures/lerobot/pi0: state 6 dims,
action 7, cameras base_0_rgb + left_wrist_0_rgb, images 24x40); the dataset is written with our
LeRobot v3 writer with the same robot's features (only the base camera recorded).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from vlastack.config import ConfigError, apply_overrides, load_yaml
from vlastack.data.lerobot import LeRobotWriter
from vlastack.data.samples import VLADataset
from vlastack.data.stats import ExactNormalizer, Normalizer, load_normalizer
from vlastack.data.transforms import fit_image, resize_with_pad
from vlastack.infer.importer import import_checkpoint
from vlastack.infer.policy import Policy
from vlastack.train.trainer import Trainer

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "pi0"


def _write_dataset(root: Path, state_dim: int = 6, action_dim: int = 7, camera: str = "base_0_rgb") -> Path:
    features = {
        f"observation.images.{camera}": {"dtype": "image", "shape": [24, 40, 3], "names": None},
        "observation.state": {"dtype": "float32", "shape": [state_dim], "names": None},
        "action": {"dtype": "float32", "shape": [action_dim], "names": None},
    }
    rng = np.random.default_rng(0)
    w = LeRobotWriter(root, fps=10, features=features, robot_type="test")
    for ep in range(2):
        t = 10
        w.add_episode(
            {
                f"observation.images.{camera}": rng.integers(0, 255, (t, 24, 40, 3), dtype=np.uint8),
                "observation.state": rng.normal(3.0, 2.0, (t, state_dim)).astype(np.float32),
                "action": rng.normal(-1.0, 0.5, (t, action_dim)).astype(np.float32),
            },
            task=f"pick up block {ep}",
        )
    w.finalize()
    return root


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    meta = json.loads((FIXTURE / "io.json").read_text())
    return import_checkpoint(FIXTURE, tmp_path_factory.mktemp("ft") / "imported", meta["overrides"])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return _write_dataset(tmp_path_factory.mktemp("ds") / "robot")


def _cfg(imported: Path, dataset: Path, *extra: str):
    ov = ["train.steps=2", "train.batch_size=2", "train.precision=fp32", "train.warmup_steps=1",
          "train.save_every=100", "train.num_threads=2", "data.num_workers=0", "train.preload=false",
          f"data.path={dataset}", *extra]  # fmt: skip
    return apply_overrides(load_yaml(imported / "train.yaml"), ov)


def test_import_writes_explicit_choice_and_pad_resize(imported):
    cfg = load_yaml(imported / "train.yaml")
    assert cfg.data.norm_stats == "dataset" and cfg.train.init_from == str(imported.resolve())
    assert cfg.model.image_resize == "pad"  # as LeRobot/openpi pretrained it
    assert isinstance(load_normalizer(imported / "norm_stats.json"), ExactNormalizer)


def test_lora_fine_tune_keeping_checkpoint_stats_is_served(imported, dataset, tmp_path):
    """LoRA + frozen vision tower + data.norm_stats=init_from: the checkpoint's exact statistics
    reach the saved policy, the vision tower does not move, and `vla serve` serves the result."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from vlastack.infer.server import PolicyServer, ServerThread

    cfg = _cfg(imported, dataset, "data.norm_stats=init_from", "train.lora_rank=4", "train.lr_vision=0",
               "train.lr=1e-2")  # fmt: skip
    tr = Trainer(cfg, run_dir=tmp_path / "run")
    kept = load_normalizer(imported / "norm_stats.json")
    assert tr.normalizer is kept or tr.normalizer.to_dict() == kept.to_dict()
    before = load_file(str(imported / "model.safetensors"))
    tr.fit()
    final = tmp_path / "run" / "final"
    saved = load_normalizer(final / "norm_stats.json")
    assert isinstance(saved, ExactNormalizer) and saved.to_dict() == kept.to_dict()
    weights = load_file(str(final / "model.safetensors"))  # LoRA merged into the base weights
    vision = [k for k in weights if k.startswith("vision.")]
    assert vision and all(torch.equal(weights[k], before[k]) for k in vision)
    assert any(not torch.equal(weights[k], before[k]) for k in weights if k.startswith("decoder."))

    srv = PolicyServer(Policy.from_pretrained(final, seed=0), port=0)
    with ServerThread(srv) as s:
        client = WebsocketClientPolicy("127.0.0.1", s.port)
        obs = {"images": {"base_0_rgb": np.full((24, 40, 3), 90, np.uint8)},
               "state": np.full(6, 3.0, np.float32), "prompt": "pick up block 0"}  # fmt: skip
        actions = client.infer(obs)["actions"]
    assert actions.shape == (5, 7) and np.isfinite(actions).all()


def test_full_fine_tune_recomputes_stats_by_default(imported, dataset, tmp_path):
    tr = Trainer(_cfg(imported, dataset), run_dir=tmp_path / "run")
    tr.fit()
    saved = load_normalizer(tmp_path / "run" / "final" / "norm_stats.json")
    assert isinstance(saved, Normalizer)
    mean = saved.stats["observation.state"]["mean"]
    assert np.allclose(mean, 3.0, atol=1.0)  # the dataset's statistics, not the checkpoint's
    assert Policy.from_pretrained(tmp_path / "run" / "final").cfg.image_resize == "pad"


def test_kept_stats_must_fit_the_dataset(imported, tmp_path):
    other = _write_dataset(tmp_path / "other", state_dim=5)
    with pytest.raises(ValueError, match="another robot"):
        Trainer(_cfg(imported, other, "data.norm_stats=init_from"), run_dir=tmp_path / "run")


def test_fine_tune_may_rename_cameras_but_not_reshape(imported, tmp_path):
    """A new robot's camera names are a dotted override; an architecture change is refused."""
    other = _write_dataset(tmp_path / "front", camera="front")
    tr = Trainer(_cfg(imported, other, "model.camera_names=[front,wrist]"), run_dir=tmp_path / "run")
    assert tr.model.cfg.camera_names == ("front", "wrist")
    with pytest.raises(ValueError, match=r"model\.vlm differ"):
        Trainer(_cfg(imported, other, "model.camera_names=[front,wrist]", "model.vlm.mlp_dim=8"),
                run_dir=tmp_path / "run2")  # fmt: skip


def test_norm_stats_init_from_needs_a_checkpoint(imported, dataset):
    with pytest.raises(ConfigError, match=r"set train\.init_from"):
        _cfg(imported, dataset, "data.norm_stats=init_from", "train.init_from=")
    with pytest.raises(ConfigError, match="norm_stats"):
        _cfg(imported, dataset, "data.norm_stats=checkpoint")


def test_pad_resize_in_training_matches_lerobot(imported, dataset):
    """The training samples' images are LeRobot's resize-with-pad (to uint8 rounding)."""
    cfg = _cfg(imported, dataset)
    ds = VLADataset(cfg, dataset)
    raw = torch.from_numpy(ds.ds[0]["observation.images.base_0_rgb"]).permute(2, 0, 1)
    assert raw.shape[-2:] == (24, 40)  # decoded at full size, the aspect ratio kept
    got = ds[0]["images"][0].float() / 255
    ref = resize_with_pad(raw[None].float() / 255, 32, 32)[0]
    assert (got - ref).abs().max() <= 0.5 / 255 + 1e-6
    assert (got[:, :6] == 0).all() and (got[:, -6:] == 0).all()  # 24x40 -> 19x32 + black bands
    assert torch.equal(fit_image(raw, 32, "stretch"), fit_image(raw[None], 32, "stretch")[0])
