"""Stop signals save before exiting, and one training run per folder (issue #34, items 6 and 7).

SIGTERM (preemption) or a first Ctrl-C finishes the step in flight, saves a checkpoint and ends
training; ``--resume`` then ends bit-exact with an uninterrupted run. ``vla train`` exits 143 on
SIGTERM. A second ``vla train`` into a folder in use, or into a folder that already holds a run
(without ``--resume`` or ``--overwrite``), is refused with one line.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import time
from unittest import mock

import pytest

from tests.faults.cli_trials import CLI_TRAIN
from tests.faults.helpers import PY, ROOT, write_small_dataset
from tests.faults.trials import cli, outcome, same, train_cfg
from tests.train.train_helpers import FakeDataset
from vlastack.cli import main
from vlastack.train import checkpoint as ck
from vlastack.train.runctl import RunLock, TrainingStopped
from vlastack.train.trainer import Trainer


def _trainer(run, **kw) -> Trainer:
    cfg = train_cfg("train.save_every=100")  # no periodic save before the stop: the stop must save
    return Trainer(cfg, run_dir=run, dataset=FakeDataset(cfg, n=24), **kw)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_saves_then_resume_is_bit_exact(tmp_path, reference, sig):
    """A real signal arrives during step 2's forward: step 2 completes, is saved, training stops."""
    from vlastack.train import step as step_mod

    run = tmp_path / "run"
    real, calls = step_mod.train_step, []

    def train_step(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), sig)
        return real(*a, **kw)

    with mock.patch("vlastack.train.trainer.train_step", train_step), pytest.raises(TrainingStopped) as e:
        _trainer(run).fit()
    assert e.value.step == 2 and e.value.exit_code == 128 + sig
    assert ck.latest_checkpoint(run).name == ck.step_name(2)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    _trainer(run, resume=True).fit()
    assert same(outcome(run), reference)


def test_second_ctrl_c_stops_at_once(tmp_path):
    from vlastack.train import step as step_mod

    real, calls = step_mod.train_step, []

    def train_step(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **kw)

    with mock.patch("vlastack.train.trainer.train_step", train_step), pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path / "run").fit()


@pytest.mark.slow
def test_sigterm_to_vla_train_exits_143_then_resumes(tmp_path):
    """A real ``vla train`` process preempted from outside: exit 143 with one line and a checkpoint
    at the step it stopped; ``--resume`` finishes the run."""
    data = write_small_dataset(tmp_path / "ds")
    run = tmp_path / "run"
    args = [
        "train",
        "--data",
        str(data),
        "--out",
        str(run),
        *CLI_TRAIN,
        "train.steps=400",
        "train.save_every=1000",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([PY, "-m", "vlastack.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 240
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    last = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(last) == 1 and "stopped by SIGTERM at step" in last[0] and "--resume" in last[0], err
    assert "Traceback" not in err
    step = int(last[0].split("at step ")[1].split(":")[0])
    assert ck.latest_checkpoint(run).name == ck.step_name(step)
    rc, err = cli([*args, "train.steps=" + str(step + 2), "--resume"])
    assert rc == 0, err


def test_second_run_in_a_folder_in_use_is_refused(tmp_path):
    run = tmp_path / "run"
    held = RunLock(run)
    held.acquire()  # another process would hold it the same way (flock is per open file)
    try:
        with pytest.raises(ValueError, match=r"run folder .*run is in use by vla train pid \d+"):
            _trainer(run)
    finally:
        held.release()
    _trainer(run).fit()  # free again


def test_lock_is_released_when_the_owner_dies(tmp_path):
    run = tmp_path / "run"
    code = f"from vlastack.train.runctl import RunLock; RunLock({str(run)!r}).acquire(); import os; os.kill(os.getpid(), 9)"
    subprocess.run([PY, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lock = RunLock(run)
    lock.acquire()  # kill -9 left no stale lock
    lock.release()


def test_second_generation_into_the_same_dataset_is_refused(tmp_path):
    """Two `vla data generate` into one --out would interleave (or delete) each other's parts."""
    from vlastack.folderlock import FolderLock
    from vlastack.sim.generate import generate

    out = tmp_path / "demos"
    held = FolderLock(tmp_path / ".demos.lock", "vla data generate", "x", "y")
    held.acquire()  # what the running generation holds
    try:
        with pytest.raises(ValueError, match=r"dataset .*demos is in use by vla data generate pid \d+"):
            generate(out, tasks=("reach",), episodes_per_task=1, workers=0, image_size=16, progress=False)
        assert not out.exists() and not (tmp_path / "demos.parts").exists()  # nothing touched
    finally:
        held.release()
    report = generate(out, tasks=("reach",), episodes_per_task=1, workers=0, image_size=16, progress=False)
    assert report["episodes"] == 1  # free again once the holder is gone


def test_folder_holding_a_run_needs_resume_or_overwrite(tmp_path):
    data = write_small_dataset(tmp_path / "ds")
    run = tmp_path / "run"
    args = ["train", "--data", str(data), "--out", str(run), *CLI_TRAIN, "train.steps=1"]
    assert cli(args)[0] == 0
    rc, err = cli(args)
    assert (
        rc == 2 and "already holds a training run (checkpoint step_0000001)" in err and "--overwrite" in err
    )
    (run / "notes.txt").write_text("mine")
    rc, err = cli([*args, "--overwrite"])
    assert rc == 0, err
    assert (run / "notes.txt").read_text() == "mine"  # only the run's own outputs are deleted
    assert ck.latest_checkpoint(run).name == ck.step_name(1)
    rc, err = cli([*args, "--overwrite", "--resume"])
    assert rc == 2 and "pass one of them" in err


def test_resume_refuses_other_data_or_batch_and_logs_harmless_changes(tmp_path):
    """Item 8: a resume that would change the data, its order or its normalization is refused,
    naming the keys; a changed step count or logging interval is allowed and logged."""
    data = write_small_dataset(tmp_path / "ds")
    other = write_small_dataset(tmp_path / "other", lengths=(15, 7, 11))
    run = tmp_path / "run"

    def args(d, *extra):
        return ["train", "--data", str(d), "--out", str(run), *CLI_TRAIN, "train.steps=1", *extra]

    assert cli(args(data))[0] == 0
    rc, err = cli([*args(data, "train.batch_size=2"), "--resume"])
    assert rc == 2 and "train.batch_size is 4 in the checkpoint but 2 now" in err, err
    rc, err = cli([*args(other), "--resume"])
    assert rc == 2 and "normalizer statistics" in err and "observation.state" in err, err
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = main([*args(data, "train.steps=2", "train.log_every=2"), "--resume"])
    assert (
        rc == 0
        and "resuming step_0000001 with changed settings: train.log_every, train.steps" in buf.getvalue()
    )


def test_filesystem_without_flock_runs_unlocked_with_a_warning(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    lock = RunLock(tmp_path / "run")
    with pytest.warns(UserWarning, match="cannot lock"):
        lock.acquire()
    lock.release()
