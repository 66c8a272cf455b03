"""What bench/lerobot_metaworld.py (``train``) and bench/lerobot_metaworld_eval.py (``eval``,
``convert``) share: the LeRobot venv's python and entry points, the run folder's file names, JSON
files written atomically, the machine's CPU, LeRobot's environment and versions, and ``Segment``
(one LeRobot run, its output teed to a log, its process tree's CPU time measured, stopped at a
budget). Standard library only, like the two scripts: it runs under any Python (ours or the
LeRobot venv's)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

LEROBOT_PYTHON = os.environ.get("LEROBOT_PYTHON", "/work/lrvenv/bin/python")
TRAIN_MODULE = "lerobot.scripts.lerobot_train"  # console script lerobot-train in 0.6.1
EVAL_MODULE = "lerobot.scripts.lerobot_eval"  # console script lerobot-eval in 0.6.1
# Meta-World's MT10, in Meta-World's order (vlastack/sim/metaworld_tasks.py MT10).
MT10 = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")  # fmt: skip
LEDGER, PLAN, PROBE, RUN_INFO, LOG = "cpu_ledger.json", "plan.json", "probe.json", "run.json", "train_log.txt"
OUT = "lerobot"  # LeRobot's --output_dir inside the run folder
LAST = Path("checkpoints") / "last"
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "WANDB_MODE": "disabled",
}
VERSIONS = (
    "lerobot",
    "torch",
    "torchvision",
    "metaworld",
    "mujoco",
    "accelerate",
    "diffusers",
    "av",
    "draccus",
)


# --------------------------------------------------------------------------------------------- helpers


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def read_json(path: Path, default=None):
    return json.loads(path.read_text()) if path.exists() else default


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)


def task_onehot(data: str | Path | None) -> bool:
    """The dataset's observation.environment_state is the task as a one-hot (a ``vla data
    task-onehot`` copy: every dimension named ``task=<text>``), not a simulator's state."""
    info = read_json(Path(data) / "meta" / "info.json") if data else None
    ft = ((info or {}).get("features") or {}).get("observation.environment_state") or {}
    names = ft.get("names") or []
    return bool(names) and all(isinstance(n, str) and n.startswith("task=") for n in names)


def machine() -> dict:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    return {
        "cpu": model or platform.processor(),
        "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))),
        "cores": len([ln for ln in info.splitlines() if ln.startswith("processor")]),
        "date": datetime.date.today().isoformat(),
    }


def lerobot_env(extra: dict | None = None) -> dict:
    return {**os.environ, **OFFLINE_ENV, **(extra or {})}


def lerobot_query(py: str, code: str) -> str:
    """Run a few lines in the LeRobot venv without importing torch (cheap)."""
    return subprocess.run(
        [py, "-c", code], capture_output=True, text=True, check=True, env=lerobot_env()
    ).stdout


def versions(py: str) -> dict:
    code = (
        "import json, importlib.metadata as m\n"
        f"names = {list(VERSIONS)!r}\n"
        "out = {}\n"
        "for n in names:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = None\n"
        "import sys; out['python'] = sys.version.split()[0]\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(lerobot_query(py, code))


def proc_tree_cpu_s(root: int) -> float:
    """user + system CPU seconds of ``root`` and its live descendants, including the children they
    have already reaped (cutime/cstime): each process is counted once."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        f = raw[raw.rindex(")") + 2 :].split()  # fields from 3 (state) on; comm may hold spaces
        stats[int(d)] = (int(f[1]), sum(int(x) for x in f[11:15]) / tick)  # ppid; utime stime cutime cstime
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo.extend(kids.get(pid, []))
    return total


def prune_checkpoints(out: Path) -> None:
    """Keep the checkpoint that checkpoints/last points to; delete older numbered ones (a finished
    save is the one `last` points to, so a checkpoint being written is never touched)."""
    last = out / LAST
    if not last.is_symlink():
        return
    keep = last.resolve()
    for d in (out / "checkpoints").iterdir():
        old = d.is_dir() and not d.is_symlink() and d.name.isdigit() and d.resolve() != keep
        if old and int(d.name) < int(keep.name):
            shutil.rmtree(d, ignore_errors=True)


STEP_RE = re.compile(rb"\bstep:(\d+(?:\.\d+)?)([KMBTQ]?) smpl:")


class Segment:
    """One run of a LeRobot script: tees its output to a log, reads CPU time at each logged training
    step, stops it when ``budget_s`` (CPU seconds of this segment) is spent."""

    def __init__(self, cmd: list[str], log: Path, budget_s: float | None = None, out: Path | None = None,
                 prune: bool = False, env: dict | None = None, on_tick=None) -> None:  # fmt: skip
        self.cmd, self.log, self.budget_s, self.out, self.prune = cmd, log, budget_s, out, prune
        self.on_tick = on_tick  # called about once a minute with (started, wall s, tree CPU s)
        self.env = env or lerobot_env()
        self.points: list[tuple[int, float, float]] = []  # (step, tree CPU s, wall s) at each log line
        self.tree_cpu, self.stopped_at_budget, self.interrupted = 0.0, False, False

    def _reader(self, proc: subprocess.Popen, t0: float) -> None:
        buf = b""
        with self.log.open("ab") as logf:
            while chunk := os.read(proc.stdout.fileno(), 65536):
                logf.write(chunk)
                logf.flush()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    line = line.split(b"\r")[-1]  # tqdm redraws: show the last one
                    sys.stdout.buffer.write(line + b"\n")
                    m = STEP_RE.search(line)
                    if m:
                        k = {b"": 1, b"K": 1e3, b"M": 1e6, b"B": 1e9, b"T": 1e12, b"Q": 1e15}[m.group(2)]
                        cpu = proc_tree_cpu_s(proc.pid)
                        self.points.append((round(float(m.group(1)) * k), cpu, time.time() - t0))
                sys.stdout.flush()

    def _stop(self, proc: subprocess.Popen) -> None:
        """SIGINT to LeRobot's main process (it unwinds and joins its loader workers), then SIGTERM and
        SIGKILL to its process group if it does not end."""
        for sig, wait_s, group in (
            (signal.SIGINT, 120, False),
            (signal.SIGTERM, 30, True),
            (signal.SIGKILL, 30, True),
        ):
            try:
                os.killpg(proc.pid, sig) if group else os.kill(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def run(self) -> dict:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as f:
            f.write(f"\n### {now()} $ {shlex.join(self.cmd)}\n".encode())
        print("$", shlex.join(self.cmd), flush=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True)  # fmt: skip
        reader = threading.Thread(target=self._reader, args=(proc, t0), daemon=True)
        reader.start()
        started = datetime.datetime.fromtimestamp(t0).isoformat(timespec="seconds")
        last_tick = t0
        try:
            while proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2)
                if proc.poll() is not None:
                    break
                self.tree_cpu = max(self.tree_cpu, proc_tree_cpu_s(proc.pid))
                if self.prune and self.out is not None:
                    prune_checkpoints(self.out)
                if self.on_tick is not None and time.time() - last_tick >= 60:
                    last_tick = time.time()
                    self.on_tick(started, last_tick - t0, self.tree_cpu)
                if self.budget_s is not None and self.tree_cpu >= self.budget_s:
                    print(
                        f"CPU budget reached ({self.tree_cpu / 3600:.3f} CPU-h this segment): stopping",
                        flush=True,
                    )
                    self.stopped_at_budget = True
                    self._stop(proc)
        except KeyboardInterrupt:
            print("interrupted: stopping LeRobot (the segment is still recorded)", flush=True)
            self.interrupted = True
            self._stop(proc)
        rc = proc.wait()
        reader.join(timeout=30)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rusage = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if self.prune and self.out is not None:
            prune_checkpoints(self.out)
        return {
            "started": started,
            "rc": rc,
            "wall_s": round(time.time() - t0, 1),
            "cpu_s": round(max(rusage, self.tree_cpu), 1),
            "cpu_s_rusage": round(rusage, 1),
            "cpu_s_proc_tree": round(self.tree_cpu, 1),
            "stopped_at_budget": self.stopped_at_budget,
            "interrupted": self.interrupted,
            "argv": self.cmd,
            "machine": machine(),
        }


def suite_of(tasks: list[str]) -> str:
    """The metaworld.json section a task list is scored under."""
    return "mt50" if len(tasks) == 50 else "mt10"
