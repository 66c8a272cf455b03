"""The peak resident set size of a CPU training process: the tensor peak ``vla plan`` predicts, plus
what a process holds besides tensors.

On CPU the budget that matters is the machine's RAM, and RSS counts more than tensor storages:

- **baseline**: the interpreter and every library a training run imports (torch alone is ~220 MiB
  here, its thread pools and oneDNN/MKL state come on the first ops). Measured, not guessed: a
  fresh interpreter imports what ``vla train`` imports, runs one matmul, and reports its RSS.
- **tensors**, split as the planner splits its peak: what is allocated once and stays
  (parameters, gradients, optimizer state) counts as is; what every step allocates and frees
  (activations, temporaries, the batch) counts ``CHURN_SLACK`` times, since the allocator keeps
  the freed blocks in its free lists and arenas (glibc keeps small blocks, and raises its mmap
  threshold after big ones are freed, so later blocks of that size come from the heap). Plus
  ``TRAINER_STATE_BYTES``. Both fitted by ``bench/plan_rss.py`` on this machine.
- **prefetched batches**: the DataLoader's workers hand ``num_workers x prefetch_factor`` batches
  to the main process ahead of the step (shared memory it maps), on top of the step's own batch.
- **preloaded data** (``train.preload``): every sample in memory, once (``MemoryDataset`` fills
  its tensors in place).

``torch.compile`` (Inductor's compiler state and generated code, several hundred MiB) is not
counted: the prediction says so when ``train.compile`` is on.
"""

from __future__ import annotations

import os
import subprocess
import sys

from vlastack.config import Config

# Fitted on 7 CPU training runs (tiny at batch 8-96, bf16, checkpointing, preload; small at 4) by
# bench/plan_rss.py (bench/results/plan_rss.json): the allocator's slack over the step's transient
# tensor bytes at the peak, and what a running trainer holds beyond the measured baseline (the
# step's autograd and oneDNN caches, the loader threads' arenas). One slack over the whole tensor
# peak (1.3) missed by up to 14%: a big model's peak is mostly weights and optimizer state, which
# do not churn, and a tiny one's mostly activations, which do. A fit on this machine, not a law:
# bench/plan_rss.py re-checks it.
CHURN_SLACK = 1.5
# The slack is glibc's dynamic mmap threshold: after a freed block above it, the threshold rises to
# that block's size (up to 32 MiB), later blocks of that size come from the heap, and the heap keeps
# what is freed. A fixed threshold (MALLOC_MMAP_THRESHOLD_, which turns the adjustment off) maps
# and unmaps every big block: measured, the slack goes to 1.0 (tiny at batch 32/96, LoRA at 64,
# small at 4: within 1.3%) and LoRA's RSS from 877 to 670 MiB, at ~44% fewer samples/s (page faults).
MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"
TRAINER_STATE_BYTES = 100 * 2**20
PERSISTENT = ("parameters", "gradients", "optimizer_state")  # the planner's categories that stay

_BASELINE = """
import resource, torch
import vlastack.train.trainer, vlastack.data.samples, vlastack.data.loader, vlastack.models.vla
torch.set_num_threads({threads})
a = torch.randn(256, 256, requires_grad=True); (a @ a).sum().backward()
if {data!r}:  # the loader's libraries and state: the dataset opened, one sample decoded
    from vlastack.config import load_config
    from vlastack.data.samples import make_dataset
    make_dataset(load_config(**{cfg!r}), {data!r})[0]
try:  # ru_maxrss survives execve on Linux (it would report the parent's RSS at fork): VmHWM does not
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
    print(int(hwm.split()[1]) * 1024)
except OSError:
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def baseline_bytes(threads: int | None = None, cfg_args: dict | None = None, data: str | None = None) -> int:
    """RSS of a fresh interpreter that imported the training stack and ran one op (this machine);
    with ``data``, it also opened the dataset as ``load_config(**cfg_args)`` reads it, one sample."""
    import torch

    code = _BASELINE.format(threads=threads or torch.get_num_threads(), data=data, cfg=cfg_args or {})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:  # e.g. --data that the config cannot read: one line, not a traceback
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(
            f"vla plan: could not measure the process baseline{f' with --data {data}' if data else ''}: {last}"
        )
    return int(out.stdout.strip().splitlines()[-1])


def sample_bytes(cfg: Config, data: str) -> tuple[int, int]:
    """(samples, bytes of one training sample as the trainer holds it) for ``data``."""
    from dataclasses import replace

    from vlastack.data.samples import make_dataset

    ds = make_dataset(replace(cfg, data=replace(cfg.data, streaming=False)), data)
    sample = ds[0]
    return len(ds), sum(v.numel() * v.element_size() for v in sample.values() if hasattr(v, "numel"))


def _baseline_for(cfg: Config, data: str | None) -> int:
    if data is None:
        return baseline_bytes()
    import tempfile
    from pathlib import Path

    from vlastack.config import save_yaml

    with tempfile.TemporaryDirectory() as d:  # the child reads the very same config
        save_yaml(cfg, Path(d) / "cfg.yaml")
        return baseline_bytes(cfg_args={"yaml_path": str(Path(d) / "cfg.yaml")}, data=data)


def predict_rss(cfg: Config, categories: dict[str, int], data: str | None = None) -> dict:
    """Predicted peak RSS (bytes) of ``vla train`` on CPU for ``cfg``: ``categories`` is the
    planner's breakdown of its tensor peak (bytes by category, ``inputs`` = one batch);
    ``data`` sizes the preloaded dataset."""
    d, t = cfg.data, cfg.train
    # a preloaded dataset is gathered in the step's own process: no workers, nothing prefetched
    prefetch = d.num_workers * d.prefetch_factor if d.num_workers > 0 and not t.preload else 0
    persistent = sum(v for k, v in categories.items() if k in PERSISTENT)
    transient = sum(v for k, v in categories.items() if k not in PERSISTENT)
    fixed_mmap = bool(os.environ.get(MMAP_THRESHOLD_ENV))  # inherited by `vla train` run from here
    parts = {
        "baseline": _baseline_for(cfg, data),
        "persistent_tensors": int(persistent),
        "transient_tensors": int(transient * (1.0 if fixed_mmap else CHURN_SLACK)),
        "prefetched_batches": prefetch * categories.get("inputs", 0),
        "trainer_state": TRAINER_STATE_BYTES,
        "preloaded_data": 0,
    }
    notes = []
    if fixed_mmap:
        notes.append(
            f"{MMAP_THRESHOLD_ENV} is set: freed big blocks go back to the OS (no churn slack; fewer samples/s)"
        )
    if t.preload:
        if data is None:
            notes.append("train.preload: pass --data to count the preloaded dataset")
        else:
            n, each = sample_bytes(cfg, data)
            parts["preloaded_data"] = n * each
    if t.compile:
        notes.append("train.compile: Inductor's own memory (several hundred MiB) is not counted")
    return {"rss_bytes": sum(parts.values()), "parts": parts, "notes": notes}
