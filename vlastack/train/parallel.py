"""Distributed setup and the functions that apply memory/parallel strategies to a built model.

Nothing here lives in model code: the model stays a plain ``nn.Module`` and these functions wrap
or patch it from the outside.

- ``apply_activation_checkpointing(model)``: recompute each transformer block in backward.
- ``apply_ddp(model)``: ``DistributedDataParallel`` (returns the wrapper).
- ``apply_fsdp(model, mp_policy)``: FSDP2 ``fully_shard`` per block, then the root (in place);
  with ``mesh=hsdp_mesh(...)`` (a 2-D replicate x shard mesh) it is HSDP: parameters sharded over
  the GPUs of a node and replicated across nodes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str) -> DistInfo:
    """Join the process group when launched by ``torchrun`` (WORLD_SIZE > 1); no-op otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local)


def shutdown_distributed() -> None:
    """Leave the process group after a finished run: ranks meet at a barrier, then tear it down
    (torch asks for an explicit ``destroy_process_group`` rather than cleanup at interpreter exit)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def blocks(model: nn.Module) -> list[nn.Module]:
    """The per-block units of a VLA: its decoder ``JointLayer``s and vision encoder layers."""
    out: list[nn.Module] = []
    for path in ("decoder.layers", "vision.layers"):
        try:
            out.extend(model.get_submodule(path))
        except AttributeError:
            continue
    if not out:
        raise ValueError(f"{type(model).__name__} has no decoder.layers / vision.layers to wrap")
    return out


def _checkpointed(forward, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module) -> int:
    """Recompute each block's activations during backward (saves memory, costs ~1 extra forward).

    Patches the instance ``forward`` so parameter names and state dicts are unchanged and FSDP2
    hooks (registered on ``__call__``) still see the block. Returns the number of blocks patched.
    """
    n = 0
    for block in blocks(model):
        if getattr(block, "_vla_checkpointed", False):
            continue
        block.forward = functools.partial(_checkpointed, block.forward)
        block._vla_checkpointed = True
        n += 1
    return n


def apply_compile(model: nn.Module, regional: bool = False) -> int:
    """``torch.compile`` a model in place (fullgraph, static shapes; parameter names unchanged).

    Whole model (default): the training loss's forward and backward become one graph each, so the
    elementwise chains between the matmuls (GELU-tanh x up, the norms, RoPE, the flow
    interpolation and losses) are fused; on the demo's CPU step this is 1.11-1.24x
    (``bench/results/train_cpu.json``). ``regional``: each block (``blocks``) compiled apart, for
    FSDP2, which shards per block: identical blocks share one graph, it compiles faster and gains
    less (1.03-1.12x). Compilation happens at the first step (~30-50 s on 2 CPU cores, less from
    Inductor's cache); the kernels are cached per ATen CPU capability (``inductor_cache_for_isa``).
    Random draws (the flow noise and time) go through the eager generator
    (``fallback_random``), so a compiled run draws what an eager one draws: compile changes the
    speed, not the computation (the same losses within fp32 reassociation).
    Returns the number of modules compiled."""
    import torch._inductor.config as inductor_config

    inductor_cache_for_isa()
    inductor_config.fallback_random = True
    if not regional:
        model.compile(fullgraph=True, dynamic=False)
        return 1
    n = 0
    for block in blocks(model):
        block.compile(fullgraph=True, dynamic=False)
        n += 1
    return n


def uncompile(model: nn.Module) -> None:
    """Undo ``apply_compile`` (eager again), e.g. when no C++ compiler is available."""
    for m in [model, *blocks(model)]:
        m._compiled_call_impl = None


def inductor_cache_for_isa() -> None:
    """Point Inductor's on-disk cache at a folder per ATen CPU capability (AVX2, AVX512, ...),
    unless ``TORCHINDUCTOR_CACHE_DIR`` is set: with one cache shared by runs under
    ``ATEN_CPU_CAPABILITY=avx2`` and native ones, a compiled step crashed with heap corruption on
    torch 2.13.0, and with a fresh cache it ran."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    import getpass
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    isa = torch.backends.cpu.get_cpu_capability().lower()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}", isa)


# How a cached kernel library that was cut short reads when loaded. A build killed while it wrote
# (Ctrl-C, or a SIGTERM to the process group, while the first step compiles) leaves it behind.
_CORRUPT_ARTIFACT = re.compile(r"(/\S+\.so): (?:file too short|invalid ELF header)")


def remove_corrupt_compile_artifacts(e: BaseException) -> tuple[str, bool]:
    """Delete the cut-short kernel libraries in Inductor's cache after compile error ``e``.

    Inductor keys its cache by source hash and never rebuilds a file that exists. So one library
    left truncated by a killed build makes every later compile of the model fail until it goes:
    a kernel's reads "file too short"; a CPU-feature probe's makes Inductor think the ISA
    unsupported, and the generated C++ no longer compiles. Removed: the library ``e`` names, and
    every library in the cache under 64 bytes (no real one is that small). Returns what was removed
    in words ("" for nothing) and whether ``e`` named it: only then does compiling again in this
    process succeed; a probe's verdict is cached in-process, so its repair counts from the next run."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = Path(cache_dir()).resolve()
    named = {Path(m.group(1)).resolve() for m in _CORRUPT_ARTIFACT.finditer(str(e))}
    named = {p for p in named if root in p.parents and p.is_file()}
    short = (
        {p.resolve() for p in root.rglob("*.so") if p.is_file() and p.stat().st_size < 64}
        if root.is_dir()
        else set()
    )
    gone = sorted(named | short)
    for p in gone:
        p.unlink(missing_ok=True)
    note = f"removed {len(gone)} cut-short cached kernel(s): {', '.join(map(str, gone[:3]))}" if gone else ""
    return note, bool(named)


def apply_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """Wrap in DDP. Frozen parameters are skipped by DDP; every trainable one must get a gradient."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def apply_fsdp(model: nn.Module, mp_policy=None, reshard_after_forward: bool = True, mesh=None) -> nn.Module:
    """FSDP2: ``fully_shard`` every block, then the whole model (in place; returns it).

    ``mp_policy`` is a ``MixedPrecisionPolicy`` (e.g. bf16 params, fp32 reductions) or None.
    ``mesh``: None shards over every rank (FSDP); a 2-D ``("replicate", "shard")`` mesh
    (``hsdp_mesh``) makes ``fully_shard`` do HSDP.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp_policy = mp_policy or MixedPrecisionPolicy()
    kw = {"mp_policy": mp_policy, "reshard_after_forward": reshard_after_forward}
    if mesh is not None:
        kw["mesh"] = mesh
    for block in blocks(model):
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


def hsdp_mesh(device_type: str, world_size: int, node_size: int | None = None):
    """The ``(nodes, node_size)`` device mesh of HSDP: shard within a node, replicate across nodes.

    ``node_size``: ranks per node (default: torchrun's ``LOCAL_WORLD_SIZE``); it must divide the
    world size. One node makes HSDP plain FSDP (a 1 x W mesh).
    """
    from torch.distributed.device_mesh import init_device_mesh

    if node_size is None:
        node_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if node_size < 1 or world_size % node_size:
        raise ValueError(
            f"HSDP: the world size {world_size} is not a whole number of nodes of {node_size} ranks "
            "(LOCAL_WORLD_SIZE): launch the same number of processes on every node"
        )
    return init_device_mesh(
        device_type, (world_size // node_size, node_size), mesh_dim_names=("replicate", "shard")
    )


def fsdp_mp_policy(precision: str):
    """The ``MixedPrecisionPolicy`` for ``train.precision``: low-precision params, fp32 reductions."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if dt is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dt, reduce_dtype=torch.float32)


@contextlib.contextmanager
def no_grad_sync(model: nn.Module, skip: bool) -> Iterator[None]:
    """Skip the gradient all-reduce for a micro-step that does not step the optimizer.

    DDP: ``no_sync()``. FSDP2: ``set_requires_gradient_sync(False)`` (gradients stay unsharded and
    accumulate locally until the stepping micro-step reduce-scatters them).
    """
    if not skip:
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(True)
        yield
        return
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        yield
    else:
        yield


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean over ranks (identity without a process group)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        x = x.detach().clone()
        dist.all_reduce(x)
        x /= dist.get_world_size()
    return x
