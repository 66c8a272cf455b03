"""Run logs on rank 0: a progress line, metrics.jsonl, TensorBoard scalars and loss-curve plots."""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vlastack.fileio import BadFileError


def peak_memory_mb(device: torch.device | str = "cpu") -> float:
    """Peak memory in MiB since the last ``reset_peak_memory``.

    CUDA: the caching allocator's peak of allocated tensors. CPU: the process's peak resident set
    size (it cannot be reset, so on CPU this is the peak since the process started).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:  # Linux: the address space's high-water mark. ru_maxrss survives execve, so a process
        # started from a big one (a notebook, a benchmark) would report its parent's peak.
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 2**10
    except (OSError, StopIteration):
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def reset_peak_memory(device: torch.device | str = "cpu") -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


# What every logged step carries; any other key of a metrics record is one of the head's scalars.
STEP_METRICS = frozenset(
    {"loss", "grad_norm", "samples_per_s", "data_wait", "lr", "peak_mem_mb", "bad_steps"}
)


class RunLogger:
    """Writes ``metrics.jsonl`` (one JSON object per logged step), TensorBoard events under
    ``tb/``, and prints progress: an updating bar on a TTY, plain lines otherwise."""

    def __init__(self, run_dir: str | Path, total_steps: int, start_step: int = 0, enabled: bool = True):
        self.run_dir, self.total, self.enabled = Path(run_dir), total_steps, enabled
        self.t0 = time.perf_counter()
        self.tty = sys.stdout.isatty()
        self.tb = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._truncate_after(start_step)
        self.file = open(self.path, "a")  # noqa: SIM115 - closed in close()
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=start_step + 1)
        except ImportError:  # tensorboard is a dependency, but the logs must not die without it
            self.tb = None

    def _truncate_after(self, step: int) -> None:
        """On resume, drop records past the resumed step so the file reads as one run (a torn last
        line, from a crash or a full disk mid-write, is dropped with a warning)."""
        if not self.path.exists():
            return
        keep = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))

    def log(self, step: int, metrics: dict[str, Any], prefix: str = "train") -> None:
        if not self.enabled:
            return
        rec = {"step": step, **{f"{prefix}/{k}": v for k, v in metrics.items()}}
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, int | float):
                    self.tb.add_scalar(f"{prefix}/{k}", v, step)

    def progress(self, step: int, m: dict[str, Any], write: Callable[[str], None] | None = None) -> None:
        """Print the metrics line; ``write``: print through it instead (a live progress bar's)."""
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        width = 24
        done = int(width * step / max(1, self.total))
        bar = "#" * done + "." * (width - done)
        line = (
            f"[{bar}] {step}/{self.total} loss {m['loss']:.4f} lr {m['lr']:.2e} "
            f"gnorm {m['grad_norm']:.2f} {m['samples_per_s']:.1f} samples/s "
            f"data-wait {100 * m['data_wait']:.0f}% mem {m['peak_mem_mb']:.0f} MiB {elapsed:.0f}s"
        )
        parts = [f"{k.removesuffix('_loss')} {v:.4f}" for k, v in sorted(m.items()) if k not in STEP_METRICS]
        if parts:  # the head's scalars, e.g. "flow 0.41, grounding 0.05" or "ce 2.1, token_accuracy 0.44"
            line += " (" + ", ".join(parts) + ")"
        if write is not None:
            write(line)
        elif self.tty:
            print("\r" + line, end="\n" if step >= self.total else "", flush=True)
        else:
            print(line, flush=True)

    def message(self, text: str) -> None:
        if self.enabled:
            print(("\n" if self.tty else "") + text, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self.file.close()
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a ``metrics.jsonl``. A torn last line (the process died mid-write) is skipped
    with a warning; a bad line elsewhere raises ``BadFileError`` naming the file and line."""
    p = Path(path)
    if not p.exists():
        return []
    lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
    out = []
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
            if not isinstance(rec, dict):
                raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
        except ValueError as e:
            if i == len(lines) - 1:
                print(f"warning: {p}: ignoring a half-written last line ({ln[:40]!r})", file=sys.stderr)
                continue
            raise BadFileError(p, f"line {i + 1} is not a JSON object", str(e)[:100]) from None
        out.append(rec)
    return out


def plot_loss(metrics_path: str | Path, out_png: str | Path) -> Path | None:
    """Loss (and learning rate) against step from metrics.jsonl -> PNG. None if nothing logged."""
    recs = [r for r in read_metrics(metrics_path) if "train/loss" in r]
    if not recs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in recs]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [r["train/loss"] for r in recs], lw=1, label="train loss")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot(steps, [r["train/lr"] for r in recs], color="C1", lw=0.8, alpha=0.6, label="lr")
    ax2.set_ylabel("learning rate")
    evals = [r for r in read_metrics(metrics_path) if "eval/success_rate" in r]
    if evals:
        ax.set_title(
            "eval success: " + ", ".join(f"{r['step']}: {r['eval/success_rate']:.0%}" for r in evals[-4:])
        )
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)
