"""Sharded checkpoints (``train.checkpoint_format=sharded``, torch.distributed.checkpoint): each
rank writes its own shards and nothing is gathered; a run resumes from them bit for bit on the same
world size, and on another (2 -> 1 -> 4 under torchrun, slow) with the same weights, optimizer
state and EMA; the final policy folder is one plain folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import FakeDataset, tiny_cfg

from vlastack.train import checkpoint as ck
from vlastack.train.logs import read_metrics
from vlastack.train.sharded import is_sharded, rescale_position
from vlastack.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
OV = ("train.steps=4", "train.save_every=2", "train.ema_decay=0.9", "train.checkpoint_format=sharded")


def _losses(run):
    return [r["train/loss"] for r in read_metrics(run / "metrics.jsonl")]


def _same_weights(a: Path, b: Path) -> None:
    for sub in ("", "ema/"):
        wa, wb = load_file(str(a / sub / "model.safetensors")), load_file(str(b / sub / "model.safetensors"))
        assert wa.keys() == wb.keys()
        assert all(torch.equal(wa[k], wb[k]) for k in wa), sub


def test_sharded_resume_is_bit_exact_and_the_final_policy_is_one_folder(tmp_path):
    cfg = tiny_cfg(*OV)
    ds = FakeDataset(cfg, n=24)
    a, b = tmp_path / "a", tmp_path / "b"
    full = Trainer(cfg, run_dir=a, dataset=ds).fit()
    Trainer(cfg, run_dir=b, dataset=ds).fit(stop_after=2)
    c = ck.latest_checkpoint(b)
    assert is_sharded(c) and not (c / "model.safetensors").exists()  # no gathered copy
    assert (c / "config.yaml").exists() and len(list((c / "dcp").glob("*.distcp"))) == 1
    Trainer(cfg, run_dir=b, dataset=ds, resume=True).fit()
    assert _losses(a) == _losses(b) == full["losses"]
    _same_weights(a / "final", b / "final")
    from vlastack.infer.policy import Policy

    Policy.from_pretrained(str(b / "final" / "ema"))
    with pytest.raises(ValueError, match=r"sharded training checkpoint.*--resume"):
        Policy.from_pretrained(str(c))


def test_rescaled_position_keeps_the_epoch_and_skips_less_than_one_global_batch():
    n, bs = 100, 4
    assert rescale_position(7, n, bs, 2, 2) == 7
    for old, new in ((2, 1), (1, 4), (2, 4), (4, 2), (1, 3)):
        per_old, per_new = n // (bs * old), n // (bs * new)
        for pos in range(3 * per_old):
            epoch, k = divmod(pos, per_old)
            k2 = rescale_position(pos, n, bs, old, new) - epoch * per_new  # the same epoch
            assert 0 <= k2 <= per_new
            seen_old, seen_new = k * bs * old, k2 * bs * new
            assert seen_new >= seen_old or k2 == per_new  # none of the epoch's samples twice
            assert seen_new < seen_old + bs * new  # less than one new global micro-batch skipped


CONFIG = """\
model:
  vision: {patch_size: 16, depth: 1}
  vlm: {depth: 1}
  expert: {depth: 1}
  num_denoise_steps: 2
train: {log_every: 1, eval_every: 0, num_threads: 1, seed: 3, batch_size: 2, ema_decay: 0.9,
        checkpoint_format: sharded}
data: {num_workers: 0}
"""


def _torchrun(world: int, cfg: Path, data: Path, run: Path, *extra: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nnodes=1", f"--nproc-per-node={world}", f"--master-port={port}",
           "-m", "vlastack.cli", "train", "--config", str(cfg), "--data", str(data), "--out", str(run),
           f"train.parallel={'fsdp' if world > 1 else 'none'}", *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]


@pytest.mark.slow
def test_fsdp_sharded_checkpoints_resume_on_other_world_sizes(sim_data, tmp_path):
    """FSDP2 on 2 ranks writes 2 shard files and no gathered weights; the run resumes on 1 process
    and then on 4 FSDP2 ranks. Each resume reads the same weights and EMA the writer had (its
    final export, taken with nothing left to train, equals the writer's bit for bit), and training
    continues from there: the loss after each resume stays in the range the run had before it."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(CONFIG)
    run = tmp_path / "run"
    _torchrun(2, cfg, sim_data, run, "train.steps=6", "train.save_every=3")
    c = ck.latest_checkpoint(run)
    assert c.name == "step_0000006" and is_sharded(c) and not (c / "model.safetensors").exists()
    assert len(list((c / "dcp").glob("*.distcp"))) == 2  # one file per rank
    two = tmp_path / "two_final"
    (run / "final").rename(two)
    # nothing to train: export only (with the format left to auto, which would write policy folders
    # on one process: the final export still gathers from the sharded checkpoint)
    _torchrun(1, cfg, sim_data, run, "train.steps=6", "train.checkpoint_format=auto", "--resume")
    _same_weights(two, run / "final")
    _torchrun(1, cfg, sim_data, run, "train.steps=9", "train.save_every=3", "--resume")
    one = tmp_path / "one_final"
    (run / "final").rename(one)
    _torchrun(4, cfg, sim_data, run, "train.steps=9", "--resume")
    _same_weights(one, run / "final")
    _torchrun(4, cfg, sim_data, run, "train.steps=12", "train.save_every=3", "--resume")
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r["train/loss"] for r in recs if "train/loss" in r}
    assert sorted(by_step) == list(range(1, 13))
    before = [by_step[s] for s in range(1, 7)]
    assert all(0.5 * min(before) <= by_step[s] <= 1.5 * max(before) for s in range(7, 13)), by_step
