"""Labs: every checkable claim in the seed notes, run and measured on this machine.

``vla lab list | run NAME | all [--quick] [--json PATH] [--markdown PATH]``; each lab is also
runnable as ``python -m vlastack.labs.<name>``. The claim table is ``vlastack.labs.claims``.
"""

from __future__ import annotations

import importlib

# In the order `vla lab all` runs them (the audit's L01..L20).
LAB_NAMES = (
    "tensor_storage",
    "memory_access",
    "autograd_basics",
    "micrograd",
    "grad_modes",
    "zero_grad",
    "module_state",
    "hooks",
    "dataloader",
    "worker_sharding",
    "loader_throughput",
    "precision",
    "compile",
    "kv_cache",
    "export",
    "optimizer_memory",
    "distributed",
    "training_hygiene",
    "vla_shapes",
    "gpu_transfer",
)


def load_lab(name: str):
    """-> the ``Lab`` object of lab ``name`` (imports its module)."""
    if name not in LAB_NAMES:
        raise ValueError(f"unknown lab {name!r}; `vla lab list` shows: {', '.join(LAB_NAMES)}")
    return importlib.import_module(f"vlastack.labs.{name}").LAB
