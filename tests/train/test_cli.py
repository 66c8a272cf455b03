"""`vla train` end to end on a simulator-generated dataset, with periodic closed-loop eval and resume."""

from __future__ import annotations

import json

import pytest
import torch

from vlastack.cli import main
from vlastack.config import load_yaml

OV = [
    "model.vision.patch_size=16", "model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1",
    "model.head_options.num_denoise_steps=2", "train.batch_size=8", "train.log_every=2", "train.save_every=2",
    "train.eval_every=2", "eval.episodes=2", "eval.num_workers=0", "eval.videos=0", "data.num_workers=0",
    "train.num_threads=2",
]  # fmt: skip


def test_vla_train_cli_with_eval_and_resume(sim_data, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "--data", str(sim_data), "--out", str(run), *OV]
    assert main([*args, "train.steps=2"]) == 0
    assert main([*args, "train.steps=4", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "samples/s" in out and "data-wait" in out and "MiB" in out
    assert "eval at step 2: success" in out
    assert (run / "eval" / "step_0000002" / "eval.json").exists()
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "train/loss" in r] == [2, 4]
    final = run / "final"
    assert (final / "norm_stats.json").exists()
    assert load_yaml(final / "config.yaml").train.steps == 4
    from vlastack.infer.policy import Policy

    p = Policy.from_pretrained(final)
    assert p.action_dim == 4  # the dataset's action dim, from norm_stats.json


def test_vla_train_with_grounding(sim_data, tmp_path, capsys):
    """Generated sim data carries the grounding targets; both training paths run, the loss terms are
    logged, and the saved policy acts from observations alone (it predicts the positions)."""
    import numpy as np

    from vlastack.infer.policy import Policy
    from vlastack.sim.env import make_env

    run = tmp_path / "run"
    ov = [*OV, "train.eval_every=0", "model.grounding.points=2", "model.grounding.teacher_forcing=0.5",
          "model.grounding.attend_weight=0.1"]  # fmt: skip
    assert main(["train", "--data", str(sim_data), "--out", str(run), *ov, "train.steps=2"]) == 0
    out = capsys.readouterr().out
    assert "(attend " in out and ", flow " in out and ", grounding " in out  # the loss terms, sorted
    rec = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert all(np.isfinite(rec[f"train/{k}_loss"]) for k in ("grounding", "flow", "attend"))
    obs, _ = make_env("reach", image_size=64).reset(seed=1_000_000)
    assert np.isfinite(Policy.from_pretrained(run / "final").infer(obs)["actions"]).all()


def test_vla_train_refuses_mismatched_dataset(sim_data, tmp_path, capsys):
    rc = main(["train", "--data", str(sim_data), "--out", str(tmp_path), *OV, "model.action_dim=2"])
    assert rc == 2
    assert "action has 4 dims, model.action_dim is 2" in capsys.readouterr().err


@pytest.mark.integration
def test_vla_train_under_torchrun_ddp(sim_data, tmp_path):
    """`torchrun --nproc_per_node 2 vla train train.parallel=ddp` on CPU/gloo: both ranks exit 0,
    only rank 0 prints and writes the run folder, and the exported policy loads."""
    import os
    import socket
    import subprocess
    import sys

    from vlastack.infer.policy import Policy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           "-m", "vlastack.cli", "train", "--data", str(sim_data), "--out", str(run), *OV,
           "train.parallel=ddp", "train.steps=2", "train.eval_every=0", "train.num_threads=1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-3000:]
    assert p.stdout.count("done: 2 steps") == 1, log[-3000:]
    assert "terminate called" not in log
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "train/loss" in r] == [2]
    Policy.from_pretrained(str(run / "final"))


@pytest.mark.slow
def test_sigterm_under_torchrun_saves_every_rank_then_resumes(sim_data, tmp_path):
    """Issue #34 item 6 under `torchrun --nproc_per_node 2`: SIGTERM to torchrun reaches both
    ranks, they agree on the step, every rank saves its part (the per-rank RNG/EMA files), and
    `--resume` continues."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from vlastack.train import checkpoint as ck

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    args = ["-m", "vlastack.cli", "train", "--data", str(sim_data), "--out", str(run), *OV, "train.parallel=ddp",
            "train.eval_every=0", "train.num_threads=1", "train.ema_decay=0.9", "train.save_every=1000"]  # fmt: skip
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={port}",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.Popen(
        [*cmd, "train.steps=500"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.time() + 240
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip():
        assert p.poll() is None and time.time() < deadline, p.communicate()
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=180)
    log = out + err
    assert "stopped by SIGTERM at step" in log, log[-3000:]
    latest = ck.latest_checkpoint(run)
    assert latest is not None, log[-3000:]
    for rank in (0, 1):
        assert (latest / "train_state" / f"rank{rank}.json").exists(), sorted(
            (latest / "train_state").iterdir()
        )
    step = int(latest.name.split("_")[1])
    resumed = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                              f"--master_port={port + 1}", *args, f"train.steps={step + 2}", "--resume"],
                             capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]


def test_preload_cache_is_mapped_back_on_resume_and_renamed_by_changes(
    sim_data, tmp_path, monkeypatch, capsys
):
    """``train.preload_cache``: the preloaded samples are written once under <run>/preload; a resumed
    run maps them back instead of decoding (bit-identical tensors), and other settings name another file."""
    from vlastack.data import loader

    run = tmp_path / "run"
    ov = [*OV, "train.eval_every=0", "train.preload=true", "train.preload_cache=true"]
    assert main(["train", "--data", str(sim_data), "--out", str(run), *ov, "train.steps=2"]) == 0
    (first,) = (run / "preload").glob("*.safetensors")
    decoded = loader.load_file(str(first))

    def no_decoding(*a, **k):
        raise AssertionError("decoded although the cache holds these samples")

    seen = []
    real_load = loader.load_file
    monkeypatch.setattr(loader.MemoryDataset, "_decode", no_decoding)
    monkeypatch.setattr(loader, "load_file", lambda p: seen.append(real_load(p)) or seen[-1])
    assert main(["train", "--data", str(sim_data), "--out", str(run), *ov, "train.steps=4", "--resume"]) == 0
    assert len(seen) == 1 and seen[0].keys() == decoded.keys()
    assert all(torch.equal(seen[0][k], decoded[k]) for k in decoded)
    monkeypatch.undo()
    # Another chunk length makes other samples: another name, decoded again.
    other = tmp_path / "other"
    assert main(["train", "--data", str(sim_data), "--out", str(other), *ov, "train.steps=1",
                 "model.action_horizon=4", "eval.steps_per_chunk=4"]) == 0  # fmt: skip
    (second,) = (other / "preload").glob("*.safetensors")
    assert second.name != first.name
    assert (
        main(
            ["train", "--data", str(sim_data), "--out", str(tmp_path / "x"), *OV, "train.preload_cache=true"]
        )
        != 0
    )
    assert "train.preload_cache: needs train.preload=true" in capsys.readouterr().err
