"""Broken inputs of every kind the CLI reads, and run failures: each must give one ``error:`` line
that names the file (exit 1 or 2), never a traceback. Used by test_cli_faults.py and bench/faults.py.

``Inputs(tmp)`` builds valid inputs once (a policy folder with EMA, a `vla train` run with
checkpoints, a LeRobot dataset, a PaliGemma folder); every case copies what it breaks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from unittest import mock

from tests.faults.helpers import vla, write_small_dataset
from tests.faults.trials import TRAIN_OV, Trial, cli, copy_tree, corrupt, inject, one_line_error

CLI_TRAIN = [
    "model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1", "model.vision.image_size=16",
    "model.max_text_len=8", "model.action_horizon=4", "eval.steps_per_chunk=4", "train.batch_size=4",
    "train.log_every=1", "train.warmup_steps=2", "data.num_workers=0", *TRAIN_OV,
]  # fmt: skip


class Inputs:
    """Valid inputs, built on first use under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @cached_property
    def policy(self) -> Path:
        from tests.faults.conftest import micro_policy

        return micro_policy(self.root / "policy")

    @cached_property
    def dataset(self) -> Path:
        return write_small_dataset(self.root / "dataset")

    @cached_property
    def run(self) -> Path:
        run = self.root / "run"
        rc, err = cli(["train", "--data", str(self.dataset), "--out", str(run), *CLI_TRAIN, "train.steps=2"])
        assert rc == 0, err
        return run

    @cached_property
    def paligemma(self) -> Path:
        rc, err = cli(["export-hf", "--model", str(self.policy), "--out", str(self.root / "hf")])
        assert rc == 0, err
        return self.root / "hf"


def _policy(rel: str, *extra: str) -> Callable[[Inputs, Path], tuple[list[str], Path]]:
    def make(inp: Inputs, d: Path) -> tuple[list[str], Path]:
        p = copy_tree(inp.policy, d / "policy")
        return ["serve", "--policy", str(p), "--port", "0", "--http-port", "-1", *extra], p / rel

    return make


def _checkpoint(rel: str) -> Callable[[Inputs, Path], tuple[list[str], Path]]:
    def make(inp: Inputs, d: Path) -> tuple[list[str], Path]:
        run = copy_tree(inp.run, d / "run")
        argv = [
            "train",
            "--data",
            str(inp.dataset),
            "--out",
            str(run),
            "--resume",
            *CLI_TRAIN,
            "train.preload=false",
        ]
        return argv, (run / "checkpoints" / "step_0000002" / rel if rel != "metrics.jsonl" else run / rel)

    return make


def _dataset(rel: str, command: str = "info") -> Callable[[Inputs, Path], tuple[list[str], Path]]:
    def make(inp: Inputs, d: Path) -> tuple[list[str], Path]:
        ds = copy_tree(inp.dataset, d / "dataset")
        return ["data", command, str(ds)], ds / rel

    return make


def _paligemma(rel: str) -> Callable[[Inputs, Path], tuple[list[str], Path]]:
    def make(inp: Inputs, d: Path) -> tuple[list[str], Path]:
        hf = copy_tree(inp.paligemma, d / "hf")
        return ["import-hf", "--paligemma", str(hf), "--out", str(d / "out")], hf / rel

    return make


def _yaml(inp: Inputs, d: Path) -> tuple[list[str], Path]:
    d.mkdir(parents=True, exist_ok=True)
    p = d / "my.yaml"
    p.write_text("train:\n  lr: 1e-4\n")
    return ["info", "--config", str(p)], p


# kind -> (how the file is broken: the first runs in the default suite, the rest are slow; maker)
CASES: dict[str, tuple[tuple[str, ...], Callable]] = {
    "policy model.safetensors": (("truncate", "garbage", "empty"), _policy("model.safetensors")),
    "policy config.json": (("garbage", "truncate", "delete"), _policy("config.json")),
    "policy norm_stats.json": (("truncate", "garbage"), _policy("norm_stats.json")),
    "policy ema/model.safetensors": (("garbage", "truncate"), _policy("ema/model.safetensors", "--ema")),
    "checkpoint model.safetensors": (("truncate", "garbage"), _checkpoint("model.safetensors")),
    "checkpoint train_state/state.safetensors": (
        ("garbage", "truncate"),
        _checkpoint("train_state/state.safetensors"),
    ),
    "checkpoint train_state/state.json": (("truncate", "garbage"), _checkpoint("train_state/state.json")),
    "checkpoint train_state/rank0.safetensors": (("truncate",), _checkpoint("train_state/rank0.safetensors")),
    "checkpoint config.yaml": (("syntax", "garbage", "delete"), _checkpoint("config.yaml")),
    "run metrics.jsonl": (("garbage",), _checkpoint("metrics.jsonl")),
    "--config YAML": (("syntax", "garbage", "delete"), _yaml),
    "PaliGemma config.json": (("truncate", "delete"), _paligemma("config.json")),
    "PaliGemma model.safetensors": (("truncate", "garbage"), _paligemma("model.safetensors")),
    "dataset meta/info.json": (("garbage",), _dataset("meta/info.json")),
    "dataset meta/stats.json": (("truncate", "garbage"), _dataset("meta/stats.json")),
    "dataset data parquet": (("truncate",), _dataset("data/chunk-000/file-000.parquet")),
}


def bad_file_trial(inp: Inputs, kind: str, how: str, tmp: Path) -> Trial:
    argv, target = CASES[kind][1](inp, tmp / f"{kind.replace(' ', '_').replace('/', '_')}-{how}")
    if how == "syntax":
        target.write_text("model:\n  vision: {depth: [1, 2\n")
    else:
        corrupt(target, how)
    t0 = time.perf_counter()
    rc, err = cli(argv)
    dt = time.perf_counter() - t0
    ok = one_line_error(rc, err, target.name)
    return Trial(f"bad_file:{kind}", ok, dt, {"how": how, "rc": rc, "stderr": err[-500:]})


# ----------------------------------------------------------------------------- run failures


def disk_full_trial(inp: Inputs, tmp: Path) -> Trial:
    run = tmp / "run-enospc"
    with inject("state", "enospc"):
        t0 = time.perf_counter()
        rc, err = cli(["train", "--data", str(inp.dataset), "--out", str(run), *CLI_TRAIN])
    dt = time.perf_counter() - t0
    # the message names the checkpoint folder and what the save needed; the partial folder is gone
    names = f"(writing {run / 'checkpoints'}, about " in err and "MiB needed)" in err
    left = sorted(p.name for p in (run / "checkpoints").glob(".tmp-*"))
    ok = rc == 1 and one_line_error(rc, err, "no space left on device") and names and not left
    return Trial("disk_full_cli", ok, dt, {"rc": rc, "stderr": err[-400:], "left": left})


def ctrl_c_trial(inp: Inputs, tmp: Path) -> Trial:
    run = tmp / "run-sigint"
    with inject("export_ema", "sigint"):
        t0 = time.perf_counter()
        rc, err = cli(["train", "--data", str(inp.dataset), "--out", str(run), *CLI_TRAIN])
    dt = time.perf_counter() - t0
    ok = rc == 130 and "Traceback" not in err and err.startswith("error: interrupted")
    return Trial("ctrl_c_cli", ok, dt, {"rc": rc, "stderr": err[-400:]})


def diverged_trial(inp: Inputs, tmp: Path) -> Trial:
    """A learning rate of 1e30 makes the loss non-finite: ``TrainingDiverged`` as one line, exit 1."""
    run = tmp / "run-diverged"
    t0 = time.perf_counter()
    argv = ["train", "--data", str(inp.dataset), "--out", str(run), *CLI_TRAIN, "train.lr=1e30",
            "train.grad_clip=0", "train.max_bad_steps=1", "train.steps=3"]  # fmt: skip
    rc, err = cli(argv)
    dt = time.perf_counter() - t0
    ok = rc == 1 and one_line_error(rc, err, "consecutive steps had a NaN/inf loss")
    return Trial("training_diverged_cli", ok, dt, {"rc": rc, "stderr": err[-400:]})


def eval_worker_died_trial(inp: Inputs, tmp: Path) -> Trial:
    from vlastack.sim.evaluate import EvalWorkerError

    dead = EvalWorkerError("an evaluation worker process died (crashed, os._exit or killed) while evaluating")
    t0 = time.perf_counter()
    with mock.patch("vlastack.sim.evaluate.evaluate", side_effect=dead):
        rc, err = cli(["eval", "--policy", "random", "--out", str(tmp / "eval")])
    dt = time.perf_counter() - t0
    ok = rc == 1 and one_line_error(rc, err, "evaluation worker process died")
    return Trial("eval_worker_died_cli", ok, dt, {"rc": rc, "stderr": err[-400:]})


def nan_eval_trial(tmp: Path) -> Trial:
    """``vla eval`` of a policy whose weights are NaN: one line naming the policy, no rollout."""
    from tests.faults.conftest import micro_policy

    p = micro_policy(tmp / "nan-eval-policy", nan=True, state_dim=5, action_dim=4)
    t0 = time.perf_counter()
    argv = ["eval", "--policy", str(p), "--tasks", "reach", "--episodes", "1", "--workers", "0",
            "--videos", "0", "--out", str(tmp / "nan-eval")]  # fmt: skip
    rc, err = cli(argv)
    dt = time.perf_counter() - t0
    ok = rc == 2 and one_line_error(rc, err, "NaN")
    return Trial("nan_output_eval", ok, dt, {"rc": rc, "stderr": err[-400:]})


def missing_gl_trial(tmp: Path) -> Trial:
    """No usable OpenGL library for MuJoCo (here: MUJOCO_GL=glfw without a display): one line that
    says what to install, in a fresh process (the GL backend is chosen once per process)."""
    t0 = time.perf_counter()
    r = vla("data", "generate", "--episodes", "1", "--workers", "0", "--tasks", "reach", "--out",
            str(tmp / "gl-data"), env={"MUJOCO_GL": "glfw", "DISPLAY": ""}, timeout=300)  # fmt: skip
    dt = time.perf_counter() - t0
    # glfw's own warnings come first (the user asked for glfw); then exactly one line, no traceback
    lines = [ln for ln in r.stderr.splitlines() if "GLFWError" not in ln]
    ok = r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: MuJoCo cannot render")
    ok = ok and "libosmesa6" in lines[0]
    return Trial("missing_gl_library", ok, dt, {"rc": r.returncode, "stderr": r.stderr[-600:]})


def no_args_trial() -> Trial:
    t0 = time.perf_counter()
    r = vla()
    ok = "usage: vla" in r.stdout and "COMMAND" in r.stdout and "Traceback" not in r.stderr
    return Trial("no_arguments_help", ok, time.perf_counter() - t0, {"rc": r.returncode})


def old_python_trial() -> Trial:
    t0 = time.perf_counter()
    with mock.patch("sys.version_info", (3, 9, 18, "final", 0)):
        rc, err = cli(["info"])
    ok = rc == 2 and err.startswith("error: vlastack needs Python 3.11 or newer; this is 3.9")
    return Trial("unsupported_python", ok, time.perf_counter() - t0, {"rc": rc, "stderr": err[-300:]})
