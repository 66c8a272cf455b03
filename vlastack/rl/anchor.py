"""The imitation anchor of ``vla rl`` (``rl.imitation_coef``): every gradient step of the RL update
adds ``imitation_coef`` x the policy's own training loss on a batch of demonstration frames.

Practising some tasks moves the weights every task shares; a task the rollouts rarely reward (one
left out of ``rl.tasks``, or one already solved, whose groups are all successes and are dropped)
then drifts with nothing to pull it back (docs/research/rl.md: push-only GRPO cost stack 14
points). RL from demonstrations keeps a behaviour-cloning term for this (DAPG, Rajeswaran et al.
2018, adds one to its policy gradient). Here it is the loss the policy was trained with, on frames read exactly as ``vla train`` reads them: the policy's own statistics,
the recipe's augmentation, its grounding targets where the data has them.

The batches and the loss's own draws (a flow head's noise and time) come from a generator seeded
by (``rl.seed``, iteration, step): a resumed run draws what an uninterrupted one drew, and the
frames are preloaded once in this process, so ``metrics.jsonl``'s CPU seconds include them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from vlastack.batch import Batch
from vlastack.config import Config
from vlastack.data.stats import ExactNormalizer, Normalizer, stat_dim
from vlastack.data.transforms import augment_batch


class ImitationAnchor:
    """Demonstration frames, normalized with a policy's statistics, and its training loss on a batch."""

    def __init__(
        self,
        cfg: Config,
        data: str | Path,
        normalizer: Normalizer | ExactNormalizer,
        batch_size: int,
        seed: int,
    ) -> None:
        from vlastack.data.loader import MemoryDataset
        from vlastack.data.samples import make_dataset

        if not Path(data).is_dir():
            raise ValueError(f"rl.imitation_data={data}: no such dataset folder")
        dcfg = replace(cfg, data=replace(cfg.data, streaming=False, path=str(data)))
        ds = make_dataset(dcfg, data, normalizer=normalizer)
        for key, attr in (("observation.state", "state_dim"), ("action", "action_dim")):
            want, have = stat_dim(normalizer, key), getattr(ds, attr, None)
            if want is not None and have is not None and want != have:
                raise ValueError(
                    f"rl.imitation_data={data}: its {key} has {have} dims, the policy's statistics "
                    f"{want}: imitate data of the robot the policy drives"
                )
        self.cfg, self.batch_size, self.seed = cfg, batch_size, seed
        self.frames = MemoryDataset(ds, num_workers=0, progress=False)

    def __len__(self) -> int:
        return len(self.frames)

    def _seed(self, iteration: int, step: int) -> int:
        return ((self.seed * 1_000_003 + iteration) * 4_099 + step) % 2**63

    def generator(self, iteration: int, step: int) -> torch.Generator:
        return torch.Generator().manual_seed(self._seed(iteration, step))

    def batch(self, iteration: int, step: int) -> Batch:
        """Step ``step`` of iteration ``iteration``: ``batch_size`` frames drawn with replacement,
        augmented as ``vla train`` augments them."""
        g = self.generator(iteration, step)
        idx = torch.randint(len(self.frames), (self.batch_size,), generator=g).tolist()
        d = self.cfg.data
        return augment_batch(self.frames.gather(idx), d.random_crop_scale, d.color_jitter, g)

    def loss(self, model: torch.nn.Module, iteration: int, step: int) -> Tensor:
        """The training loss (fp32 scalar, with gradients) on step ``step``'s batch. The loss draws
        its own noise from the global generator: forked and seeded here, so it is the same on
        resume and leaves the caller's stream untouched."""
        batch = self.batch(iteration, step)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._seed(iteration, step) + 1)
            return model(batch)["loss"].float()
