"""vla plan --nodes/--gpus-per-node: per-rank memory under DDP, FSDP2 and HSDP (issue #66 item 4)."""

from __future__ import annotations

import json

import pytest

from tests.diagnostics.helpers import MICRO, micro_cfg
from vlastack.cli import main
from vlastack.diagnostics.plan import simulate
from vlastack.diagnostics.plan_dist import check_cluster, derive_rank, measure_distributed

MiB = 2**20
COUNTS = {"root": 1000, "root_trainable": 1000, "block": 500, "block_trainable": 500, "trainable": 4000}


def _phase(p, g, o, a, t=0):
    cats = {
        "parameters": p,
        "gradients": g,
        "optimizer_state": o,
        "activations": a,
        "inputs": 0,
        "temporaries": t,
    }
    return {"peak_bytes": sum(cats.values()), "categories": cats}


SIM = {
    "peak_bytes": 100 * MiB,
    "phases": {
        "forward": _phase(16 * MiB, 0, 32 * MiB, 40 * MiB),
        "backward": _phase(16 * MiB, 8 * MiB, 32 * MiB, 44 * MiB),
        "optimizer": _phase(16 * MiB, 16 * MiB, 32 * MiB, 0, 40 * MiB),
    },
}


def test_fsdp_divides_the_sharded_categories_and_adds_its_working_set():
    cfg = micro_cfg()
    f4 = derive_rank(SIM, cfg, "fsdp", 1, 4, counts=COUNTS)
    for name, ph in SIM["phases"].items():
        got = f4["phases"][name]["categories"]
        assert got["parameters"] == ph["categories"]["parameters"] // 4
        assert got["optimizer_state"] == ph["categories"]["optimizer_state"] // 4
        assert got["activations"] == ph["categories"]["activations"]  # per rank, unchanged
    opt = f4["phases"]["optimizer"]
    assert (
        opt["categories"]["gradients"] == 4 * MiB and opt["categories"]["temporaries"] == 10 * MiB
    )  # per shard
    fwd = f4["phases"]["forward"]["extra"]
    assert fwd == {
        "root_unsharded": 1000 * 4,
        "blocks_unsharded": 2 * 500 * 4,
    }  # fp32: no MixedPrecisionPolicy
    assert f4["peak_bytes"] == max(p["peak_bytes"] for p in f4["phases"].values())
    # HSDP shards within a node: 2 nodes x 2 GPUs is FSDP over 2 per rank (on NCCL)
    assert derive_rank(SIM, cfg, "hsdp", 2, 2, counts=COUNTS) | {
        "strategy": "x",
        "world_size": 0,
    } == derive_rank(SIM, cfg, "fsdp", 1, 2, counts=COUNTS) | {"strategy": "x", "world_size": 0}
    # one node: HSDP is FSDP
    assert derive_rank(SIM, cfg, "hsdp", 1, 4, counts=COUNTS)["peak_bytes"] == f4["peak_bytes"]
    # bf16: FSDP2 all-gathers bf16 parameters
    bf16 = derive_rank(SIM, micro_cfg("train.precision=bf16"), "fsdp", 1, 4, counts=COUNTS)
    assert bf16["phases"]["forward"]["extra"]["root_unsharded"] == 1000 * 2


def test_ddp_is_a_replica_plus_its_gradient_buckets():
    cfg = micro_cfg()
    d = derive_rank(SIM, cfg, "ddp", 2, 4, counts=COUNTS)
    assert (
        d["peak_bytes"] == SIM["phases"]["optimizer"]["peak_bytes"] + 4000 * 4
    )  # gradient_as_bucket_view=False
    assert d["categories"] == SIM["phases"]["optimizer"]["categories"]  # nothing sharded
    # 8-bit AdamW: ~2.03 bytes of state per trainable parameter instead of 8
    d8 = derive_rank(SIM, cfg, "ddp", 1, 1, optimizer_8bit=True, counts=COUNTS)
    assert d8["categories"]["optimizer_state"] == int(32 * MiB * (2 + 8 / 256) / 8)


def test_cluster_arguments_are_validated(capsys):
    assert check_cluster(2, 8) == 16
    for nodes, gpus in ((0, 1), (1, 0), (-2, 4), (1.5, 2)):
        with pytest.raises(ValueError, match="whole number >= 1"):
            check_cluster(nodes, gpus)
    with pytest.raises(ValueError, match="choose one of ddp, fsdp, hsdp"):
        check_cluster(1, 2, "zero3")
    from vlastack.train.parallel import hsdp_mesh

    with pytest.raises(ValueError, match="not a whole number of nodes"):
        hsdp_mesh("cpu", 6, 4)
    assert main(["plan", "--nodes", "0", "--gpus-per-node", "8"]) == 2
    assert "--nodes must be a whole number >= 1" in capsys.readouterr().err


def test_hsdp_is_a_training_strategy():
    cfg = micro_cfg("train.parallel=hsdp")
    assert cfg.train.parallel == "hsdp"
    with pytest.raises(ValueError, match=r"none\|ddp\|fsdp\|hsdp"):
        micro_cfg("train.parallel=zero3")


def test_vla_plan_cluster_cli(capsys, tmp_path):
    args = [
        "plan",
        *MICRO,
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--target",
        "cpu",
        "--json",
        str(tmp_path / "c.json"),
    ]
    assert main([*args, "--gpu-memory", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert (
        "world 4" in out
        and "HSDP 2x2" in out
        and "FSDP x4" in out
        and "cheapest that fits: DDP, as configured" in out
    )
    p = json.loads((tmp_path / "c.json").read_text())
    assert [r["variant"] for r in p["rows"]] == [
        "as configured",
        "8-bit AdamW",
        "checkpointing",
        "LoRA r=16",
        "all of them",
    ]
    assert p["cheapest"]["overrides"] == ["train.parallel=ddp"]
    # a budget nothing fits: exit status 1
    assert main([*args, "--gpu-memory", "64KiB"]) == 1
    assert "nothing here fits" in capsys.readouterr().out


@pytest.mark.slow  # ~9 s a try; slow because of the gloo timing below, which the default suite should not see
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_world_size_2_gloo_peak_matches_the_prediction(strategy):
    """Two gloo processes at micro shapes: the per-rank prediction within 10% of the largest
    measured per-rank allocator peak. Up to 3 tries: about 1 run in 3 on a loaded 2-core machine,
    one rank also holds a root-sized gloo buffer that its worker thread frees late (+2.6 MiB here),
    which is timing, not what DDP or FSDP2 allocate."""
    cfg = micro_cfg("model.vlm.vocab_size=4096", "train.batch_size=1")  # a large root, as pi0's
    pred = derive_rank(simulate(cfg, 1), cfg, strategy, 1, 2, target="cpu")["peak_bytes"]
    tries = []
    for _ in range(3):
        tries.append(max(r["peak_bytes"] for r in measure_distributed(cfg, 1, strategy, 2)))
        if abs(pred / tries[-1] - 1) <= 0.10:
            break
    assert abs(pred / tries[-1] - 1) <= 0.10, (pred, tries)
