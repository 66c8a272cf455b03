"""L09 dataloader: the sampler pipeline, which worker builds what, weighted and distributed sampling."""

from __future__ import annotations

import warnings
from collections import Counter

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    WeightedRandomSampler,
    get_worker_info,
)
from torch.utils.data._utils.collate import default_collate

from vlastack.labs._core import Ctx, Finding, Lab

LAB = Lab(
    "dataloader", "Dataset -> Sampler -> BatchSampler -> collate; workers; weighted/distributed sampling"
)


class Numbers(Dataset):
    def __init__(self, n: int = 10) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        info = get_worker_info()
        return {"i": i, "worker": -1 if info is None else info.id}


class NoLen(Dataset):
    """Map-style with only __getitem__."""

    def __getitem__(self, i: int) -> int:
        return i * 10


@LAB.check("S2-20")
def sampler_pipeline(ctx: Ctx) -> Finding:
    shuffled = DataLoader(Numbers(10), batch_size=4, shuffle=True)
    plain = DataLoader(Numbers(10), batch_size=4)
    drop = DataLoader(Numbers(10), batch_size=4, drop_last=True)
    sizes = [len(b["i"]) for b in plain]
    ok = (
        isinstance(shuffled.sampler, RandomSampler)
        and isinstance(plain.sampler, SequentialSampler)
        and isinstance(shuffled.batch_sampler, BatchSampler)
        and sizes == [4, 4, 2]
        and len(drop) == 2
    )
    return Finding(
        f"shuffle=True -> {type(shuffled.sampler).__name__} + {type(shuffled.batch_sampler).__name__}; "
        f"default -> {type(plain.sampler).__name__}; 10 items / 4: batch sizes {sizes}, drop_last -> {len(drop)} batches",
        ok,
        "True: the loader composes a sampler (indices), a batch sampler (lists of indices) and "
        "collate_fn (a list of samples -> a batch).",
    )


@LAB.check("S2-19")
def len_is_optional(ctx: Ctx) -> Finding:
    loader = DataLoader(NoLen(), batch_size=2, sampler=range(4))
    got = [b.tolist() for b in loader]
    try:
        len(DataLoader(NoLen(), batch_size=2, sampler=iter(range(4))))
        err = "no error"
    except TypeError as e:
        err = str(e)
    try:
        next(iter(DataLoader(NoLen(), batch_size=2)))
        default_err = "no error"
    except TypeError as e:
        default_err = str(e)
    ok = got == [[0, 10], [20, 30]] and err != "no error" and default_err != "no error"
    return Finding(
        f"a Dataset with only __getitem__ + an explicit sampler loads {got}; len(loader) -> TypeError "
        f"('{err[:50]}'); with the default sampler, iterating -> TypeError",
        ok,
        "Correction: map-style datasets need __getitem__; __len__ is needed only by the default "
        "samplers and len(loader). IterableDataset needs __iter__ instead of both.",
    )


@LAB.check("S3-03", "S3-08")
def workers_build_whole_batches(ctx: Ctx) -> Finding:
    batches = list(DataLoader(Numbers(16), batch_size=4, num_workers=2))
    workers = [sorted(set(b["worker"].tolist())) for b in batches]
    order = [b["i"].tolist() for b in batches]
    main = next(iter(DataLoader(Numbers(4), batch_size=4, num_workers=0)))["worker"].tolist()
    ok = (
        workers == [[0], [1], [0], [1]]
        and order == [list(range(k, k + 4)) for k in (0, 4, 8, 12)]
        and main == [-1] * 4
    )
    return Finding(
        f"2 workers, batch 4: worker per batch {workers}, batches in order {order[0]}..{order[-1]}; "
        f"num_workers=0: get_worker_info() is None in __getitem__ ({main})",
        ok,
        "Caveat: a worker receives a whole batch of indices, fetches them and collates inside the "
        "worker; batches are dealt round-robin and returned in order. num_workers=0 runs in the main process.",
    )


@LAB.check("S2-21")
def weighted_sampler_is_per_sample(ctx: Ctx) -> Finding:
    n = 120_000
    g = torch.Generator().manual_seed(0)
    idx = list(WeightedRandomSampler(torch.tensor([1.0, 10.0, 1.0]), n, generator=g))
    freq = [Counter(idx)[k] / n for k in range(3)]
    labels = [0] * 90 + [1] * 10  # 90 samples of class 0, 10 of class 1
    counts = Counter(labels)
    w = torch.tensor([1.0 / counts[y] for y in labels])
    drawn = list(WeightedRandomSampler(w, n, generator=g))
    share1 = sum(labels[i] == 1 for i in drawn) / n
    expect = [1 / 12, 10 / 12, 1 / 12]
    ok = all(abs(f - e) < 0.01 for f, e in zip(freq, expect)) and abs(share1 - 0.5) < 0.01
    return Finding(
        f"weights [1, 10, 1]: index frequencies {[round(f, 3) for f in freq]} (1/12, 10/12, 1/12); "
        f"per-class fix (w = 1/count(class)) on a 90/10 dataset -> class 1 share {share1:.3f}",
        ok,
        "Caveat: the weights are per *sample*, not per class; [1, 10, 1] makes sample 1 ten times as "
        "likely. To balance classes, give each sample 1/count(its class).",
    )


@LAB.check("S2-22")
def default_collate_handles_paths(ctx: Ctx) -> Finding:
    samples = [(torch.zeros(3, 4, 4), 1, "a.png"), (torch.ones(3, 4, 4), 2, "b.png")]
    img, label, path = default_collate(samples)
    ok = img.shape == (2, 3, 4, 4) and label.tolist() == [1, 2] and list(path) == ["a.png", "b.png"]
    return Finding(
        f"default_collate on (img, label, path): img {tuple(img.shape)}, label {label}, path {path}",
        ok,
        "Unnecessary here: default_collate stacks tensors, turns numbers into a tensor and keeps strings "
        "as a sequence; a custom collate_fn is for padding variable-length items or custom types.",
    )


@LAB.check("S3-20")
def distributed_sampler_pads(ctx: Ctx) -> Finding:
    ds = list(range(10))
    shards = [list(DistributedSampler(ds, num_replicas=3, rank=r, shuffle=False)) for r in range(3)]
    dropped = [
        list(DistributedSampler(ds, num_replicas=3, rank=r, shuffle=False, drop_last=True)) for r in range(3)
    ]
    total = sum(len(s) for s in shards)
    ok = shards == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]] and sum(len(s) for s in dropped) == 9
    return Finding(
        f"10 items / 3 ranks: {shards} ({total} samples, 0 and 1 twice); drop_last=True: {dropped}",
        ok,
        "Caveat: DistributedSampler pads by repeating samples so every rank gets the same count; "
        "eval metrics then double-count unless drop_last or de-duplication.",
    )


@LAB.check("S3-06", "S0-06")
def pin_memory_without_accelerator(ctx: Ctx) -> Finding:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        batch = next(iter(DataLoader(Numbers(4), batch_size=4, pin_memory=True)))
    msgs = [str(x.message) for x in w if "pin_memory" in str(x.message)]
    pinned = batch["i"].is_pinned() if torch.cuda.is_available() else False
    if torch.cuda.is_available():
        return Finding(
            f"CUDA present: batch pinned {pinned}",
            pinned,
            "The pin-memory thread copied the batch into page-locked memory.",
        )
    return Finding(
        f"no accelerator: warning {msgs[0][:90] if msgs else 'none'!r}; batch pinned: {pinned}",
        bool(msgs) and not pinned,
        "With CUDA, a pin-memory thread in the main process copies each batch into page-locked memory "
        "(one more host copy). Without an accelerator pin_memory only warns and does nothing. The "
        "GPU side (DMA speed, non_blocking) is the gpu_transfer lab.",
    )
