"""The training loop behind ``vla train``: one CPU to many GPUs under ``torchrun``.

    Trainer(cfg, data_path="data/demo", run_dir="runs/x", resume=False).fit()

Batch size is per rank and per micro-step: an optimizer step sees
``train.batch_size * train.grad_accum * world_size`` samples. Logging, checkpoint writing and
evaluation run on rank 0; collective parts (gathering FSDP2 shards) run on every rank.
"""

from __future__ import annotations

import errno
import json
import random
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import default_collate

from vlastack.batch import Batch, to_device, validate_batch
from vlastack.config import Config, ModelConfig, load_yaml, save_yaml
from vlastack.data.check import check_training_data
from vlastack.data.format import action_representation
from vlastack.data.loader import MemoryDataset, ResumableBatchSampler, preload_key, training_batches
from vlastack.data.stats import NORM_STATS, ExactNormalizer, Normalizer, load_normalizer, stat_dim
from vlastack.fileio import load_safetensors
from vlastack.models.vla import VLA, build_model
from vlastack.nn.lora import apply_lora
from vlastack.progress import Progress
from vlastack.train import checkpoint as ck
from vlastack.train import sharded as sd
from vlastack.train.logs import RunLogger, peak_memory_mb, plot_loss
from vlastack.train.optim import EMA, WarmupCosine, build_optimizer, freeze_parts, put_settings, run_settings
from vlastack.train.parallel import (
    apply_activation_checkpointing,
    apply_compile,
    apply_ddp,
    apply_fsdp,
    fsdp_mp_policy,
    hsdp_mesh,
    init_distributed,
    remove_corrupt_compile_artifacts,
    uncompile,
)
from vlastack.train.precision import resolve_auto
from vlastack.train.runctl import RunLock, StopSignals, TrainingStopped
from vlastack.train.state import load_state, rng_state, save_state, set_rng_state
from vlastack.train.step import StepResult, make_scaler, train_step


class TrainingDiverged(RuntimeError):
    """Too many consecutive steps had a NaN/inf loss or gradient."""


def check_dataset_fits(dataset, cfg: Config) -> list[str]:
    """Refuse (``ValueError``) a dataset whose samples do not fit ``cfg.model``; returns warnings."""
    sample = dataset[0]
    batch = default_collate([sample])
    try:
        validate_batch(batch, cfg.model, train=True)
    except (ValueError, TypeError) as e:
        raise ValueError(f"the dataset does not fit the model config: {e}") from None
    warnings = []
    missing = [c for c, ok in zip(cfg.model.camera_names, sample["image_mask"].tolist()) if not ok]
    if missing:
        warnings.append(
            f"cameras {missing} of model.camera_names are not in the dataset (fed as masked zeros)"
        )
    return warnings


# Model fields that shape no weight, which a fine-tune may change (cameras, sizes, sampler, actions).
FREE_WHEN_FINE_TUNING = (
    "camera_names", "image_resize", "max_text_len", "action_horizon", "head_options.num_denoise_steps",
    "head_options.noise_scale", "head_options.step_noise", "tokenizer", "action_representation",
    "advantage_conditioning",
)  # fmt: skip


def differing_fields(a: ModelConfig, b: ModelConfig) -> list[str]:
    """``ModelConfig`` fields whose values differ between ``a`` and ``b``; the head's options one
    by one (``head_options.<key>``) when both are the same head's."""
    out = [f.name for f in fields(a) if getattr(a, f.name) != getattr(b, f.name)]
    x, y = a.head_options, b.head_options
    if "head_options" in out and x is not None and type(x) is type(y):  # the options one by one
        out = [k for k in out if k != "head_options"]
        out += [f"head_options.{g.name}" for g in fields(x) if getattr(x, g.name) != getattr(y, g.name)]
    return out


def init_normalizer(init_from: str) -> Normalizer | ExactNormalizer:
    """The statistics saved with the ``train.init_from`` checkpoint (``data.norm_stats=init_from``)."""
    path = Path(init_from) / NORM_STATS
    if not path.exists():
        raise ValueError(
            f"data.norm_stats=init_from: {path} does not exist (a folder written by `vla import` or by "
            "training has it); use data.norm_stats=dataset to compute statistics from the dataset"
        )
    return load_normalizer(path)


def check_normalizer_fits(normalizer: Normalizer | ExactNormalizer, dataset, init_from: str) -> None:
    """Refuse kept statistics whose state/action dims differ from the dataset's (another robot)."""
    for key, attr in (("observation.state", "state_dim"), ("action", "action_dim")):
        dim, have = stat_dim(normalizer, key), getattr(dataset, attr, None)
        if dim is not None and have is not None and dim != have:
            raise ValueError(
                f"data.norm_stats=init_from: {init_from}'s {key} statistics have {dim} dims, the data "
                f"{have}: the checkpoint was trained for another robot; use data.norm_stats=dataset"
            )


class StepMeter:
    """Sums of per-step figures between two log lines; ``flush`` returns their means and resets."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = {}
        self.reset()

    def reset(self) -> None:
        self.acc = {"loss": 0.0, "grad_norm": 0.0, "n": 0, "wait": 0.0, "time": 0.0, "samples": 0}
        self.parts: dict[str, float] = {}  # the head's scalars (StepResult.parts)

    def add(self, res: StepResult, wait: float, elapsed: float, samples: int) -> None:
        a = self.acc
        a["wait"] += wait
        a["time"] += elapsed
        a["samples"] += samples
        if res.ok:  # bad steps are counted apart, not averaged in
            a["loss"] += res.loss
            a["grad_norm"] += res.grad_norm
            a["n"] += 1
            for k, v in res.parts.items():
                self.parts[k] = self.parts.get(k, 0.0) + v

    def flush(self) -> dict[str, float]:
        a, n = self.acc, max(1, self.acc["n"])
        m = {
            "loss": a["loss"] / n if a["n"] else float("nan"),
            "grad_norm": a["grad_norm"] / n if a["n"] else float("nan"),
            "samples_per_s": a["samples"] / max(a["time"], 1e-9),
            "data_wait": a["wait"] / max(a["time"], 1e-9),
        }
        m.update({k: v / n for k, v in self.parts.items() if a["n"]})
        self.reset()
        return m


# Closed-loop evaluation during training, handed in from above (``vla train`` passes the
# simulator's, ``sim.evaluate.evaluate``): (policy folder, config, output folder) -> eval.json dict
# with ``overall.success_rate`` and ``overall.n``. The training layer does not import the simulator.
Evaluator = Callable[[Path, Config, Path], dict]
# What ``train.anomaly_guard`` runs on a bad step (``vla train`` passes the doctor's
# ``diagnostics.numerics.anomaly_stop``): (trainer, micro-batches, StepResult) -> raises.
AnomalyHandler = Callable[[Any, list, Any], None]


def _is_compile_error(e: BaseException) -> bool:
    """An error raised by torch.compile's stack (Dynamo, AOTAutograd, Inductor, the C++ build)."""
    mod = type(e).__module__ or ""
    return (
        mod.startswith(("torch._dynamo", "torch._inductor", "torch._functorch"))
        or "CppCompileError" in type(e).__name__
    )


def with_data_representation(cfg: Config, data_root: str | Path | None) -> Config:
    """``cfg`` with ``model.action_representation`` resolved from the data's record
    (``data.format.action_representation``): ``auto`` takes it (and stays ``auto``, unspecified, for
    data that does not say); a setting that contradicts the record is refused, since the policy
    would act in the wrong one."""
    recorded = action_representation(data_root)
    want = cfg.model.action_representation
    if want == "auto":
        return replace(cfg, model=replace(cfg.model, action_representation=recorded)) if recorded else cfg
    if recorded is not None and recorded != want:
        raise ValueError(
            f"model.action_representation={want}, but {data_root} records {recorded} actions: drop the "
            f"setting (auto takes the data's) or train on {want} data"
        )
    return cfg


class Trainer:
    def __init__(
        self,
        cfg: Config,
        data_path: str | Path | None = None,
        run_dir: str | Path | None = None,
        resume: bool = False,
        device: str | torch.device | None = None,
        dataset=None,
        verbose: bool = True,
        overwrite: bool = False,
        evaluator: Evaluator | None = None,
        on_anomaly: AnomalyHandler | None = None,
    ) -> None:
        t = cfg.train
        if t.eval_every > 0 and evaluator is None:
            raise ValueError(
                f"train.eval_every={t.eval_every} needs an evaluator: Trainer(evaluator=...) (vla train "
                "passes the simulator's closed-loop evaluation), or train.eval_every=0"
            )
        if t.anomaly_guard and on_anomaly is None:
            raise ValueError(
                "train.anomaly_guard=true needs its handler: Trainer(on_anomaly=...) (vla train passes "
                "vlastack.diagnostics.numerics.anomaly_stop), or train.anomaly_guard=false"
            )
        self.evaluator, self.on_anomaly = evaluator, on_anomaly
        dev_type = torch.device(device).type if device else ("cuda" if torch.cuda.is_available() else "cpu")
        self.dist = init_distributed(dev_type)
        self.device = torch.device(device) if device else torch.device(dev_type)
        if dev_type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", self.dist.local_rank)
        if t.parallel != "none" and not self.dist.enabled:
            raise ValueError(f"train.parallel={t.parallel} needs several processes: launch with torchrun")
        if t.num_threads > 0:
            torch.set_num_threads(t.num_threads)
        self.cfg = cfg
        self.run_dir = Path(run_dir or t.out_dir)
        self.is_main = self.dist.is_main
        self.fsdp = t.parallel in ("fsdp", "hsdp")  # HSDP is FSDP2 on a 2-D mesh: same state dicts
        self.bar: Progress | None = None  # the live progress bar while ``fit`` runs
        # SIGTERM / Ctrl-C finish the step and save (active while ``fit`` runs; see train/runctl.py).
        self.stop = StopSignals(self._message if self.is_main else (lambda msg: None))
        # One run per folder: refused before anything is built or written (rank 0 owns the folder).
        self.lock = RunLock(self.run_dir)
        if self.is_main:
            self.lock.acquire()
        try:
            if self.is_main and not resume:
                ck.claim_run_dir(self.run_dir, overwrite)
            self._setup(cfg, data_path, resume, dataset, verbose)
        except BaseException:
            self.lock.release()  # a run that could not start leaves its folder free at once
            raise

    def _setup(self, cfg: Config, data_path, resume: bool, dataset, verbose: bool) -> None:
        """Data, model, optimizer, training state and logger: the rest of ``__init__``."""
        cfg = self.cfg = self._concrete_precision(cfg, resume, verbose)
        t = cfg.train
        self.data_root = data_path or cfg.data.path  # train_seeds.json reads its generator record
        # ---- data (refused before any training if it does not fit the model)
        kept = init_normalizer(t.init_from) if cfg.data.norm_stats == "init_from" else None
        built_here = dataset is None  # a dataset of files we can name a preload cache by
        if dataset is None:
            from vlastack.data.samples import make_dataset

            dataset = make_dataset(
                replace(cfg, data=replace(cfg.data, streaming=False)), data_path, normalizer=kept
            )
        elif kept is not None:
            dataset.normalizer = kept
        if kept is not None:
            check_normalizer_fits(kept, dataset, t.init_from)
        self.warnings = check_training_data(dataset) + check_dataset_fits(dataset, cfg)  # NaN, bad stats
        self.normalizer = getattr(dataset, "normalizer", None)
        if t.preload and not isinstance(dataset, MemoryDataset):
            cache = None
            if t.preload_cache and built_here:
                extra = json.dumps(kept.to_dict(), sort_keys=True, default=str).encode() if kept else b""
                key = preload_key(cfg, self.data_root, extra)
                cache = self.run_dir / "preload" / f"{key}.safetensors"
                if not self.is_main and not cache.is_file():
                    cache = None  # rank 0 writes it; the others decode this once
            dataset = MemoryDataset(dataset, num_workers=cfg.data.num_workers, cache=cache)
        self.dataset = dataset
        cfg = self.cfg = with_data_representation(cfg, self.data_root)

        # ---- model (same init on every rank)
        torch.manual_seed(t.seed)
        model = build_model(cfg.model)
        if t.init_from:
            init = VLA.from_pretrained(t.init_from)
            differ = [f for f in differing_fields(init.cfg, cfg.model) if f not in FREE_WHEN_FINE_TUNING]
            if differ:
                raise ValueError(
                    f"train.init_from={t.init_from}: model.{', model.'.join(differ)} differ from the "
                    f"checkpoint's (only {', '.join(FREE_WHEN_FINE_TUNING)} may change when fine-tuning)"
                )
            model.load_state_dict(init.state_dict())
            model.head.copy_extra_from(init.head)  # e.g. the checkpoint's action tokenizer
        model.head.prepare(dataset)  # e.g. the token head fits its action tokenizer
        self.frozen_parts = freeze_parts(model, t)
        if t.lora_rank > 0:
            base_dir = self.run_dir / "lora_base"
            if self.is_main and not (base_dir / "model.safetensors").exists():
                model.save_pretrained(base_dir)  # adapters are saved alone; resume needs the base
            apply_lora(
                model, t.lora_targets, t.lora_rank, t.lora_alpha, t.lora_dropout, model.unreachable_linears
            )
            # apply_lora makes every adapter trainable; a part frozen with lr 0 keeps its adapters
            # frozen too, so it runs no backward and holds no activations for one
            freeze_parts(model, t)
        model.to(self.device)
        if t.activation_checkpointing:
            apply_activation_checkpointing(model)
        self.compiled = bool(t.compile)
        self._compile_checked = False  # the first compiled step may fall back to eager
        if t.compile:
            apply_compile(model, regional=self.fsdp or t.compile_scope == "blocks")
        self.model = model  # the unwrapped module (FSDP2 shards it in place)
        if t.parallel == "ddp":
            self.wrapped = apply_ddp(model, self.device)
        elif self.fsdp:
            mesh = hsdp_mesh(self.device.type, self.dist.world_size) if t.parallel == "hsdp" else None
            self.wrapped = apply_fsdp(model, fsdp_mp_policy(t.precision), mesh=mesh)
        else:
            self.wrapped = model

        self.optimizer = build_optimizer(model, t)
        self.scheduler = WarmupCosine(self.optimizer, t)
        self.scaler = make_scaler(self.device.type, t.precision)
        self.ema = EMA(model, t.ema_decay) if t.ema_decay > 0 else None
        self.aug_gen = torch.Generator().manual_seed(t.seed + 7919 * (self.dist.rank + 1))
        self.step, self.position, self.bad_in_row, self.bad_total = 0, 0, 0, 0
        # Per-rank training randomness (dropout, teacher-forcing noise...) differs across ranks.
        seed = t.seed + 1 + self.dist.rank
        torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)
        # Several ranks: the head's loss draws (the flow head's noise and time) come from one
        # generator every rank shares, seeded as one process's global RNG is, drawn for the global
        # batch and sliced per rank (``HeadBase.loss_draws``), so N ranks train as one process does
        # on the same global batch. Training-time RTC draws its delays first, so it keeps per-rank draws.
        self.draw_gen = None
        if self.dist.world_size > 1 and not t.rtc.max_delay:
            self.draw_gen = torch.Generator(device=self.device).manual_seed(t.seed + 1)
        if self.is_main:  # leftovers of a killed save would block this run's saves and hold disk space
            self.warnings += [f"removed {p} (left by an interrupted save)" for p in ck.sweep(self.run_dir)]
        if resume:
            self._resume()
        self.logger = RunLogger(self.run_dir, t.steps, self.step, enabled=self.is_main and verbose)
        if self.is_main and verbose:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_yaml(cfg, self.run_dir / "config.yaml")

    def _concrete_precision(self, cfg: Config, resume: bool, verbose: bool) -> Config:
        """``train.precision: auto`` measured once (rank 0's choice for every rank), or the resumed
        checkpoint's precision; the run's config.yaml records the result."""
        self.precision_reason: str | None = None
        if cfg.train.precision != "auto":
            return cfg
        previous = None
        if resume and (path := ck.latest_checkpoint(self.run_dir)) is not None:
            try:
                previous = load_yaml(path / "config.yaml").train.precision
            except (OSError, ValueError):
                previous = None  # _resume refuses an unreadable checkpoint with the reason
        cfg, why = resolve_auto(cfg, self.device.type, previous)
        if self.dist.enabled and self.device.type == "cpu":  # timings differ per process
            code = torch.tensor([cfg.train.precision == "bf16"], dtype=torch.int32)
            dist.broadcast(code, src=0)
            chosen = "bf16" if bool(code.item()) else "fp32"
            if chosen != cfg.train.precision:
                cfg, why = (
                    replace(cfg, train=replace(cfg.train, precision=chosen)),
                    f"{chosen}: rank 0's choice",
                )
        self.precision_reason = why
        if self.is_main and verbose:
            print(why, flush=True)
        return cfg

    # ------------------------------------------------------------------ state

    def _full_state(self, ema: bool = False) -> dict[str, torch.Tensor]:
        """The whole model state dict on CPU (collective under FSDP2). ``ema``: EMA weights."""
        if ema:
            assert self.ema is not None
            if not self.fsdp:
                full = self._full_state()
                shadow = self.ema.state_dict()
                return {k: shadow[k].to(v.dtype) if k in shadow else v for k, v in full.items()}
            self.ema.swap(self.model)
            try:
                return self._full_state()
            finally:
                self.ema.swap(self.model)
        return sd.full_model_state(self.model, self.fsdp)

    def save(self, policy: bool = False) -> Path:
        """Write checkpoint ``step_<step>`` (all ranks must call). Returns its folder."""
        self.stop.saving = True  # a Ctrl-C now stops at once instead of after this save
        try:
            return self._save(policy)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # Free what the failed save wrote now, not at the next start, and say what it needed.
            tmp = ck.tmp_dir(self.run_dir, self.step)
            shutil.rmtree(tmp, ignore_errors=True)
            full = OSError(e.errno, e.strerror, str(tmp.parent))
            full.needed_bytes = sd.checkpoint_bytes(self.model, self.optimizer, self.ema is not None)
            raise full from e
        finally:
            self.stop.saving = False

    @property
    def sharded(self) -> bool:
        """Checkpoints are ``torch.distributed.checkpoint`` shards (train/sharded.py)."""
        f = self.cfg.train.checkpoint_format
        return f == "sharded" or (f == "auto" and self.fsdp)

    def _write_policy(self, folder: Path) -> None:
        """A policy folder (and ``ema/``) from the gathered weights (collective; rank 0 writes)."""
        full = self._full_state()
        ema_full = self._full_state(ema=True) if self.ema is not None else None
        if self.is_main:
            extra = (self.model.head, self.normalizer, getattr(self, "data_root", None))
            sd.export_policy(full, folder, self.cfg, *extra)
            if ema_full is not None:
                (folder / "ema").mkdir(exist_ok=True)
                sd.export_policy(ema_full, folder / "ema", self.cfg, *extra)

    def _save(self, policy: bool = False) -> Path:
        """Checkpoint ``step``. Gathered: a policy folder plus the training state. Sharded: each
        rank's shards in ``dcp/``, the config and statistics, and a policy folder only where asked
        (``policy``: an evaluation reads it)."""
        tmp = ck.tmp_dir(self.run_dir, self.step)
        if self.is_main:
            ck.begin(self.run_dir, self.step)
        self._barrier()
        if self.sharded:
            sd.save_sharded(tmp, self.model, self.optimizer, self.ema)
            if policy:
                self._write_policy(tmp)
            elif self.is_main:
                ck.write_common(tmp, self.cfg, self.normalizer, getattr(self, "data_root", None))
        else:
            self._write_policy(tmp)
            optim = sd.full_optim_state(self.model, self.optimizer, self.fsdp)
        if self.is_main:
            state = {
                "step": self.step,
                "position": self.position,
                "bad_total": self.bad_total,
                "world_size": self.dist.world_size,
                "optimizer": None if self.sharded else optim,
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            }
            save_state(state, tmp / "train_state", "state")
        self._barrier()
        local = {"rng": rng_state(self._generators())}
        if self.ema is not None and not self.sharded:
            local["ema"] = self.ema.state_dict()  # local shards under FSDP2
        save_state(local, tmp / "train_state", f"rank{self.dist.rank}")
        self._barrier()
        path = ck.commit(self.run_dir, self.step, self.cfg.train.keep_last) if self.is_main else None
        self._barrier()
        if self.is_main:
            plot_loss(self.run_dir / "metrics.jsonl", self.run_dir / "loss_curve.png")
        return path or ck.checkpoint_root(self.run_dir) / ck.step_name(self.step)

    def _resume(self) -> None:
        path = ck.latest_checkpoint(self.run_dir)
        if path is None:
            raise ValueError(f"--resume: no checkpoint under {ck.checkpoint_root(self.run_dir)}")
        old = ck.check_compatible(path, self.cfg)
        ck.check_same_statistics(path, self.normalizer)
        changed = ck.changed_keys(old, self.cfg)
        if changed:
            self.warnings.append(f"resuming {path.name} with changed settings: {', '.join(changed)}")
        state = load_state(path / "train_state", "state")
        written_by, world = state["world_size"], self.dist.world_size
        sharded = sd.is_sharded(path)
        if written_by != world and self.ema is not None and not sharded:
            raise ValueError(
                f"cannot resume from {path}: it was written by {written_by} processes and this run "
                f"has {world}; its EMA shards are per process (train.checkpoint_format=sharded "
                "checkpoints resume on any number)"
            )
        t = self.cfg.train
        fresh = run_settings(self.optimizer)  # this run's lr and weight decay: loading replaces them
        if sharded:
            sd.load_sharded(path, self.model, self.optimizer, self.ema)
        else:
            if t.lora_rank > 0:
                base = load_safetensors(self.run_dir / "lora_base" / "model.safetensors")
                full = {
                    k: base[k.replace(".base.", ".")] for k in self.model.state_dict() if ".lora_" not in k
                }
                full.update(load_safetensors(path / "adapter.safetensors"))
            else:
                full = load_safetensors(path / "model.safetensors")
            sd.set_full_model_state(self.model, full, self.fsdp)
            sd.set_full_optim_state(self.model, self.optimizer, state["optimizer"], self.fsdp)
        self.scheduler.load_state_dict(state["scheduler"])
        put_settings(self.optimizer, self.scheduler, fresh)
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        rank_file = path / "train_state" / f"rank{self.dist.rank}.json"
        if written_by == world and rank_file.exists():
            local = load_state(path / "train_state", f"rank{self.dist.rank}")
            set_rng_state(local["rng"], self._generators())
            if self.ema is not None and not sharded:
                self.ema.load_state_dict(local["ema"])
        elif written_by != world:
            self.warnings.append(
                f"resuming {path.name}, written by {written_by} processes, on {world}: the global batch is "
                f"{t.batch_size * t.grad_accum * world} samples now; random streams restart from train.seed"
            )
        self.step, self.bad_total = state["step"], state["bad_total"]
        self.position = sd.rescale_position(
            state["position"], len(self.dataset), t.batch_size, written_by, world
        )

    def _barrier(self) -> None:
        if self.dist.enabled:
            dist.barrier()

    # ------------------------------------------------------------------ loop

    def batches(self):
        t, d = self.cfg.train, self.cfg.data
        sampler = ResumableBatchSampler(
            len(self.dataset), t.batch_size, t.seed, self.dist.rank, self.dist.world_size, self.position
        )
        pin = d.pin_memory and self.device.type == "cuda"
        return training_batches(self.dataset, sampler, self.cfg, pin)

    def _augment(self, batch: Batch) -> Batch:
        from vlastack.data.transforms import augment_batch

        d = self.cfg.data
        return augment_batch(batch, d.random_crop_scale, d.color_jitter, self.aug_gen)

    def fit(self, stop_after: int | None = None) -> dict:
        """Train to ``train.steps``; returns a summary (final loss, timings, final folder).

        ``stop_after``: return once this step is reached (after its checkpoint), as if the job had
        been killed there; the schedule still targets ``train.steps``.
        """
        t = self.cfg.train
        end = min(t.steps, stop_after) if stop_after else t.steps
        it = self.batches()
        self.wrapped.train()
        meter, losses = StepMeter(), []
        t_start = time.perf_counter()
        if self.is_main:
            self.lock.acquire()  # no-op while held; fit may run again after a stop_after
        try:
            with (
                Progress(t.steps, "train", "step", initial=self.step, enabled=self.logger.enabled) as bar,
                self.stop,
            ):
                self.bar = bar
                try:
                    last_ckpt = self._loop(it, end, meter, losses)
                finally:
                    self.bar = None
            return self._finish(last_ckpt, losses, t_start)
        finally:
            self.lock.release()

    def _loop(self, it, end: int, meter: StepMeter, losses: list[float]) -> Path | None:
        """Steps until ``end``: batches, optimizer step, health check, metrics, checkpoints."""
        t, last_ckpt = self.cfg.train, None
        for w in self.warnings:
            self._message(f"warning: {w}")
        while self.step < end:
            t0 = time.perf_counter()
            micro = self._next_micro_batches(it)
            t1 = time.perf_counter()
            res, lr = self._optimizer_step(micro)
            losses.append(res.loss)
            self._check_health(res)
            samples = t.batch_size * t.grad_accum * self.dist.world_size
            meter.add(res, wait=t1 - t0, elapsed=time.perf_counter() - t0, samples=samples)
            self.bar.update(1, loss=f"{res.loss:.4f}", lr=f"{lr:.1e}")
            if self.step % t.log_every == 0 or self.step == t.steps:
                self._log_metrics(meter.flush(), lr)
            saved = self._checkpoint_if_due(end)
            last_ckpt = saved or last_ckpt
            signum = self._stop_requested()
            if signum:
                if meter.acc["n"]:
                    self._log_metrics(meter.flush(), lr)
                ckpt = saved or self.save()
                self.logger.close()
                raise TrainingStopped(signum, self.step, ckpt)
        return last_ckpt

    def _stop_requested(self) -> int:
        """The stop signal any rank received (0: none). Under torchrun every rank must agree, so
        that all save their part of the checkpoint or none does: a one-int all-reduce per step."""
        signum = self.stop.requested or 0
        if self.dist.enabled:
            flag = torch.tensor([signum], device=self.device if self.device.type == "cuda" else "cpu")
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            signum = int(flag.item())
        return signum

    def _message(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)  # the bar is live only where the logger prints
        else:
            self.logger.message(text)

    def _next_micro_batches(self, it) -> list[Batch]:
        """``train.grad_accum`` augmented batches on the device; advances the data position."""
        micro = []
        for _ in range(self.cfg.train.grad_accum):
            micro.append(to_device(self._augment(next(it)), self.device))
            self.position += 1
        return micro

    def _generators(self) -> dict[str, torch.Generator]:
        """The trainer's own generators, saved and restored with each rank's RNG state."""
        return {"aug": self.aug_gen, **({"draws": self.draw_gen} if self.draw_gen is not None else {})}

    def _shared_draws(self, micro: list[Batch]) -> list[dict] | None:
        """Each micro-batch's loss draws for the global batch, this rank's slice (see ``draw_gen``);
        None where the head draws in its own forward."""
        w, r, head = self.dist.world_size, self.dist.rank, self.model.head
        out = []
        for mb in micro:
            b = len(mb["state"])
            d = head.loss_draws(w * b, tuple(mb["actions"].shape[1:]), self.draw_gen)
            if d is None:
                return None
            d = {k: v[r * b : (r + 1) * b] for k, v in d.items()}
            # Padded steps make ranks' counts differ: dividing each rank's sum by the global count
            # (over W, which DDP's gradient mean undoes) gives the global batch's mean.
            if (n := head.loss_terms(mb)) is not None:
                n = n.detach().float().clone()
                torch.distributed.all_reduce(n)
                d["loss_denominator"] = n / w
            out.append(d)
        return out

    def _optimizer_step(self, micro: list[Batch]):
        """One optimizer step, the LR schedule's step and the EMA update; returns (result, lr used)."""
        t = self.cfg.train
        kw = None
        if t.rtc.max_delay:  # training-time RTC: a delay per sample, its actions the clean prefix
            n = t.rtc.max_delay + 1
            kw = [
                {"prefix_len": torch.randint(0, n, (len(mb["state"]),), device=self.device)} for mb in micro
            ]
        elif self.draw_gen is not None:
            kw = self._shared_draws(micro)
        if self.compiled and not self._compile_checked:
            res = self._first_compiled_step(micro, kw)
        else:
            res = self._train_step(micro, kw)
        if t.anomaly_guard and not res.ok and not res.scaled_skip:
            self.on_anomaly(self, micro, res)  # raises AnomalyDetected; the last good checkpoint stays
        lr = self.optimizer.param_groups[0]["lr"]
        with warnings.catch_warnings():  # a skipped (bad) step leaves optimizer.step uncalled
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.scheduler.step()
        self.step += 1
        if res.ok and self.ema is not None:
            self.ema.update(self.model)
        return res, lr

    def _train_step(self, micro: list[Batch], kw: list[dict] | None) -> StepResult:
        t = self.cfg.train
        return train_step(
            self.wrapped,
            self.optimizer,
            micro,
            device_type=self.device.type,
            precision=t.precision,
            scaler=self.scaler,
            grad_clip=t.grad_clip,
            loss_kwargs=kw,
        )

    def _first_compiled_step(self, micro: list[Batch], kw: list[dict] | None) -> StepResult:
        """The first step with ``train.compile``: it compiles. Where compiling fails (no C++
        compiler on the machine, an unsupported op), training continues eagerly with one warning
        instead of stopping: compile changes speed, never what is computed. A failure surfaces in
        the forward, before gradients or the optimizer change anything."""
        self._compile_checked = True
        for _ in range(8):  # a kernel cut short by a killed build is removed, then compiled again
            try:
                return self._train_step(micro, kw)
            except Exception as e:
                if not _is_compile_error(e):
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                err, (note, retry) = e, remove_corrupt_compile_artifacts(e)
            if note:
                self._message(f"note: train.compile: {note}")
            if not retry:
                break
        uncompile(self.model)
        self.compiled = False
        self._message(
            f"warning: train.compile: compiling failed ({type(err).__name__}: {str(err).splitlines()[0][:160]}); "
            "training continues without compile (same results, slower steps)"
            + ("; the cache is repaired, so the next run compiles" if note else "")
        )
        return self._train_step(micro, kw)

    def _check_health(self, res: StepResult) -> None:
        """Count non-finite steps; raise ``TrainingDiverged`` after ``train.max_bad_steps`` in a row."""
        t = self.cfg.train
        if res.ok or res.scaled_skip:
            self.bad_in_row = 0
            return
        self.bad_in_row += 1
        self.bad_total += 1
        self._message(
            f"warning: step {self.step}: non-finite loss/gradient (loss {res.loss}, grad norm "
            f"{res.grad_norm}); update skipped ({self.bad_in_row} in a row, {self.bad_total} total)"
        )
        if self.bad_in_row >= t.max_bad_steps:
            raise TrainingDiverged(
                f"training stopped at step {self.step}: {self.bad_in_row} consecutive steps had a "
                f"NaN/inf loss or gradient (train.max_bad_steps={t.max_bad_steps}). Lower train.lr, "
                f"use train.precision=bf16 or fp32, check the data for NaNs, or resume from an earlier checkpoint."
            )

    def _log_metrics(self, m: dict, lr: float) -> None:
        """metrics.jsonl/TensorBoard record and the printed metrics line for the last interval."""
        m = {**m, "lr": lr, "peak_mem_mb": peak_memory_mb(self.device), "bad_steps": self.bad_total}
        if self.scaler is not None:
            m["loss_scale"] = self.scaler.get_scale()
        self.logger.log(self.step, m)
        self.logger.progress(self.step, m, write=self.bar.write if self.bar is not None else None)

    def _checkpoint_if_due(self, end: int) -> Path | None:
        """Save at ``train.save_every``, at ``end`` and before each evaluation; evaluate when due."""
        t = self.cfg.train
        evaluate_now = t.eval_every > 0 and self.step % t.eval_every == 0
        ckpt = None
        if self.step % t.save_every == 0 or self.step == end or evaluate_now:
            ckpt = self.save(policy=evaluate_now)
        if evaluate_now:
            self.evaluate(ckpt)
        return ckpt

    def _finish(self, last_ckpt: Path | None, losses: list[float], t_start: float) -> dict:
        """Export the final policy folder and write train_summary.json; returns the summary."""
        if last_ckpt is None:  # resumed at the end: nothing new to save
            last_ckpt = ck.latest_checkpoint(self.run_dir)
        final = None
        if last_ckpt is not None and sd.is_sharded(last_ckpt):  # no weights there to copy
            final = self._export_final_gathered()
        elif self.is_main and last_ckpt is not None:
            final = ck.export_final(self.run_dir, last_ckpt)
        self._barrier()
        self.logger.close()
        summary = {
            "steps": self.step,
            "losses": losses,
            "final_loss": losses[-1] if losses else None,
            "bad_steps": self.bad_total,
            "train_s": time.perf_counter() - t_start,
            "final": str(final) if final else None,
        }
        if self.is_main and losses:
            (self.run_dir / "train_summary.json").write_text(
                json.dumps({k: v for k, v in summary.items() if k != "losses"}, indent=2)
            )
        return summary

    def _export_final_gathered(self) -> Path:
        """``<run>/final`` from the live weights, gathered once (collective): sharded checkpoints
        hold no policy folder to copy. Written beside, then renamed, like ``ck.export_final``."""
        tmp, final = self.run_dir / ".tmp-final", self.run_dir / "final"
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()
        self._write_policy(tmp)
        if self.is_main:
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        self._barrier()
        return final

    def evaluate(self, ckpt: Path) -> dict | None:
        """Closed-loop evaluation of ``ckpt`` (its EMA weights when present) on rank 0."""
        res = None
        if self.is_main:
            assert self.evaluator is not None  # checked in __init__ when train.eval_every is set
            policy_dir = ckpt / "ema" if (ckpt / "ema").is_dir() else ckpt
            res = self.evaluator(policy_dir, self.cfg, self.run_dir / "eval" / ck.step_name(self.step))
            rate = res["overall"]["success_rate"]
            self.logger.log(self.step, {"success_rate": rate}, prefix="eval")
            self.logger.message(
                f"eval at step {self.step}: success {rate:.1%} over {res['overall']['n']} episodes"
            )
        self._barrier()
        return res
