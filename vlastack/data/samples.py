"""Training samples in the batch format of ``vlastack.batch`` (unbatched: no leading B dim).

    ds = make_dataset(cfg, root)                  # map-style (or streaming if cfg.data.streaming)
    s = ds[0]  # images uint8 [N,3,S,S], image_mask [N], tokens [L], token_mask [L], state [S_model],
               # actions [H, A_model] (normalized), action_is_pad [H], action_dim_mask [A_model]

Camera slot i reads ``camera_key(cfg.model.camera_names[i])``: ``observation.images.<name>``, or
LeRobot's single-camera ``observation.image`` for the name ``image`` (Meta-World, PushT; a dataset
that has ``observation.images.image`` instead, as LeRobot's LIBERO ones, is read there); a camera the dataset does
not have is zeros with ``image_mask`` False. State/action are normalized with the dataset's
``meta/stats.json`` (modes from ``cfg.data.norm``) and zero-padded to ``model.state_dim`` /
``model.action_dim``. ``ds.normalizer`` is what the trainer saves as ``norm_stats.json``.
With ``model.grounding`` on, samples also carry ``env_state`` [3 x points]: the dataset's
``observation.environment_state`` (privileged object positions), normalized; and with its
``attend_weight`` > 0, ``env_uv`` [2 x points]: ``observation.environment_uv.<first camera>``
(where that camera images them, fractions of the image), as recorded.

``StreamingDataset`` shards the epoch into contiguous blocks per (rank, worker) after a seeded
episode shuffle, so every sample is seen exactly once per epoch across all ranks and workers;
a shuffle buffer mixes samples inside each block. ``set_epoch(e)`` reseeds (also in persistent
workers: the epoch lives in shared memory).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from vlastack.config import Config
from vlastack.data.reader import LeRobotDataset
from vlastack.data.stats import Normalizer
from vlastack.data.transforms import augment as augment_images
from vlastack.data.transforms import fit_image
from vlastack.models.prompt import pi05_prompt_len, tokenize_prompt
from vlastack.models.tokenizer import load_tokenizer

STATE_KEY, ACTION_KEY, ENV_KEY = "observation.state", "action", "observation.environment_state"
ENV_UV_KEY = "observation.environment_uv"  # + ".<camera>": where that camera images ENV_KEY's points
ADVANTAGE_KEY = "advantage.positive"  # bool per frame: RECAP's indicator (rl/recap.py)
SINGLE_CAMERA = "image"  # LeRobot's one-camera datasets store it as "observation.image"


def camera_key(name: str) -> str:
    """Dataset key of camera ``name``: ``observation.images.<name>``, or ``observation.image``."""
    return "observation.image" if name == SINGLE_CAMERA else f"observation.images.{name}"


def dataset_camera_key(name: str, keys) -> str:
    """``camera_key(name)``, or ``observation.images.<name>`` where only that is in ``keys`` (LeRobot's
    LIBERO datasets name their agentview camera ``observation.images.image``)."""
    key, full = camera_key(name), f"observation.images.{name}"
    return full if key not in keys and full in keys else key


def normalizer_from_stats(stats: dict, cfg: Config) -> Normalizer:
    modes = {STATE_KEY: cfg.data.norm.state, ACTION_KEY: cfg.data.norm.action}
    if ENV_KEY in stats:
        modes[ENV_KEY] = cfg.data.norm.env_state
    return Normalizer(stats, modes)


class VLADataset(Dataset):
    """Map-style samples of a LeRobot v3 dataset for model ``cfg.model``."""

    def __init__(
        self,
        cfg: Config,
        root: str | Path,
        episodes: list[int] | None = None,
        normalizer: Normalizer | None = None,
        augment: bool = False,
        return_index: bool = False,
    ) -> None:
        m = cfg.model
        self.cfg, self.augment, self.return_index = cfg, augment, return_index
        if episodes is None and cfg.data.episodes:
            episodes = list(cfg.data.episodes)
        self.ds = LeRobotDataset(
            root,
            episodes=episodes,
            delta_indices={ACTION_KEY: list(range(m.action_horizon))},
            tolerance_s=cfg.data.video_tolerance_s,
            # Decode at full size and resize per sample with fit_image, exactly as Policy does at
            # inference: the decoder's own (non-antialiased) scaler differed by 1.1/255 on average and
            # up to 80/255 at small objects on Meta-World's 480 -> 128 px (docs/metaworld.md).
            image_size=None,
        )
        for key in (STATE_KEY, ACTION_KEY):
            if key not in self.ds.features:
                raise ValueError(f"{root}: dataset has no {key!r} feature (has {sorted(self.ds.features)})")
        self.state_dim = int(self.ds.features[STATE_KEY]["shape"][0])
        self.action_dim = int(self.ds.features[ACTION_KEY]["shape"][0])
        if self.state_dim > m.state_dim:
            raise ValueError(f"{root}: state has {self.state_dim} dims, model.state_dim is {m.state_dim}")
        if self.action_dim > m.action_dim:
            raise ValueError(f"{root}: action has {self.action_dim} dims, model.action_dim is {m.action_dim}")
        if m.grounding.points:
            ft = self.ds.features.get(ENV_KEY)
            if ft is None:
                raise ValueError(
                    f"{root}: model.grounding needs the {ENV_KEY!r} feature (privileged object positions, "
                    "written by `vla data generate` for the builtin suite); set model.grounding.points=0"
                )
            self.env_index = list(m.grounding.state_index) or None
            if self.env_index and max(self.env_index) >= ft["shape"][0]:
                raise ValueError(
                    f"{root}: model.grounding.state_index {self.env_index} reaches past {ENV_KEY}'s "
                    f"{ft['shape'][0]} dims"
                )
            if not self.env_index and tuple(ft["shape"]) != (m.grounding.dim,):
                raise ValueError(
                    f"{root}: {ENV_KEY} has shape {ft['shape']}, model.grounding.points={m.grounding.points} "
                    f"needs [{m.grounding.dim}] (or pick its dims with model.grounding.state_index)"
                )
            self.uv_key = f"{ENV_UV_KEY}.{m.camera_names[0]}"
            ft = self.ds.features.get(self.uv_key)
            if m.grounding.attend_weight and (ft is None or tuple(ft["shape"]) != (2 * m.grounding.points,)):
                raise ValueError(
                    f"{root}: model.grounding.attend_weight needs the {self.uv_key!r} feature of shape "
                    f"[{2 * m.grounding.points}] (where the first camera sees each point; written by "
                    f"`vla data generate`), found {ft and ft['shape']}; for a Meta-World dataset made "
                    f"without it run `vla data add-uv {root}`, else regenerate the data or set "
                    "model.grounding.attend_weight=0"
                )
        self.cam_keys = [dataset_camera_key(c, self.ds.camera_keys) for c in m.camera_names]
        self.present = [k in self.ds.camera_keys for k in self.cam_keys]
        if not any(self.present):
            raise ValueError(
                f"{root}: none of the model's cameras {list(m.camera_names)} are in the dataset "
                f"(it has {self.ds.camera_keys}); set model.camera_names"
            )
        self.normalizer = normalizer or normalizer_from_stats(self.ds.stats, cfg)
        self.tokenizer = load_tokenizer(m.tokenizer)
        if m.state_in_prompt:  # a prompt cut short loses the state: check every task's longest one
            adv = False if m.advantage_conditioning else None  # "negative" and "positive": 8 bytes each
            need, task = max(
                (pi05_prompt_len(self.tokenizer, t, np.ones(self.state_dim), adv), t) for t in self.ds.tasks
            )
            if need > m.max_text_len:
                raise ValueError(
                    f"{root}: the Pi0.5 prompt of task {task!r} with the {self.state_dim}-dim state needs up "
                    f"to {need} tokens, model.max_text_len is {m.max_text_len}: set model.max_text_len={need}"
                )
        if m.advantage_conditioning and ADVANTAGE_KEY not in self.ds.features:
            raise ValueError(
                f"{root}: model.advantage_conditioning reads each frame's advantage indicator from the "
                f"{ADVANTAGE_KEY!r} feature, which this dataset lacks: label it with `vla recap label`, "
                "or set model.advantage_conditioning=false"
            )
        self._tokens: dict[tuple[int, bool | None], tuple[np.ndarray, np.ndarray]] = {}
        self._dim_mask = torch.arange(m.action_dim) < self.action_dim

    def __len__(self) -> int:
        return len(self.ds)

    def _tokenize(self, task_index: int, advantage: bool | None) -> tuple[np.ndarray, np.ndarray]:
        hit = self._tokens.get((task_index, advantage))
        if hit is None:
            hit = self._tokens[task_index, advantage] = tokenize_prompt(
                self.tokenizer, self.ds.tasks[task_index], None, self.cfg.model.max_text_len, False, advantage
            )
        return hit

    def _sample(self, item: dict[str, Any], i: int) -> dict[str, torch.Tensor]:
        m = self.cfg.model
        s = m.vision.image_size
        images = torch.zeros(m.num_cameras, 3, s, s, dtype=torch.uint8)
        for j, key in enumerate(self.cam_keys):
            if self.present[j]:
                images[j] = fit_image(torch.from_numpy(item[key]).permute(2, 0, 1), s, m.image_resize)
        state = torch.zeros(m.state_dim)
        state[: self.state_dim] = torch.from_numpy(
            self.normalizer.normalize(STATE_KEY, item[STATE_KEY].astype(np.float32))
        )
        actions = torch.zeros(m.action_horizon, m.action_dim)
        actions[:, : self.action_dim] = torch.from_numpy(
            self.normalizer.normalize(ACTION_KEY, item[ACTION_KEY].astype(np.float32))
        )
        is_pad = torch.from_numpy(item[f"{ACTION_KEY}_is_pad"])
        actions[is_pad] = 0.0  # padded steps carry no signal; the loss masks them anyway
        adv = bool(np.asarray(item[ADVANTAGE_KEY]).reshape(-1)[0]) if m.advantage_conditioning else None
        if m.state_in_prompt:  # Pi0.5: the normalized state is part of the prompt (per frame)
            task = self.ds.tasks[int(item["task_index"])]
            st = state[: self.state_dim].numpy()
            tokens, mask = tokenize_prompt(self.tokenizer, task, st, m.max_text_len, True, adv)
        else:
            tokens, mask = self._tokenize(int(item["task_index"]), adv)
        out = {
            "images": images,
            "image_mask": torch.tensor(self.present),
            "tokens": torch.from_numpy(tokens),
            "token_mask": torch.from_numpy(mask),
            "state": state,
            "actions": actions,
            "action_is_pad": is_pad,
            "action_dim_mask": self._dim_mask.clone(),
        }
        if m.grounding.points:
            env = self.normalizer.normalize(ENV_KEY, item[ENV_KEY].astype(np.float32))
            if self.env_index:  # normalized whole (the stats are per dim), then picked
                env = np.asarray(env)[..., self.env_index]
            out["env_state"] = torch.from_numpy(np.asarray(env, dtype=np.float32))
            if m.grounding.attend_weight:
                out["env_uv"] = torch.from_numpy(np.asarray(item[self.uv_key], dtype=np.float32))
        if self.augment:  # the attention targets move with the first camera's crop
            crop, jit = self.cfg.data.random_crop_scale, self.cfg.data.color_jitter
            if "env_uv" in out:
                imgs, uv = augment_images(images[None], crop, jit, uv=out["env_uv"][None])
                out["images"], out["env_uv"] = imgs[0], uv[0]
            else:
                out["images"] = augment_images(images, crop, jit)
        if self.return_index:
            out["index"] = torch.tensor(i, dtype=torch.int64)
        return out

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self._sample(self.ds[i], int(i))

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        items = self.ds.__getitems__(list(indices))
        return [self._sample(it, int(i)) for it, i in zip(items, indices)]


def _dist_info() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class StreamingDataset(IterableDataset):
    """Sharded, shuffled iteration over a ``VLADataset`` (see module doc)."""

    def __init__(
        self,
        base: VLADataset,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.base, self.shuffle_buffer, self.seed = base, max(1, shuffle_buffer), seed
        r, w = _dist_info()
        self.rank = r if rank is None else rank
        self.world_size = w if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} must be in [0, world_size={self.world_size})")
        self._epoch = multiprocessing.RawValue("q", 0)

    def set_epoch(self, epoch: int) -> None:
        self._epoch.value = int(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    def shard_indices(self, worker_id: int = 0, num_workers: int = 1) -> np.ndarray:
        """Sample positions of this (rank, worker) shard for the current epoch, before the buffer."""
        ds = self.base.ds
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(ds.num_episodes)
        flat = np.concatenate([np.arange(*ds.episode_range(int(k))) for k in order])
        # Rank blocks first, then worker blocks inside them: contiguous (decode-friendly) and
        # balanced to +-1 sample, and the rank sizes match __len__ whatever the worker count.
        rb = np.linspace(0, len(flat), self.world_size + 1).round().astype(np.int64)
        block = flat[rb[self.rank] : rb[self.rank + 1]]
        wb = np.linspace(0, len(block), num_workers + 1).round().astype(np.int64)
        return block[wb[worker_id] : wb[worker_id + 1]]

    def __len__(self) -> int:
        """Samples this rank yields per epoch (over all its workers)."""
        n, w = len(self.base), self.world_size
        bounds = np.linspace(0, n, w + 1).round().astype(np.int64)
        return int(bounds[self.rank + 1] - bounds[self.rank])

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = self.shard_indices(wid, nw)
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, wid, 1])
        buf: list[int] = []
        for idx in mine:
            buf.append(int(idx))
            if len(buf) >= self.shuffle_buffer:
                j = int(rng.integers(len(buf)))
                buf[j], buf[-1] = buf[-1], buf[j]
                yield self.base[buf.pop()]
        rng.shuffle(buf)
        for idx in buf:
            yield self.base[idx]


def make_dataset(
    cfg: Config,
    root: str | Path | None = None,
    split_episodes: list[int] | None = None,
    normalizer: Normalizer | None = None,
    augment: bool = False,
    **stream_kw: Any,
) -> VLADataset | StreamingDataset:
    """The training dataset for ``cfg`` from ``root`` (default ``cfg.data.path``)."""
    root = root or cfg.data.path
    if not root:
        raise ValueError("no dataset path: pass root or set data.path")
    base = VLADataset(cfg, root, episodes=split_episodes, normalizer=normalizer, augment=augment)
    if cfg.data.streaming:
        return StreamingDataset(
            base, shuffle_buffer=cfg.data.shuffle_buffer, seed=cfg.train.seed, **stream_kw
        )
    return base
