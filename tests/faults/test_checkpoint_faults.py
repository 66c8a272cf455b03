"""Interrupted checkpoint saves (kill -9, Ctrl-C, a full disk) never block --resume, and the resumed
run ends bit-exact (raw and EMA weights, every logged loss) with an uninterrupted one."""

from __future__ import annotations

import json

import pytest

from tests.faults import trials
from vlastack.train import checkpoint as ck
from vlastack.train.logs import RunLogger, read_metrics


def test_kill9_after_ema_folder_exists_then_resume_bit_exact(tmp_path, reference):
    """The issue's case: SIGKILL once ``.tmp-step_2/ema`` exists; resume used to die (FileExistsError)."""
    t = trials.kill_in_save_trial(tmp_path, reference, "export_ema", "kill")
    assert t.detail["rc"] == -9 and t.detail["stale"] == [".tmp-step_0000002"], t.detail
    assert t.ok, t.detail
    assert not list((tmp_path / "run-export_ema-kill" / "checkpoints").glob(".tmp-*"))  # swept


@pytest.mark.parametrize(("point", "action"), [("export_ema", "sigint"), ("state", "enospc")])
def test_ctrl_c_or_full_disk_in_save_then_resume_bit_exact(tmp_path, reference, point, action):
    """Ctrl-C (a real SIGINT) or ENOSPC mid-save; with ENOSPC the last metrics line is also torn."""
    t = trials.in_process_fault_trial(tmp_path, reference, point, action)
    assert t.detail["raised"] == ("KeyboardInterrupt" if action == "sigint" else "OSError")
    assert t.ok, t.detail


def test_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path, capsys):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "train/loss": 1.0}\n{"step": 2, "train/loss": 0.5}\n{"step": 3, "train/lo')
    assert [r["step"] for r in read_metrics(p)] == [1, 2]
    RunLogger(tmp_path, total_steps=10, start_step=2).close()  # what --resume does at step 2
    assert [json.loads(ln)["step"] for ln in p.read_text().splitlines()] == [1, 2]
    assert "half-written last line" in capsys.readouterr().err


def test_bad_metrics_line_in_the_middle_names_the_file(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2"):
        read_metrics(p)


def test_sweep_removes_every_leftover(tmp_path):
    root = ck.checkpoint_root(tmp_path)
    (root / ".tmp-step_0000004" / "ema").mkdir(parents=True)
    (root / ".latest.tmp").write_text("step_0000004\n")
    (tmp_path / ".tmp-final").mkdir()
    (root / "step_0000002").mkdir()
    removed = ck.sweep(tmp_path)
    assert sorted(p.name for p in removed) == [".latest.tmp", ".tmp-final", ".tmp-step_0000004"]
    assert [p.name for p in root.iterdir()] == ["step_0000002"]
    assert ck.begin(tmp_path, 4).is_dir() and not any(ck.begin(tmp_path, 4).iterdir())


def test_garbage_latest_pointer_falls_back_to_the_newest_folder(tmp_path):
    root = ck.checkpoint_root(tmp_path)
    (root / "step_0000002").mkdir(parents=True)
    (root / "latest").write_bytes(b"\xff\x00../../etc")
    assert ck.latest_checkpoint(tmp_path).name == "step_0000002"


@pytest.mark.slow
@pytest.mark.parametrize("point", trials.POINTS)
@pytest.mark.parametrize("action", ["kill", "sigint"])
def test_every_save_point_kill_and_ctrl_c(tmp_path, reference, point, action):
    t = trials.kill_in_save_trial(tmp_path, reference, point, action)
    assert t.ok, t.detail


@pytest.fixture(scope="module")
def cli_reference(tmp_path_factory, small_dataset):
    return trials.cli_reference(small_dataset, tmp_path_factory.mktemp("cli-ref") / "run")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_kill9_at_a_random_moment_then_resume_bit_exact(tmp_path, small_dataset, cli_reference, seed):
    ref, window = cli_reference
    t = trials.random_kill_trial(small_dataset, tmp_path / "run", ref, window, seed)
    assert t.ok, t.detail


@pytest.mark.slow
def test_real_full_disk_on_tmpfs(tmp_path, small_dataset, cli_reference):
    t = trials.tmpfs_enospc_trial(small_dataset, tmp_path, cli_reference[0])
    if t is None:
        pytest.skip("cannot mount a tmpfs here")
    assert t.ok, t.detail


def test_ctrl_c_trial_passes_when_started_with_sigint_ignored(tmp_path):
    """Issue #34: the suite started from a shell that ignores SIGINT (``nohup``, a background
    job) still passes the Ctrl-C trial: it installs its own handler."""
    import os
    import signal
    import subprocess

    from tests.faults.helpers import PY, ROOT

    code = (
        "import signal, sys, pathlib; signal.signal(signal.SIGINT, signal.SIG_IGN);"
        "from tests.faults import trials; from tests.faults.trials import run_training, outcome;"
        f"tmp = pathlib.Path({str(tmp_path)!r}); run_training(tmp / 'ref'); ref = outcome(tmp / 'ref');"
        "t = trials.in_process_fault_trial(tmp, ref, 'export_ema', 'sigint');"
        "sys.exit(0 if t.ok and t.detail['raised'] == 'KeyboardInterrupt' else 1)"
    )
    proc = subprocess.run([PY, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=300, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
