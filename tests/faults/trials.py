"""Fault trials shared by ``tests/faults`` (which assert on them) and ``bench/faults.py`` (which counts
and times them). Each trial injects one fault and checks the guarantee; it returns a ``Trial``:
``ok`` and ``clear_s``, the seconds from the fault to a clear outcome (the one-line error printed,
the error reply received, or the resumed run finished bit-exact).

Training faults use the tiny config of tests/train (one layer each, 16 px images, EMA on) on an
in-memory dataset: 3 steps, a checkpoint after each. A fault in the step-2 save leaves step 1 as the
latest checkpoint; ``--resume`` must then run steps 2-3 and end bit-exact with an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from safetensors.torch import load_file

from tests.faults.helpers import PY, ROOT

TRAIN_OV = (
    "train.steps=3", "train.save_every=1", "train.keep_last=3", "train.ema_decay=0.9", "train.preload=true",
    "train.num_threads=1",  # one thread: no spin-waiting on a shared 2-core machine
)  # fmt: skip
FAULT_STEP = 2  # the save that is interrupted
POINTS = ("export_ema", "state", "commit", "latest")  # where in the save the fault hits


@dataclass
class Trial:
    kind: str
    ok: bool
    clear_s: float
    detail: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- training


def train_cfg(*extra: str):
    from tests.train.train_helpers import tiny_cfg

    return tiny_cfg(*TRAIN_OV, *extra)


def run_training(run_dir: Path, resume: bool = False, stop_after: int | None = None) -> dict:
    from tests.train.train_helpers import FakeDataset
    from vlastack.train.trainer import Trainer

    cfg = train_cfg()
    trainer = Trainer(cfg, run_dir=run_dir, dataset=FakeDataset(cfg, n=24), resume=resume, verbose=True)
    return trainer.fit(stop_after=stop_after)


def outcome(run_dir: Path) -> dict:
    """What a run ends with: final weights (raw and EMA) and the logged losses."""
    from vlastack.train.logs import read_metrics

    return {
        "weights": load_file(str(run_dir / "final" / "model.safetensors")),
        "ema": load_file(str(run_dir / "final" / "ema" / "model.safetensors")),
        "losses": [r["train/loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "train/loss" in r],
    }


def same(a: dict, b: dict) -> bool:
    """Bit-exact equality of two ``outcome``s."""
    for k in ("weights", "ema"):
        if a[k].keys() != b[k].keys() or not all(torch.equal(a[k][n], b[k][n]) for n in a[k]):
            return False
    return a["losses"] == b["losses"]


def _hit(action: str) -> None:
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "sigint":  # a real Ctrl-C: Python raises KeyboardInterrupt at the next bytecode
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # Started from a shell that ignores SIGINT (a background job, nohup), where neither
            # Python nor the trainer listens to it: this trial is about Ctrl-C, so it listens itself.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    if action == "enospc":
        raise OSError(errno.ENOSPC, "No space left on device")
    raise AssertionError(f"unknown action {action}")


@contextlib.contextmanager
def inject(point: str, action: str, step: int = FAULT_STEP) -> Iterator[None]:
    """Make the save of ``step`` fail at ``point`` with ``action`` (kill | sigint | enospc).

    The hooks recognise the save by its temporary folder (``.tmp-step_N``) or the ``latest`` text,
    so they do not depend on how the trainer sequences its calls."""
    from vlastack.models.vla import VLA
    from vlastack.train import checkpoint as ck
    from vlastack.train import state as st

    tag = f".tmp-{ck.step_name(step)}"

    def wrap(fn: Callable, match: Callable[..., bool]) -> Callable:
        def hooked(*a, **kw):
            if match(*a, **kw):
                _hit(action)
            return fn(*a, **kw)

        return hooked

    patches = {
        # the EMA copy is exported after ``ema/`` exists: the case that blocked --resume
        "export_ema": mock.patch.object(
            VLA,
            "save_pretrained",
            wrap(VLA.save_pretrained, lambda self, p, *a, **k: str(p).endswith(f"{tag}/ema")),
        ),
        "state": mock.patch.object(st, "save_file", wrap(st.save_file, lambda t, p, *a, **k: tag in str(p))),
        "commit": mock.patch.object(ck, "fsync_tree", wrap(ck.fsync_tree, lambda p: tag in str(p))),
        "latest": mock.patch.object(
            ck, "atomic_write_text", wrap(ck.atomic_write_text, lambda p, text: ck.step_name(step) in text)
        ),
    }
    with patches[point]:
        yield


def child_main(argv: list[str]) -> None:
    """``python -m tests.faults.trials RUN_DIR POINT ACTION``: train with a fault injected."""
    run_dir, point, action = argv
    with inject(point, action):
        run_training(Path(run_dir))


def kill_in_save_trial(tmp: Path, reference: dict, point: str = "export_ema", action: str = "kill") -> Trial:
    """A child process dies (SIGKILL) or is interrupted (SIGINT) inside the step-2 save; then
    ``--resume`` in this process must finish bit-exact with ``reference``."""
    run = tmp / f"run-{point}-{action}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.run(
        [PY, "-m", "tests.faults.trials", str(run), point, action],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    killed = child.returncode == -signal.SIGKILL if action == "kill" else child.returncode != 0
    stale = sorted(p.name for p in (run / "checkpoints").glob(".tmp-*"))
    t0 = time.perf_counter()
    try:
        run_training(run, resume=True)
        ok = killed and same(outcome(run), reference)
        err = ""
    except Exception as e:  # the defect: FileExistsError on the stale temporary folder
        ok, err = False, f"{type(e).__name__}: {e}"
    return Trial(
        f"{action}_in_save", ok, time.perf_counter() - t0,
        {"point": point, "rc": child.returncode, "stale": stale, "error": err, "stderr": child.stderr[-300:]},
    )  # fmt: skip


def in_process_fault_trial(tmp: Path, reference: dict, point: str, action: str) -> Trial:
    """The step-2 save fails in this process (ENOSPC raised, or a real SIGINT); ``--resume`` must
    then finish bit-exact. With ``enospc`` the last metrics line is also left half-written."""
    run = tmp / f"run-{point}-{action}"
    raised = ""
    with inject(point, action):
        try:
            run_training(run)
        except (OSError, KeyboardInterrupt) as e:
            raised = type(e).__name__
    if action == "enospc":
        with open(run / "metrics.jsonl", "a") as f:
            f.write('{"step": 3, "train/lo')
    t0 = time.perf_counter()
    try:
        run_training(run, resume=True)
        ok, err = bool(raised) and same(outcome(run), reference), ""
    except Exception as e:
        ok, err = False, f"{type(e).__name__}: {e}"
    return Trial(
        f"{action}_in_save", ok, time.perf_counter() - t0, {"point": point, "raised": raised, "error": err}
    )


# ----------------------------------------------------------------------------- CLI: bad files


def cli(argv: list[str]) -> tuple[int, str]:
    """Run ``vla ARGV`` in this process; (exit code, stderr). ``vla serve`` must never get to serve."""
    from vlastack.cli import main

    err = io.StringIO()
    with (
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
        mock.patch("vlastack.infer.server.run", side_effect=AssertionError("the bad policy was served")),
    ):
        try:
            rc = main(argv)
        except BaseException as e:  # a traceback would reach the user
            import traceback

            traceback.print_exc(file=err)
            rc = -1 if not isinstance(e, SystemExit) else int(e.code or 0)
    return rc, err.getvalue()


def one_line_error(rc: int, stderr: str, name: str) -> bool:
    """The guarantee: exit 1 or 2, one ``error:`` line naming ``name``, no traceback."""
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
    return (
        rc in (1, 2)
        and "Traceback" not in stderr
        and len(lines) >= 1
        and lines[0].startswith("error: ")
        and name in lines[0]
    )


def corrupt(path: Path, how: str) -> None:
    from tests.faults.helpers import garbage, truncate

    if how == "truncate":
        truncate(path, 0.6)
    elif how == "garbage":
        garbage(path, 3000)
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "delete":
        path.unlink()
    else:
        raise AssertionError(how)


def copy_tree(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    child_main(sys.argv[1:])


# ----------------------------------------------------------------------------- real `vla train` processes


def cli_train_args(dataset: Path, run: Path, steps: int) -> list[str]:
    from tests.faults.cli_trials import CLI_TRAIN

    return ["train", "--data", str(dataset), "--out", str(run), *CLI_TRAIN, f"train.steps={steps}"]


def vla_proc(argv: list[str], **kw: Any) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.pop("VLA_DEBUG", None)
    return subprocess.Popen(
        [PY, "-m", "vlastack.cli", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def cli_reference(dataset: Path, run: Path, steps: int = 6) -> tuple[dict, float]:
    """An uninterrupted `vla train` run: its outcome, and the seconds from its first step to its
    ``done:`` line (the window in which a kill can interrupt training or a save)."""
    proc = vla_proc(cli_train_args(dataset, run, steps))
    t_first = t_done = None
    for line in proc.stdout:
        if t_first is None and f"/{steps} loss" in line:
            t_first = time.perf_counter()
        if line.startswith("done:"):
            t_done = time.perf_counter()
    rc = proc.wait()
    assert rc == 0, proc.stderr.read()
    return outcome(run), (t_done or time.perf_counter()) - (t_first or time.perf_counter())


def random_kill_trial(
    dataset: Path, run: Path, reference: dict, window_s: float, seed: int, steps: int = 6
) -> Trial:
    """SIGKILL `vla train` at a random moment after its first step (uniform over the reference's
    training time, saves included), then `vla train --resume` until done: bit-exact with the reference."""
    import random

    rng = random.Random(seed)
    proc = vla_proc(cli_train_args(dataset, run, steps))
    for line in proc.stdout:
        if f"/{steps} loss" in line:
            break
    delay = rng.uniform(0, window_s)
    time.sleep(delay)
    killed = proc.poll() is None
    proc.kill()
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    ck_root = run / "checkpoints"
    stale = sorted(p.name for p in ck_root.glob(".tmp-*")) if ck_root.exists() else []
    latest = (ck_root / "latest").read_text().strip() if (ck_root / "latest").exists() else None
    t0 = time.perf_counter()
    args = cli_train_args(dataset, run, steps) + (["--resume"] if latest else [])
    r = subprocess.run([PY, "-m", "vlastack.cli", *args], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    dt = time.perf_counter() - t0
    ok = r.returncode == 0 and same(outcome(run), reference)
    detail = {
        "delay_s": round(delay, 3),
        "killed": killed,
        "latest": latest,
        "stale": stale,
        "rc": r.returncode,
    }
    if r.returncode:
        detail["stderr"] = r.stderr[-400:]
    return Trial("kill9_random", ok, dt, detail)


def tmpfs_enospc_trial(dataset: Path, tmp: Path, reference: dict, steps: int = 6) -> Trial | None:
    """A real full disk: the run folder on a tmpfs that holds one checkpoint. `vla train` must stop
    with one line at the second save; with space added, `--resume` ends bit-exact. None if tmpfs
    cannot be mounted here (not root, or no mount permission)."""
    mnt = tmp / "tmpfs"
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode:
        return None
    try:
        # size of one step: measure a 1-step run on the tmpfs itself
        one = mnt / "one"
        r1 = subprocess.run([PY, "-m", "vlastack.cli", *cli_train_args(dataset, one, 1)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)  # fmt: skip
        assert r1.returncode == 0, r1.stderr
        used = sum(p.stat().st_size for p in one.rglob("*") if p.is_file())
        ckpt = sum(p.stat().st_size for p in (one / "checkpoints" / "step_0000001").rglob("*") if p.is_file())
        shutil.rmtree(one)
        size_kb = (used + ckpt // 2) // 1024  # the first checkpoint (and logs) fit, the second does not
        subprocess.run(["mount", "-o", f"remount,size={size_kb}k", str(mnt)], check=True)
        run = mnt / "run"
        t0 = time.perf_counter()
        r2 = subprocess.run([PY, "-m", "vlastack.cli", *cli_train_args(dataset, run, steps)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)  # fmt: skip
        err_lines = [ln for ln in r2.stderr.splitlines() if ln.strip() and not ln.startswith("warning")]
        one_line = r2.returncode == 1 and "Traceback" not in r2.stderr and len(err_lines) == 1
        one_line = one_line and err_lines[0].startswith("error: no space left on device")
        subprocess.run(["mount", "-o", "remount,size=256m", str(mnt)], check=True)  # space freed
        r3 = subprocess.run([PY, "-m", "vlastack.cli", *cli_train_args(dataset, run, steps), "--resume"],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)  # fmt: skip
        dt = time.perf_counter() - t0
        ok = one_line and r3.returncode == 0 and same(outcome(run), reference)
        detail = {
            "size_kb": size_kb,
            "rc_full": r2.returncode,
            "stderr_full": r2.stderr[-300:],
            "rc_resume": r3.returncode,
        }
        if r3.returncode:
            detail["stderr_resume"] = r3.stderr[-300:]
        return Trial("enospc_tmpfs", ok, dt, detail)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
