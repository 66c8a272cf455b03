"""Peak-memory readings for logs and benchmarks (CUDA allocator peak, or process peak RSS on CPU)."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_mb(device: torch.device | str = "cpu") -> float:
    """Peak memory in MiB since the last ``reset_peak_memory``.

    CUDA: the caching allocator's peak of allocated tensors. CPU: the process's peak resident set
    size (it cannot be reset, so on CPU this is the peak since the process started).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def reset_peak_memory(device: torch.device | str = "cpu") -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
