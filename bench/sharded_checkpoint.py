"""Sharded checkpoints under FSDP2 (``train.checkpoint_format=sharded``): what each rank writes.

    PYTHONPATH=. python bench/sharded_checkpoint.py [--preset tiny] [--worlds 1,2,4]

For each world size, ``vla train`` under ``torchrun`` (gloo on 127.0.0.1; FSDP2 above 1 rank)
trains 2 steps of the preset with EMA on a small generated dataset and saves a sharded checkpoint;
the bench records the bytes of each rank's ``dcp/__R_0.distcp`` file against the whole state
(weights, AdamW's two moments and the EMA, fp32: what one gathered copy would be), the largest
rank's share (1/world is the ideal), and the save's wall time from the run's log. Then it resumes
the world-2 checkpoint on every other world size (the target: each resume loads). Writes the
``sharded_checkpoint`` key of bench/results/scale.json (the other keys kept).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import environment

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "scale.json"


def torchrun(world: int, preset: str, data: Path, run: Path, *extra: str) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--nnodes=1", f"--nproc-per-node={world}",
           f"--master-port={port}", "-m", "vlastack.cli", "train", "--preset", preset, "--data", str(data),
           "--out", str(run), f"train.parallel={'fsdp' if world > 1 else 'none'}", "train.checkpoint_format=sharded",
           "train.batch_size=2", "train.ema_decay=0.99", "train.log_every=1", "train.num_threads=1",
           "data.num_workers=0", *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise SystemExit((p.stdout + p.stderr)[-3000:])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--worlds", default="1,2,4")
    args = ap.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    from safetensors import safe_open

    from vlastack.sim.generate import generate

    tmp = Path(tempfile.mkdtemp(prefix="sharded_ckpt_"))
    data = tmp / "data"
    generate(data, episodes=4, workers=0, seed=0, progress=False)
    rows = []
    for w in worlds:
        run = tmp / f"w{w}"
        wall = torchrun(w, args.preset, data, run, "train.steps=2", "train.save_every=2")
        ck = run / "checkpoints" / "step_0000002"
        files = sorted((ck / "dcp").glob("*.distcp"))
        per_rank = [f.stat().st_size for f in files]
        with safe_open(str(run / "final" / "model.safetensors"), "pt") as f:
            weights = 4 * sum(_numel(f.get_slice(k).get_shape()) for k in f)
        whole = 4 * weights  # weights, exp_avg, exp_avg_sq, EMA (fp32; frozen weights have no moments)
        row = {
            "world": w,
            "files": len(files),
            "bytes_per_rank": per_rank,
            "largest_share": round(max(per_rank) / sum(per_rank), 3),
            "ideal_share": round(1 / w, 3),
            "total_bytes": sum(per_rank),
            "whole_state_bytes_upper": whole,
            "model_safetensors_in_checkpoint": (ck / "model.safetensors").exists(),
            "run_wall_s": round(wall, 1),
        }
        rows.append(row)
        print(json.dumps(row))
    resumes = []
    src = tmp / f"w{worlds[1] if len(worlds) > 1 else worlds[0]}"
    for w in worlds:
        run = tmp / f"resume_from_{src.name}_on_{w}"
        shutil.copytree(src, run, ignore=shutil.ignore_patterns("final"))
        torchrun(w, args.preset, data, run, "train.steps=3", "train.save_every=3", "--resume")
        losses = [json.loads(ln).get("train/loss") for ln in (run / "metrics.jsonl").read_text().splitlines()]
        resumes.append({"from_world": int(src.name[1:]), "to_world": w, "resumed": True,
                        "losses": [x for x in losses if x is not None]})  # fmt: skip
        print(json.dumps(resumes[-1]))
    data_out = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data_out["sharded_checkpoint"] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **environment(),
        "preset": args.preset,
        "command": f"bench/sharded_checkpoint.py --preset {args.preset} --worlds {args.worlds}",
        "rows": rows,
        "resumes": resumes,
    }
    RESULTS.write_text(json.dumps(data_out, indent=1) + "\n")
    print(f"wrote {RESULTS} (sharded_checkpoint)")


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    main()
