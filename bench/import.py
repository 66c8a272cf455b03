"""Import speed and memory for a full-size LeRobot pi0 / pi05 checkpoint (random weights).

    PYTHONPATH=$PWD .venv/bin/python bench/import.py [--kinds pi0 pi05] [--dtype bf16|fp32] [--dir /tmp]

Writes a LeRobot-layout ``model.safetensors`` + ``config.json`` with the public shapes (SigLIP
so400m/14 at 224, Gemma 2B, Gemma 300M expert, the ``model.`` prefix, both unused LM heads) in
``--dir`` (not the repo), streaming one tensor at a time. ``--dtype bf16`` stores what LeRobot's
``dtype="bfloat16"`` keeps (vision tower, projector and norms fp32, the rest bf16); ``fp32`` all
fp32. Then, in a fresh process per run, ``models.convert.lerobot.load_checkpoint`` builds the
model on the meta device and reads each tensor once into the memory it keeps (assign=True):
wall time and peak RSS (``ru_maxrss``) against the bytes of the weights it reads. Runs "cold" (the
file's pages dropped from the page cache with posix_fadvise DONTNEED, so it reads from disk) and
"warm" (second read). Targets: <= 20 s, peak RSS <= 1.3x the weights. Results:
bench/results/import.json. The machine is shared with other jobs: figures are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import write_results

V = dict(width=1152, depth=27, mlp=4304, patch=14, image=224)
G = {"gemma_2b": dict(width=2048, depth=18, mlp=16384), "gemma_300m": dict(width=1024, depth=18, mlp=4096)}
HEADS, KV, HEAD_DIM, VOCAB, MAX_DIM = 8, 1, 256, 257152, 32
_DT = {torch.float32: "F32", torch.bfloat16: "BF16"}


def lerobot_shapes(kind: str) -> dict[str, tuple[int, ...]]:
    """Every tensor LeRobot's PI0Policy / PI05Policy saves, with the public shapes."""
    pg = "model.paligemma_with_expert.paligemma.model."
    vt = pg + "vision_tower.vision_model."
    w, e = G["gemma_2b"], G["gemma_300m"]
    s: dict[str, tuple[int, ...]] = {
        vt + "embeddings.patch_embedding.weight": (V["width"], 3, V["patch"], V["patch"]),
        vt + "embeddings.patch_embedding.bias": (V["width"],),
        vt + "embeddings.position_embedding.weight": ((V["image"] // V["patch"]) ** 2, V["width"]),
        vt + "post_layernorm.weight": (V["width"],),
        vt + "post_layernorm.bias": (V["width"],),
        pg + "multi_modal_projector.linear.weight": (w["width"], V["width"]),
        pg + "multi_modal_projector.linear.bias": (w["width"],),
        pg + "language_model.embed_tokens.weight": (VOCAB, w["width"]),
        pg + "language_model.norm.weight": (w["width"],),
        "model.paligemma_with_expert.paligemma.lm_head.weight": (VOCAB, w["width"]),
        "model.paligemma_with_expert.gemma_expert.lm_head.weight": (VOCAB, e["width"]),
    }
    for i in range(V["depth"]):
        p = f"{vt}encoder.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            s[p + f"self_attn.{n}.weight"] = (V["width"], V["width"])
            s[p + f"self_attn.{n}.bias"] = (V["width"],)
        for n in ("layer_norm1", "layer_norm2"):
            s[p + f"{n}.weight"] = s[p + f"{n}.bias"] = (V["width"],)
        s[p + "mlp.fc1.weight"], s[p + "mlp.fc1.bias"] = (V["mlp"], V["width"]), (V["mlp"],)
        s[p + "mlp.fc2.weight"], s[p + "mlp.fc2.bias"] = (V["width"], V["mlp"]), (V["width"],)
    stems = [(pg + "language_model.", w, False), ("model.paligemma_with_expert.gemma_expert.model.", e, True)]
    for stem, d, expert in stems:
        ada = expert and kind == "pi05"
        for i in range(d["depth"]):
            p = f"{stem}layers.{i}."
            s[p + "self_attn.q_proj.weight"] = (HEADS * HEAD_DIM, d["width"])
            s[p + "self_attn.k_proj.weight"] = (KV * HEAD_DIM, d["width"])
            s[p + "self_attn.v_proj.weight"] = (KV * HEAD_DIM, d["width"])
            s[p + "self_attn.o_proj.weight"] = (d["width"], HEADS * HEAD_DIM)
            s[p + "mlp.gate_proj.weight"] = s[p + "mlp.up_proj.weight"] = (d["mlp"], d["width"])
            s[p + "mlp.down_proj.weight"] = (d["width"], d["mlp"])
            for n in ("input_layernorm", "post_attention_layernorm"):
                if ada:
                    s[p + f"{n}.dense.weight"], s[p + f"{n}.dense.bias"] = (
                        (3 * d["width"], d["width"]),
                        (3 * d["width"],),
                    )
                else:
                    s[p + f"{n}.weight"] = (d["width"],)
        if expert:
            if ada:
                s[stem + "norm.dense.weight"], s[stem + "norm.dense.bias"] = (
                    (3 * e["width"], e["width"]),
                    (3 * e["width"],),
                )
            else:
                s[stem + "norm.weight"] = (e["width"],)
    ew = e["width"]
    s["model.action_in_proj.weight"], s["model.action_in_proj.bias"] = (ew, MAX_DIM), (ew,)
    s["model.action_out_proj.weight"], s["model.action_out_proj.bias"] = (MAX_DIM, ew), (MAX_DIM,)
    if kind == "pi0":
        s["model.state_proj.weight"], s["model.state_proj.bias"] = (ew, MAX_DIM), (ew,)
        s["model.action_time_mlp_in.weight"], s["model.action_time_mlp_in.bias"] = (ew, 2 * ew), (ew,)
        s["model.action_time_mlp_out.weight"], s["model.action_time_mlp_out.bias"] = (ew, ew), (ew,)
    else:
        for n in ("time_mlp_in", "time_mlp_out"):
            s[f"model.{n}.weight"], s[f"model.{n}.bias"] = (ew, ew), (ew,)
    return s


def stored_dtype(name: str, dtype: str) -> torch.dtype:
    """LeRobot's ``to_bfloat16_for_selected_params``: these stay fp32 under dtype=bfloat16."""
    keep = (
        "vision_tower",
        "multi_modal_projector",
        "input_layernorm",
        "post_attention_layernorm",
        "model.norm",
    )
    return torch.float32 if dtype == "fp32" or any(k in name for k in keep) else torch.bfloat16


def write_checkpoint(folder: Path, kind: str, dtype: str) -> int:
    """Stream a random checkpoint to ``folder`` one tensor at a time. -> file bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    shapes = lerobot_shapes(kind)
    header, offset = {}, 0
    for name, shape in shapes.items():
        dt = stored_dtype(name, dtype)
        n = int(torch.Size(shape).numel()) * dt.itemsize
        header[name] = {"dtype": _DT[dt], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    # Random values without drawing 3.3B normals (minutes on a shared 2-core CPU): each tensor is a
    # window of a 16M-value random pool at a random offset. The loader never looks at the values.
    g = torch.Generator().manual_seed(0)
    pool = {dt: (torch.randn(2**24, generator=g) * 0.02).to(dt) for dt in _DT}
    t0 = time.time()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for i, (name, shape) in enumerate(shapes.items()):
            src, n = pool[stored_dtype(name, dtype)], int(torch.Size(shape).numel())
            start = int(torch.randint(0, 2**24, (1,), generator=g))
            while n > 0:
                chunk = src[start : start + n]
                f.write(chunk.view(torch.uint8).numpy().tobytes())
                n, start = n - chunk.numel(), 0
            if i % 100 == 0:
                print(f"  writing {kind}: {i}/{len(shapes)} tensors, {time.time() - t0:.0f} s", flush=True)
    cams = {f"observation.images.{c}": {"type": "VISUAL", "shape": [3, 224, 224]}
            for c in ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")}  # fmt: skip
    cfg = {
        "type": kind,
        "input_features": {**cams, "observation.state": {"type": "STATE", "shape": [32]}},
        "output_features": {"action": {"type": "ACTION", "shape": [32]}},
        "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m",
        "dtype": "bfloat16" if dtype == "bf16" else "float32",
        "chunk_size": 50,
        "max_state_dim": 32,
        "max_action_dim": 32,
        "num_inference_steps": 10,
        "tokenizer_max_length": 200 if kind == "pi05" else 48,
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return (folder / "model.safetensors").stat().st_size


def drop_cache(file: Path) -> None:
    fd = os.open(file, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_read_s(file: Path, cold: bool) -> float:
    """The floor: seconds to read the file's bytes into one reused 64 MiB buffer (disk or page cache)."""
    if cold:
        drop_cache(file)
    buf = bytearray(64 * 2**20)
    t0 = time.perf_counter()
    with open(file, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def measure_child(folder: str) -> None:
    """Run in a fresh process: load, then print one JSON line."""
    t0 = time.perf_counter()
    from vlastack.models.convert.lerobot import load_checkpoint
    from vlastack.models.convert.safetensors_io import read_folder_header

    t1 = time.perf_counter()
    model, kind, _ = load_checkpoint(folder, dtype=None)
    t2 = time.perf_counter()
    params = sum(p.numel() for p in model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())
    read = sum(i.nbytes for k, i in read_folder_header(folder).items() if "lm_head" not in k)
    print(json.dumps({
        "kind": kind, "load_s": t2 - t1, "import_s": t1 - t0, "params": params, "model_bytes": nbytes,
        "bytes_read": read, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))  # fmt: skip


def run_child(folder: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(folder)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_flags() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return ""
    lines = [ln for ln in out.splitlines() if ln.startswith(("Model name", "CPU(s)", "Flags"))]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["pi0", "pi05"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/vlastack_import_bench"))
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return measure_child(args.child)
    rows = []
    for kind in args.kinds:
        folder = args.dir / f"{kind}_{args.dtype}"
        size = write_checkpoint(folder, kind, args.dtype)
        for mode in ("cold", "warm"):
            raw = raw_read_s(folder / "model.safetensors", cold=mode == "cold")
            if mode == "cold":
                drop_cache(folder / "model.safetensors")
            r = run_child(folder)
            r.update(mode=mode, dtype=args.dtype, file_bytes=size, raw_file_read_s=raw)
            r["rss_over_weights"] = r["peak_rss_bytes"] / r["bytes_read"]
            rows.append(r)
            print(f"{kind} {args.dtype} {mode}: {r['params'] / 1e9:.2f}B params, load {r['load_s']:.1f} s, "
                  f"peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB = {r['rss_over_weights']:.2f}x the "
                  f"{r['bytes_read'] / 2**30:.2f} GiB read (reading the whole file alone: {raw:.1f} s)", flush=True)  # fmt: skip
        if not args.keep:
            (folder / "model.safetensors").unlink()
    path = write_results(
        "import",
        {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine_note": "2-core CPU VM, 24 GB RAM; other jobs on the machine make timings noisy (say so when re-running)",
            "lscpu": cpu_flags(),
            "targets": {"load_s": 20, "rss_over_weights": 1.3},
            "dtype_note": "bf16 = LeRobot's dtype='bfloat16' layout (vision, projector, norms fp32); the "
            "public files' dtypes could not be checked offline. Unused LM heads are in the file, not read.",
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
