"""L17 distributed: DDP and FSDP2 with two gloo processes on CPU; DataParallel; what NCCL is for."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import tempfile

import torch
import torch.distributed as dist
from torch import nn

from vlastack.labs._core import Ctx, Finding, Lab

LAB = Lab(
    "distributed", "DDP / FSDP2 on 2 gloo processes: replicas, gradients, buckets, per-rank bytes", slow=True
)

WORLD = 2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 8))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)


def _worker(rank: int, port: int, out: str, backend: str) -> None:
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    res: dict = {}
    t = torch.tensor([float(rank + 1)], device=dev)
    dist.all_reduce(t)
    res["all_reduce"] = t.item()
    if backend == "gloo":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.distributed.fsdp import fully_shard
        from torch.nn.parallel import DistributedDataParallel as DDP

        x, y = _data()
        xs, ys = x.chunk(WORLD)[rank], y.chunk(WORLD)[rank]
        ddp = DDP(_model(), bucket_cap_mb=0.1)  # small buckets, so several all-reduces overlap backward
        buckets: list[int] = []

        def hook(state, bucket):
            buckets.append(bucket.buffer().numel())
            return allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, hook)
        nn.functional.mse_loss(ddp(xs), ys).backward()  # DDP rebuilds its buckets after iteration 1
        ddp.zero_grad()
        buckets.clear()
        nn.functional.mse_loss(ddp(xs), ys).backward()
        grads = torch.cat([p.grad.flatten() for p in ddp.parameters()])
        ref = _model()
        nn.functional.mse_loss(ref(x), y).backward()  # one process, full batch
        res["grad_diff_vs_single"] = (
            (grads - torch.cat([p.grad.flatten() for p in ref.parameters()])).abs().max().item()
        )
        torch.optim.SGD(ddp.parameters(), lr=0.1).step()
        flat = torch.cat([p.detach().flatten() for p in ddp.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(WORLD)]
        dist.all_gather(gathered, flat)
        res["replicas_identical"] = all(torch.equal(gathered[0], g) for g in gathered)
        res["buckets"] = len(buckets)
        res["bucket_elements"] = buckets
        full = _model()
        n_full = sum(p.numel() for p in full.parameters())
        # An explicit CPU mesh: left to itself FSDP2 builds a CUDA mesh whenever CUDA is available
        # (torch's _init_default_fully_shard_mesh), and both gloo ranks would shard onto cuda:0.
        from torch.distributed.device_mesh import init_device_mesh

        fsdp = fully_shard(_model(), mesh=init_device_mesh("cpu", (WORLD,)))
        local = sum(p.to_local().numel() for p in fsdp.parameters())
        opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)
        nn.functional.mse_loss(fsdp(xs), ys).backward()
        opt.step()
        state = sum(
            (v.to_local() if hasattr(v, "to_local") else v).numel()
            for s in opt.state.values()
            for k, v in s.items()
            if k != "step"
        )
        res.update(params_full=n_full, params_local=local, adam_state_local=state)
    dist.barrier()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def _run_ranks(backend: str) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # fork: no second torch import. Not after CUDA or its autograd threads started in this process
    # (the GPU labs run first in one `vla lab run`): a forked child then fails in backward.
    fork = backend != "nccl" and not torch.cuda.is_initialized()
    ctx = mp.get_context("fork" if fork else "spawn")
    with tempfile.TemporaryDirectory() as out:
        procs = [ctx.Process(target=_worker, args=(r, port, out, backend)) for r in range(WORLD)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        codes = [p.exitcode for p in procs]
        if codes != [0] * WORLD:
            raise RuntimeError(f"rank exit codes {codes}")
        return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(WORLD)]


@LAB.check("S0-19", "S4-09", "S0-20", "S0-21", "S1-09")
def ddp_and_fsdp_on_gloo(ctx: Ctx) -> Finding:
    ranks = _run_ranks("gloo")
    r0 = ranks[0]
    share = r0["params_local"] / r0["params_full"]
    state_share = r0["adam_state_local"] / (2 * r0["params_full"])
    rows = [
        {
            "rank": i,
            "all_reduce(rank+1)": r["all_reduce"],
            "DDP buckets": r["buckets"],
            "grad diff vs 1 process": r["grad_diff_vs_single"],
            "FSDP2 params held": r["params_local"],
            "AdamW state elems": r["adam_state_local"],
        }
        for i, r in enumerate(ranks)
    ]
    ok = (
        all(r["all_reduce"] == 3.0 and r["replicas_identical"] for r in ranks)
        and max(r["grad_diff_vs_single"] for r in ranks) < 2e-5
        and r0["buckets"] >= 2
        and share <= 0.55
        and state_share <= 0.55
    )
    return Finding(
        f"2 gloo processes: all_reduce = sum ({r0['all_reduce']:g}); DDP replicas identical after a step "
        f"{all(r['replicas_identical'] for r in ranks)}, grads = one process on the full batch (max diff "
        f"{max(r['grad_diff_vs_single'] for r in ranks):.1e}); {r0['buckets']} gradient buckets all-reduced "
        f"during backward; FSDP2 holds {share:.0%} of the parameters and {state_share:.0%} of AdamW state per rank",
        ok,
        "True: one process per device, identical replicas, averaged gradients. Caveats: DDP all-reduces "
        "gradient *buckets* while backward still runs (overlap); ring vs tree is NCCL's choice by size and "
        "topology; NCCL is the GPU collective library for everything (DDP, FSDP, TP), not DDP-specific; "
        "gloo is the CPU one. FSDP shards parameters, grads and optimizer state ~1/world.",
        rows=rows,
    )


@LAB.check("S0-18")
def data_parallel_on_cpu(ctx: Ctx) -> Finding:
    # DataParallel takes every visible GPU whatever the module's device: on a GPU machine the
    # module and its input must sit on the first one (with one GPU it then just calls the module).
    gpus = list(range(torch.cuda.device_count()))
    dev = torch.device("cuda", 0) if gpus else torch.device("cpu")
    m = _model().to(dev)
    dp = nn.DataParallel(m)
    x, _ = _data()
    x = x.to(dev)
    same = torch.equal(dp(x), m(x))
    where = f"{len(gpus)} GPU(s)" if gpus else "without GPUs"
    return Finding(
        f"nn.DataParallel {where}: device_ids {dp.device_ids}, output identical to the module {same}",
        dp.device_ids == gpus and same,
        "On CPU DataParallel just calls the module. With GPUs it is one process with a thread per device, "
        "scattering inputs and gathering outputs on device 0 every step (hence the imbalance the note "
        "describes); DDP is the recommended path. The GPU comparison needs 2 CUDA devices.",
    )


@LAB.check("S0-21", "S4-09", requires="cuda>=2")
def nccl_all_reduce(ctx: Ctx) -> Finding:
    ranks = _run_ranks("nccl")
    ok = all(r["all_reduce"] == 3.0 for r in ranks)
    return Finding(
        f"NCCL all_reduce on 2 GPUs: {[r['all_reduce'] for r in ranks]}", ok, "NCCL runs every collective."
    )
