"""lerobot-eval's side of bench/lerobot_metaworld.py: LeRobot's policies scored in LeRobot's own
Meta-World or LIBERO environment (``--env``) on vlastack's evaluation seeds, in chunks of tasks kept as they finish
(``--chunk-tasks``), optionally side by side (``--parallel``), and converted to our eval.json.
Standard library only, like bench/lerobot_metaworld.py (whose ``eval`` and ``convert`` commands
these are: its command line imports them from here; what both use is in bench/lerobot_common.py)."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.lerobot_common import (
    EVAL_MODULE,
    LAST,
    MT10,
    OUT,
    RUN_INFO,
    Segment,
    lerobot_env,
    lerobot_query,
    read_json,
    suite_of,
    versions,
    write_json,
)


def expand_tasks(spec: str, py: str) -> list[str]:
    """MT10 (ours), MT50 or LeRobot's difficulty groups (its metaworld_config.json), or task names."""
    groups: dict[str, list[str]] = {}
    if any(s.strip() not in ("MT10",) and not s.strip().endswith("-v3") for s in spec.split(",")):
        where = lerobot_query(
            py, "import importlib.util as u; print(u.find_spec('lerobot').submodule_search_locations[0])"
        )
        groups = json.loads((Path(where.strip()) / "envs" / "metaworld_config.json").read_text())[
            "DIFFICULTY_TO_TASKS"
        ]
    out: list[str] = []
    for item in (s.strip().replace("metaworld-", "") for s in spec.split(",") if s.strip()):
        if item.upper() == "MT10":
            names = list(MT10)
        elif item.upper() == "MT50":
            names = [t for g in ("easy", "medium", "hard", "very_hard") for t in groups[g]]
        else:
            names = groups.get(item, [item])
        out += [n for n in names if n not in out]
    return out


# lerobot/envs/libero.py TASK_SUITE_MAX_STEPS (vlastack/sim/libero.py MAX_STEPS; this file imports
# nothing outside the standard library) and each suite's task count.
LIBERO_MAX_STEPS = {"libero_spatial": 280, "libero_object": 280, "libero_goal": 300, "libero_10": 520,
                    "libero_90": 400}  # fmt: skip
LIBERO_TASKS = {
    "libero_spatial": 10,
    "libero_object": 10,
    "libero_goal": 10,
    "libero_10": 10,
    "libero_90": 90,
}


def expand_libero(spec: str) -> tuple[str, list[str]]:
    """``libero_object`` (every task) or ``libero_object/0,libero_object/3`` -> (suite, vlastack's
    task keys ``<suite>/<id>``). One suite per evaluation, as lerobot-eval's ``--env.task``."""
    items = [s.strip() for s in spec.split(",") if s.strip()]
    suites = {i.split("/")[0] for i in items}
    if len(suites) != 1 or next(iter(suites)) not in LIBERO_TASKS:
        sys.exit(
            f"--tasks {spec!r}: give one LIBERO suite ({', '.join(LIBERO_TASKS)}) or its tasks as SUITE/ID"
        )
    suite = suites.pop()
    if items == [suite]:
        return suite, [f"{suite}/{i}" for i in range(LIBERO_TASKS[suite])]
    ids = [i.split("/", 1)[1] if "/" in i else "" for i in items]
    if not all(x.isdigit() and int(x) < LIBERO_TASKS[suite] for x in ids):
        sys.exit(f"--tasks {spec!r}: {suite} task ids are 0..{LIBERO_TASKS[suite] - 1}")
    return suite, [f"{suite}/{int(x)}" for x in ids]


def libero_config(py: str, where: Path) -> dict:
    """LIBERO's config for lerobot-eval: ``LIBERO_CONFIG_PATH`` -> a ``config.yaml`` naming the
    package's own BDDL, init-state and asset folders (without one, LeRobot's ``hf-libero`` asks on
    stdin at import and then downloads assets from the Hub). Written as JSON, which YAML reads."""
    root = (
        Path(
            lerobot_query(
                py, "import importlib.util as u; print(u.find_spec('libero').submodule_search_locations[0])"
            ).strip()
        )
        / "libero"
    )
    if not (root / "assets").exists():
        sys.exit(
            f"{root / 'assets'} is missing: LeRobot's LIBERO would download its assets. Link libero-pro's "
            "there (scripts/make_libero_lerobot_fixture.py --assets DIR does it once)"
        )
    where.mkdir(parents=True, exist_ok=True)
    paths = {"benchmark_root": str(root), "bddl_files": str(root / "bddl_files"),
             "init_states": str(root / "init_files"), "datasets": str(where), "assets": str(root / "assets")}  # fmt: skip
    (where / "config.yaml").write_text(json.dumps(paths))
    return {"LIBERO_CONFIG_PATH": str(where)}


def env_args(env: str, chunk: list[str], image_size: int | None) -> list[str]:
    """lerobot-eval's ``--env.*`` flags for a chunk of vlastack task keys."""
    if env == "metaworld":
        return ["--env.type=metaworld", f"--env.task={','.join(chunk)}"]
    suite = chunk[0].split("/")[0]
    ids = ",".join(t.split("/")[1] for t in chunk)
    out = ["--env.type=libero", f"--env.task={suite}", f"--env.task_ids=[{ids}]"]
    if image_size:  # LeRobot's default is 360 px; a policy trained at another size is scored at it
        out += [f"--env.observation_height={image_size}", f"--env.observation_width={image_size}"]
    return out


def gl_env(py: str) -> dict:
    """MUJOCO_GL for lerobot-eval: as set, else egl, else osmesa (a one-frame render each)."""
    if os.environ.get("MUJOCO_GL"):
        return {}
    code = "import mujoco; m = mujoco.MjModel.from_xml_string('<mujoco/>'); mujoco.Renderer(m, 8, 8).render()"
    for name in ("egl", "osmesa"):
        env = lerobot_env({"MUJOCO_GL": name, "PYOPENGL_PLATFORM": name})
        if subprocess.run([py, "-c", code], env=env, capture_output=True).returncode == 0:
            return {"MUJOCO_GL": name, "PYOPENGL_PLATFORM": name}
    sys.exit("no MuJoCo GL backend works (tried egl, osmesa): set MUJOCO_GL")


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """The 95% Wilson interval of k successes in n (vlastack/stats.py's, stdlib only)."""
    if n == 0:
        return [0.0, 0.0]
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, c - h), min(1.0, c + h)]


def convert(info: dict, tasks: list[str], seed: int, n: int, extra_config: dict | None = None) -> dict:
    """lerobot-eval's eval_info.json -> our eval.json shape (vlastack/sim/evaluate.py summarize).

    eval_info: {"per_task": [{"task_group", "task_id", "metrics": {"successes": [...], "sum_rewards",
    "max_rewards", "video_paths"}}], "per_group": {...}, "overall": {...}}. With --env.task a comma
    list of names, each name is its own group with task_id 0. Episode j of every task ran with seed
    ``seed + j`` (eval_policy: start_seed + batch_ix * batch_size + k); eval_info does not repeat it.
    """
    by_task: dict[str, dict] = {}
    libero = bool(tasks) and "/" in tasks[0]
    for entry in info["per_task"]:
        # LIBERO: the suite is the group and task_id LIBERO's task id (vlastack's key SUITE/ID).
        key = f"{entry['task_group']}/{entry['task_id']}" if libero else entry["task_group"]
        if key not in tasks:  # a difficulty group: task_id indexes its list
            raise ValueError(f"unexpected task {key!r}; run lerobot-eval with task names")
        by_task[key] = entry["metrics"]
    episodes, per_task = [], {}
    for t in tasks:
        m = by_task.get(t)
        if m is None:
            raise ValueError(f"{t} missing from eval_info.json")
        succ = [bool(s) for s in m["successes"]]
        if len(succ) != n:
            print(f"warning: {t}: {len(succ)} episodes in eval_info, expected {n}")
        for j, s in enumerate(succ):
            episodes.append({"task": t, "seed": seed + j, "success": s, "episode": j,
                             "sum_reward": m["sum_rewards"][j], "max_reward": m["max_rewards"][j]})  # fmt: skip
        k = sum(succ)
        per_task[t] = {"n": len(succ), "successes": k, "success_rate": k / len(succ) if succ else 0.0,
                       "ci95": wilson(k, len(succ))}  # fmt: skip
    k_all, n_all = sum(e["success"] for e in episodes), len(episodes)
    rates = [v["success_rate"] for v in per_task.values() if v["n"]]
    suite = tasks[0].split("/")[0] if libero else "metaworld"
    return {
        "suite": suite,
        "tasks": per_task,
        "overall": {
            "n": n_all,
            "successes": k_all,
            "success_rate": k_all / n_all if n_all else 0.0,
            "ci95": wilson(k_all, n_all),
        },
        "mean_task_success": sum(rates) / len(rates) if rates else 0.0,
        "lerobot_overall": info.get("overall"),
        "wall_s": (info.get("overall") or {}).get("eval_s"),
        "episodes": episodes,
        "config": {
            "episodes": n,
            "seed": seed,
            "seed_scheme": "per_task",
            "render_quality": "lerobot",  # lerobot-eval's env: the simulator's own render settings
            # MetaworldEnv._max_episode_steps; LIBERO: the suite's TASK_SUITE_MAX_STEPS
            "max_steps": LIBERO_MAX_STEPS[suite] if libero else 500,
            "image_size": 480 if not libero else 360,  # LeRobot's defaults (extra_config: the size used)
            "evaluator": "lerobot-eval",
            **(extra_config or {}),
        },
    }


def cmd_eval(args: argparse.Namespace) -> None:
    run = Path(args.run)
    py = args.lerobot_python
    policy_dir = Path(args.checkpoint) if args.checkpoint else run / OUT / LAST / "pretrained_model"
    if not (policy_dir / "config.json").exists():
        sys.exit(f"no LeRobot policy at {policy_dir}")
    env_name = getattr(args, "env", "metaworld")
    image_size = getattr(args, "image_size", None)
    tasks = expand_libero(args.tasks)[1] if env_name == "libero" else expand_tasks(args.tasks, py)
    out = Path(args.out) if args.out else run / "eval"
    lr_out = out / "lerobot"
    size = args.chunk_tasks or len(tasks)
    chunks = [tasks[i : i + size] for i in range(0, len(tasks), size)]
    # Chunks of tasks, each its own lerobot-eval run (``--chunk-tasks``): a finished chunk is kept,
    # so an evaluation cut off with its session continues (MT50 at 480 px takes hours here).
    # ``settings`` decide the results: a folder holding another evaluation is moved aside.
    settings = {"policy": str(policy_dir.resolve()), "chunks": chunks, "episodes": args.episodes_per_task,
                "seed": args.seed, "batch_size": args.batch_size, "extra": list(args.extra)}  # fmt: skip
    if env_name != "metaworld":  # (a Meta-World evaluation's settings stay as they were)
        settings.update(env=env_name, image_size=image_size)
    if lr_out.exists() and read_json(lr_out / "settings.json") != settings:
        lr_out.rename(out / f"lerobot.old-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    lr_out.mkdir(parents=True, exist_ok=True)
    write_json(lr_out / "settings.json", settings)
    env = lerobot_env(gl_env(py))
    if env_name == "libero":
        env.update(libero_config(py, lr_out / "libero_config"))
    if args.parallel > 1:  # chunks side by side, each on one core: llvmpipe renders on the calling
        env.update(LP_NUM_THREADS="0", OMP_NUM_THREADS="1")  # thread (223 ms a step on 1 core, 176 on 1.8)
    cmds, todo = [], []
    for k, chunk in enumerate(chunks):
        where = lr_out / f"part-{k:03d}"
        cmd = [py, "-m", EVAL_MODULE, f"--policy.path={policy_dir.resolve()}", "--policy.device=cpu",
               *env_args(env_name, chunk, image_size), f"--eval.n_episodes={args.episodes_per_task}",
               f"--eval.batch_size={args.batch_size}", f"--seed={args.seed}", f"--output_dir={where.resolve()}",
               *args.extra]  # fmt: skip
        cmds.append(shlex.join(cmd))
        if not (where / "eval_info.json").is_file():
            todo.append((k, chunk, where, cmd))

    def run_chunk(job: tuple) -> int:
        k, chunk, where, cmd = job
        if where.exists():
            shutil.rmtree(where)  # a chunk cut off midway: lerobot-eval starts it again
        print(f"lerobot-eval: tasks {k * size + 1}-{k * size + len(chunk)} of {len(tasks)}", flush=True)
        row = Segment(cmd, out / f"eval_log.part-{k:03d}.txt", env=env).run()
        if row["rc"] == 0:
            write_json(where / "segment.json", row)
        return row["rc"]

    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        failed = [j[0] for j, rc in zip(todo, pool.map(run_chunk, todo)) if rc != 0]
    if failed:
        sys.exit(f"lerobot-eval failed on chunks {failed}; see {out}/eval_log.part-*.txt")
    rows = [read_json(lr_out / f"part-{k:03d}" / "segment.json", {}) for k in range(len(chunks))]
    per_task = [
        t
        for k in range(len(chunks))
        for t in read_json(lr_out / f"part-{k:03d}" / "eval_info.json")["per_task"]
    ]
    eval_s = sum((r.get("wall_s") or 0.0) for r in rows)
    info = {"per_task": per_task, "overall": {"eval_s": eval_s, "chunks": len(chunks)}}
    train = read_json(run / RUN_INFO) or {}
    ev = convert(info, tasks, args.seed, args.episodes_per_task, {
        "batch_size": args.batch_size, "command": cmds[0] if len(cmds) == 1 else cmds,
        "mujoco_gl": env.get("MUJOCO_GL"),
        "policy_path": str(policy_dir.resolve()), "policy": train.get("policy"),
        "train_steps": train.get("step_reached"), "train_cpu_hours": train.get("cpu_hours"),
        "versions": versions(py), "eval_wall_s": eval_s, "parallel": args.parallel,  # wall: summed over chunks
        **({"image_size": image_size} if image_size else {}),
        # side by side, getrusage deltas see the other chunk's process: the sampled tree is counted
        "eval_cpu_s": sum((r.get("cpu_s_proc_tree" if args.parallel > 1 else "cpu_s") or 0.0) for r in rows),
        "extra_eval_args": list(args.extra)})  # fmt: skip
    ev["policy"] = f"lerobot_{train.get('policy', 'policy')}"
    write_json(out / "eval.json", ev)
    print(f"wrote {out / 'eval.json'}: mean task success {ev['mean_task_success']:.1%} "
          f"over {len(tasks)} tasks x {args.episodes_per_task}")  # fmt: skip
    if train.get("cpu_hours") is not None and env_name == "metaworld":
        print(f"record: .venv/bin/python bench/metaworld.py record --suite {suite_of(tasks)} --policy {ev['policy']} "
              f"--eval-json {out / 'eval.json'} --cpu-hours {train['cpu_hours']:.4f}")  # fmt: skip


def cmd_convert(args: argparse.Namespace) -> None:
    info = json.loads(Path(args.eval_info).read_text())
    if getattr(args, "env", "metaworld") == "libero":
        tasks = expand_libero(args.tasks)[1]
    else:
        tasks = expand_tasks(args.tasks, args.lerobot_python)
    ev = convert(info, tasks, args.seed, args.episodes_per_task)
    write_json(Path(args.out), ev)
    print(f"wrote {args.out}: mean task success {ev['mean_task_success']:.1%}")
