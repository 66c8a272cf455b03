"""``vla doctor``: a short, real training run under the profiler, and what it says.

    report = run_doctor(cfg, out_dir="runs/doctor", data="data/demo", steps=8)

The run uses the project's trainer pieces as ``vla train`` does (``Trainer`` builds the data
loader, model, LoRA, checkpointing, optimizer and scaler; each step is ``train_step``), in four
phases:

1. warm-up steps under ``LiveTensorTracker``: memory at the peak by category and over one step;
2. ``steps`` timed steps with no profiler: step time and data wait (as ``vla train`` logs it);
3. a few steps under ``torch.profiler`` (Chrome trace written): the split of the step, host
   syncs and where they come from, ops per step, top ops (see ``steptime``);
4. optional: inference latency (``--infer``), numerics (``--numerics``), and ``--try``, which
   re-runs phase 2 with each recommendation that maps to a config change and reports the change.

On a CPU, GPU-only measures (busy fraction, CUDA kernels, allocator reserve) are reported as
``null`` with a note, never estimated.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import Dataset

from vlastack.batch import dummy_batch, to_device
from vlastack.config import Config
from vlastack.diagnostics import steptime
from vlastack.diagnostics.memory import LiveTensorTracker, cuda_memory_stats, fmt_bytes, training_roles
from vlastack.train.step import train_step
from vlastack.train.trainer import Trainer


@dataclasses.dataclass
class DoctorOptions:
    steps: int = 8  # timed steps (no profiler)
    warmup: int = 2  # steps under the memory tracker (also warm the loader and caches)
    profile_steps: int = 3
    infer: bool = False
    numerics: bool = False
    try_recs: bool = False
    device: str | None = None


class SyntheticDataset(Dataset):
    """Random well-formed samples (``dummy_batch``) when no dataset is given: the model-side
    diagnosis is real, the data side is not (say so in the report)."""

    def __init__(self, cfg: Config, n: int = 64) -> None:
        self.b = dummy_batch(cfg.model, n)
        self.normalizer = None

    def __len__(self) -> int:
        return self.b["state"].shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.b.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Session:
    """A Trainer plus an instrumented copy of its step loop (the loop body of ``Trainer.fit``)."""

    def __init__(
        self, cfg: Config, run_dir: Path, data=None, dataset=None, device=None, prepare=None
    ) -> None:
        t = replace(cfg.train, steps=10**6, log_every=10**6, save_every=10**6, eval_every=0)
        self.cfg = replace(cfg, train=t)
        if data is None and dataset is None:
            dataset = SyntheticDataset(cfg, n=max(64, 4 * t.batch_size * t.grad_accum))
        self.synthetic = isinstance(dataset, SyntheticDataset)
        self.trainer = Trainer(
            self.cfg, data_path=data, run_dir=run_dir, device=device, dataset=dataset, verbose=False
        )
        if prepare is not None:
            prepare(self.trainer)  # tests seed faults here (a hook with .item(), a NaN weight)
        self.it = self.trainer.batches()
        self.trainer.wrapped.train()
        self.device = self.trainer.device
        self._rf = []
        m = self.trainer.wrapped
        m.register_forward_pre_hook(self._fwd_start)
        m.register_forward_hook(self._fwd_end, always_call=True)
        self.inputs: list[torch.Tensor] = []
        self.health: list[dict] = []  # every step's loss, gradient norm and whether it was applied

    def _fwd_start(self, *_):
        rf = record_function("doctor::forward")
        rf.__enter__()
        self._rf.append(rf)

    def _fwd_end(self, *_):
        if self._rf:
            self._rf.pop().__exit__(None, None, None)

    def step(self, sync: bool = True) -> tuple[float, float, float]:
        """One training step -> (total, data wait, host-to-device) seconds."""
        tr, t = self.trainer, self.cfg.train
        t0 = time.perf_counter()
        with record_function("doctor::step"):
            with record_function("doctor::data"):
                micro = [tr._augment(next(self.it)) for _ in range(t.grad_accum)]
            t1 = time.perf_counter()
            with record_function("doctor::h2d"):
                micro = [to_device(m, self.device) for m in micro]
                if sync:
                    _sync(self.device)
            t2 = time.perf_counter()
            self.inputs = [v for m in micro for v in m.values() if isinstance(v, torch.Tensor)]
            tr.position += t.grad_accum
            res = train_step(tr.wrapped, tr.optimizer, micro, device_type=self.device.type,
                             precision=t.precision, scaler=tr.scaler, grad_clip=t.grad_clip)  # fmt: skip
            self.health.append({"step": tr.step + 1, "loss": res.loss, "grad_norm": res.grad_norm,
                                "ok": res.ok or res.scaled_skip})  # fmt: skip
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
                tr.scheduler.step()
            tr.step += 1
            if sync:
                _sync(self.device)
        return time.perf_counter() - t0, t1 - t0, t2 - t1

    def memory(self, steps: int, snapshot: Path | None = None) -> dict:
        """``steps`` steps under the live-tensor tracker: peak breakdown and the last step's curve.
        On CUDA, ``snapshot``: also record the allocator's history and write it there (open it at
        https://pytorch.org/memory_viz)."""
        tr = self.trainer
        trk = LiveTensorTracker(training_roles(tr.model, tr.optimizer, lambda: self.inputs))
        trk.track([*tr.model.parameters(), *tr.model.buffers()])
        for st in tr.optimizer.state.values():
            trk.track(v for v in st.values() if isinstance(v, torch.Tensor))
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            if snapshot is not None:
                torch.cuda.memory._record_memory_history(max_entries=200_000)
        start = 0
        with trk, trk.watch(tr.model, tr.optimizer):
            for i in range(steps):
                if i == steps - 1:
                    start = len(trk.timeline)
                    t_start = time.perf_counter()
                trk.phase = "data"
                self.step()
        if cuda and snapshot is not None:
            torch.cuda.memory._dump_snapshot(str(snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
        out = trk.breakdown()
        curve = trk.timeline[start:]
        out["over_one_step"] = [
            {"t_s": round(t - t_start, 6), "bytes": b, "phase": ph} for t, b, ph in _thin(curve, 400)
        ]
        out["cuda"] = cuda_memory_stats(self.device)
        out["allocator_overhead_bytes"] = out["cuda"]["allocator_overhead_bytes"] if out["cuda"] else None
        return out

    def timed(self, steps: int) -> dict:
        times = [self.step() for _ in range(steps)]
        total = sum(x[0] for x in times)
        bs = self.cfg.train.batch_size * self.cfg.train.grad_accum
        med = statistics.median(x[0] for x in times)
        return {
            "step_time_s": med,
            "step_times_s": [round(x[0], 5) for x in times],
            "data_wait_fraction": sum(x[1] for x in times) / max(total, 1e-9),
            "h2d_fraction": sum(x[2] for x in times) / max(total, 1e-9),
            "samples_per_s": bs / med,
        }

    def locate_syncs(self, steps: int = 1) -> list[dict]:
        """Source lines of the host syncs in ``steps`` steps (``SyncLocator``)."""
        loc = steptime.SyncLocator()
        with loc:
            for _ in range(steps):
                self.step(sync=False)
        return sorted(({**d, "count_per_step": d["count"] / steps} for d in loc.found.values()),
                      key=lambda d: -d["count"])  # fmt: skip

    def profiled(self, steps: int, trace_path: Path | None) -> dict:
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        hooks = steptime.part_hooks(self.trainer.wrapped)  # per-module ranges: the split by part
        try:
            with profile(activities=acts) as prof:  # no with_stack: Python tracing would skew the split
                for _ in range(steps):
                    self.step(sync=False)
                _sync(self.device)
        finally:
            for h in hooks:
                h.remove()
        if trace_path is not None:
            prof.export_chrome_trace(str(trace_path))
        events = prof.events()
        out = steptime.analyze(events, on_gpu=self.device.type == "cuda")
        out["part_us_per_step"] = steptime.part_times(events)
        return out


def _thin(points: list, n: int) -> list:
    if len(points) <= n:
        return points
    step = len(points) / n
    return [points[int(i * step)] for i in range(n)] + [points[-1]]


# ----------------------------------------------------------------------------- inference


def infer_check(session: Session, calls: int = 5) -> dict:
    """Latency of ``sample_actions`` on one batch, its ops and syncs, and its memory peak."""
    from vlastack.train.step import autocast_ctx

    model, dev = session.trainer.model, session.device
    batch = to_device(next(session.it), dev)
    prec = session.cfg.train.precision

    def call():
        with torch.inference_mode(), autocast_ctx(dev.type, prec), record_function("doctor::step"):
            model.sample_actions(batch)
        _sync(dev)

    model.eval()
    try:
        call()
        lat = []
        for _ in range(calls):
            t0 = time.perf_counter()
            call()
            lat.append(time.perf_counter() - t0)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            call()
        ana = steptime.analyze(prof.events(), on_gpu=dev.type == "cuda")
        loc = steptime.SyncLocator()
        with loc:
            call()
        trk = LiveTensorTracker(training_roles(model, None, batch.values()))
        trk.track([*model.parameters(), *model.buffers(), *batch.values()])
        trk.phase = "inference"
        with trk:
            call()
    finally:
        model.train()
    return {
        "batch_size": int(batch["state"].shape[0]),
        "latency_s": statistics.median(lat),
        "latencies_s": [round(x, 5) for x in lat],
        "kernels_per_call": ana["kernels_per_step"],
        "short_kernel_time_fraction": ana["short_kernel_time_fraction"],
        "host_syncs_per_call": ana["host_syncs"]["per_step"],
        "host_sync_locations": list(loc.found.values()),
        "top_ops": ana["top_ops"][:10],
        "peak_bytes": trk.breakdown()["peak_bytes"],
    }


# ----------------------------------------------------------------------------- the run


def run_doctor(
    cfg: Config,
    out_dir: str | Path,
    opts: DoctorOptions | None = None,
    data: str | Path | None = None,
    dataset=None,
    prepare: Callable | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Diagnose ``cfg``; writes ``report.json``, ``report.html`` and ``trace.json`` under ``out_dir``."""
    from vlastack.diagnostics.advice import recommend, try_recommendations
    from vlastack.diagnostics.report import write_report

    opts = opts or DoctorOptions()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log(
            f"doctor: building the trainer ({'synthetic data' if data is None and dataset is None else data or 'dataset'})"
        )
        s = Session(cfg, Path(tmp) / "run", data, dataset, opts.device, prepare)
        if cfg.train.precision == "auto":  # the report and --try use what the trainer measured
            cfg = replace(cfg, train=replace(cfg.train, precision=s.trainer.cfg.train.precision))
        log(f"doctor: {opts.warmup} warm-up steps under the memory tracker")
        mem = s.memory(opts.warmup, snapshot=out / "cuda_memory_snapshot.pickle")
        log(f"doctor: {opts.steps} timed steps")
        timing = s.timed(opts.steps)
        log(f"doctor: {opts.profile_steps} profiled steps -> {out / 'trace.json'}")
        prof = s.profiled(opts.profile_steps, out / "trace.json")
        prof["host_syncs"]["locations"] = s.locate_syncs()
        on_gpu = s.device.type == "cuda"
        bottleneck, why = steptime.verdict(prof, timing["data_wait_fraction"], on_gpu)
        report = _assemble(s, cfg, opts, mem, timing, prof, bottleneck, why)
        from vlastack.diagnostics.numerics import training_health

        report["training_health"] = training_health(s.health, s.trainer.model, s.trainer.optimizer, cfg.train)
        if report["training_health"]["diverging"] and not opts.numerics:
            log("doctor: the run is diverging: inspecting gradients per module")
            opts = replace(opts, numerics=True)
        if opts.infer:
            log("doctor: inference")
            report["inference"] = infer_check(s)
        if opts.numerics:
            from vlastack.diagnostics.numerics import inspect

            log("doctor: numerics (forward/backward statistics, bf16 drift)")
            batch = to_device(next(s.it), s.device)
            report["numerics"] = inspect(s.trainer.model, batch, precision=cfg.train.precision)
        report["plan_check"] = _plan_check(cfg, mem["peak_bytes"], "cuda" if on_gpu else "cpu")
        report["recommendations"] = recommend(report, cfg, on_gpu, synthetic=s.synthetic)
        del s
        if opts.try_recs:
            log("doctor: --try: re-running with each applicable recommendation")

            def measure(c: Config, name: str) -> tuple[dict, dict]:
                s = Session(c, Path(tmp) / f"try_{name}", data, dataset, opts.device, prepare)
                return s.memory(opts.warmup), s.timed(opts.steps)

            report["tried"] = try_recommendations(cfg, report, measure, log=log)
    write_report(report, out)
    log(summary(report))
    return report


def _assemble(s: Session, cfg: Config, opts, mem, timing, prof, bottleneck, why) -> dict:
    on_gpu = s.device.type == "cuda"
    step = timing["step_time_s"]
    frac = prof["phase_fraction"]
    # Data wait and the copy are measured without the profiler; the rest of the step is split in
    # the proportions the profiled steps show.
    compute = step * (1 - timing["data_wait_fraction"] - timing["h2d_fraction"])
    rest = {k: frac[k] for k in ("forward", "backward", "optimizer", "host_syncs", "other")}
    norm = max(sum(rest.values()), 1e-9)
    breakdown = {"data": step * timing["data_wait_fraction"], "h2d": step * timing["h2d_fraction"]}
    breakdown.update({k: compute * v / norm for k, v in rest.items()})
    t = cfg.train
    # The same step split by model part: the parts' op time (forward + backward) in proportion of
    # the profiled step, the optimizer phase as above, and the rest (Python, dispatch, clipping,
    # the scheduler) as python_and_other.
    scale = compute / max(prof["profiled_step_time_s"] * (1 - frac["data"] - frac["h2d"]), 1e-12)
    by_part = {k: v / 1e6 * scale for k, v in sorted(prof["part_us_per_step"].items(), key=lambda kv: -kv[1])}
    by_part["optimizer"] = breakdown["optimizer"]
    by_part["data"], by_part["h2d"] = breakdown["data"], breakdown["h2d"]
    by_part["python_and_other"] = max(0.0, step - sum(by_part.values()))
    return {
        "schema": "vlastack.doctor/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": str(s.device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "config": {
            "batch_size": t.batch_size,
            "grad_accum": t.grad_accum,
            "precision": t.precision,
            "activation_checkpointing": t.activation_checkpointing,
            "compile": t.compile,
            "lora_rank": t.lora_rank,
            "optimizer": t.optimizer,
            "num_workers": cfg.data.num_workers,
            "preload": t.preload,
            "parallel": t.parallel,
        },
        "synthetic_data": s.synthetic,
        "bottleneck": bottleneck,
        "evidence": why,
        "step_time_s": step,
        "samples_per_s": timing["samples_per_s"],
        "step_times_s": timing["step_times_s"],
        "data_wait_fraction": timing["data_wait_fraction"],
        "breakdown_s": breakdown,
        "parts_s": by_part,
        "profiled": prof,
        "kernels_per_step": prof["kernels_per_step"],
        "kernel_kind": prof["kernel_kind"],
        "short_kernel_time_fraction": prof["short_kernel_time_fraction"],
        "gpu_busy_fraction": prof["gpu_busy_fraction"],
        "host_syncs_per_step": prof["host_syncs"]["per_step"],
        "memory": mem,
        "notes": []
        if on_gpu
        else [
            "CPU run: GPU busy fraction, CUDA kernel counts and allocator reserve are n/a on CPU; "
            "'kernels' are the profiler's leaf CPU ops",
            "host syncs on CPU cost little; each one would stall the GPU queue on CUDA",
        ],
        "options": dataclasses.asdict(opts),
    }


def _plan_check(cfg: Config, measured: int, target: str = "cpu") -> dict | None:
    """The planner's prediction for this config next to the tracker's measurement, for the device
    that ran it (``target``: a GPU runs fused AdamW, whose temporaries differ from the CPU's foreach;
    planned for the CPU, an H200 doctor run read +14.8% against the measured peak)."""
    from vlastack.diagnostics.plan import simulate

    try:
        pred = simulate(cfg, cfg.train.batch_size, target=target)["peak_bytes"]
    except (ValueError, RuntimeError, NotImplementedError) as e:
        return {"error": str(e)}
    err = pred / max(measured, 1) - 1
    return {"predicted_bytes": pred, "measured_bytes": measured, "error": err, "target": target}


def summary(r: dict) -> str:
    """A short text version of the report for the terminal."""
    b = r["breakdown_s"]
    step = r["step_time_s"]
    busy = r["gpu_busy_fraction"]
    busy_s = "n/a on CPU" if busy is None else f"{busy:.0%}"
    lines = [
        f"bottleneck: {r['bottleneck']}  ({'; '.join(r['evidence'])})",
        f"step {step * 1e3:.1f} ms, {r['samples_per_s']:.1f} samples/s: "
        + ", ".join(f"{k} {v / max(step, 1e-12):.0%}" for k, v in b.items()),
        "by part (forward + backward): "
        + ", ".join(f"{k} {v / max(step, 1e-12):.0%}" for k, v in r.get("parts_s", {}).items()),
        f"{r['kernels_per_step']:.0f} {r['kernel_kind']} per step, "
        f"{r['short_kernel_time_fraction']:.0%} of their time in ones < 10 us; "
        f"GPU busy: {busy_s}",
        f"host syncs per step: {r['host_syncs_per_step']:.1f}",
    ]
    for loc in r["profiled"]["host_syncs"]["locations"][:5]:
        lines.append(
            f"  {loc['count_per_step']:.0f}/step at {loc['where']}: {loc['code']}  (via {loc['via']})"
        )
    m = r["memory"]
    cats = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in m["categories"].items())
    lines.append(f"memory peak {fmt_bytes(m['peak_bytes'])} (in {m['phase_at_peak']}): {cats}")
    pc = r.get("plan_check")
    if pc and "predicted_bytes" in pc:
        lines.append(f"vla plan predicted {fmt_bytes(pc['predicted_bytes'])} ({pc['error']:+.1%})")
    if "inference" in r:
        i = r["inference"]
        lines.append(f"inference: {i['latency_s'] * 1e3:.1f} ms per call at batch {i['batch_size']}, "
                     f"{i['kernels_per_call']:.0f} ops, {i['host_syncs_per_call']:.0f} syncs")  # fmt: skip
    if "numerics" in r:
        n = r["numerics"]
        fn = n["first_nonfinite"]
        text = f"first non-finite output in {fn['module']} ({fn['type']})" if fn else "all activations finite"
        if n.get("first_nonfinite_grad"):
            text += (f"; gradients non-finite in {n['modules_nonfinite_grad']} of {n['modules_with_grad']} "
                     f"modules, first (in backward order) {n['first_nonfinite_grad']}")  # fmt: skip
        lines.append("numerics: " + text)
    h = r.get("training_health")
    if h and h["diverging"]:
        first = h["first_nonfinite_step"]
        at = (
            f"from step {first['step']} (loss {first['loss']:.3g}, grad norm {first['grad_norm']:.3g})"
            if first
            else ""
        )
        lines.append(
            f"training: DIVERGING {at}: {h['nonfinite_steps']} of {h['steps']} steps non-finite, "
            f"{h['nonfinite_parameter_count']} parameters and {h['nonfinite_optimizer_state_tensors']} optimizer "
            f"state tensors non-finite. {h['advice']}"
        )
    for rec in r["recommendations"]:
        if rec["applies"]:
            lines.append(
                f"- {rec['title']}: {rec['expected']}"
                + (f"  [{' '.join(rec['overrides'])}]" if rec["overrides"] else "")
            )
    for t in r.get("tried", []):
        lines.append(f"  tried {t['id']}: {t['result']}")
    return "\n".join(lines)


__all__ = ["DoctorOptions", "Session", "SyntheticDataset", "infer_check", "run_doctor", "summary"]
