"""RL fine-tuning against more imitation at equal CPU-hours (issue #69; docs/rl.md).

    # 1. RL from a trained policy (vla rl), its CPU seconds in metrics.jsonl
    vla rl --policy runs/heads/fast_nobpe_h4_sigma2_s2/final --ema --out runs/rl/fast_s2_grpo \
        rl.iterations=60 rl.groups=6 rl.group_size=8 'rl.tasks=[push,pick_place,stack]' ...
    # 2. the honest baseline: the same start trained further by imitation, on new expert episodes,
    #    for about the same CPU-hours (this wrapper measures them)
    python bench/rl.py imitate --start runs/heads/fast_nobpe_h4_sigma2_s2/final/ema \
        --data runs/more_data --out runs/rl/fast_s2_imitation --steps 5000
    # 3. all three on the test seeds (1e6.., the heads bench's, never seen in tuning), paired by seed
    python bench/rl.py record --name fast_s2 --start runs/heads/fast_nobpe_h4_sigma2_s2/final/ema \
        --rl runs/rl/fast_s2_grpo --baseline runs/rl/fast_s2_imitation --episodes 400
    # a run in stages: the second starts from the first's best/ (vla rl --policy RUN1/best ...);
    # --continues adds the first stage's CPU-hours up to the iteration it handed on
    python bench/rl.py record --name NAME --start START --rl RUN2 --continues RUN1 --pick best ...
    # a sampling choice (a flow head's per-step noise) is picked on the validation seeds, for every
    # policy alike, then `record --decode` scores every row with it
    python bench/rl.py validate --policy runs/rl/flow_grpo/final --out runs/rl/flow_grpo/eval_val \
        --decode step_noise=0.3 --episodes 200

RECAP (``vla recap``, the offline alternative) goes through the same baseline and test seeds:

    vla recap collect --policy START --ema --out runs/recap/rollouts --episodes-per-task 200 --threads 1
    vla recap label --policy START --ema --data runs/more_data --data runs/recap/rollouts \
        --out runs/recap/data --threads 1
    python bench/rl.py imitate --start START/ema --data runs/recap/data --out runs/rl/recap --steps 1500 \
        model.advantage_conditioning=true model.max_text_len=45
    python bench/rl.py record-recap --name NAME --start START/ema --run runs/rl/recap \
        --rollouts runs/recap/rollouts --labelled runs/recap/data --baseline runs/rl/imitation_all

Everything lands in bench/results/rl.json, one record per name: the start, the method and its
settings, CPU-hours, rollouts, the success curve (rollouts, and the greedy policy on validation
seeds), the test success of start / RL / baseline with Wilson intervals, and RL minus baseline
paired by seed with a 95% interval.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import environment  # noqa: E402
from vlastack.labs._core import cpu_flags  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "rl.json"
TEST_SEED = 1_000_000
VALIDATION_SEED = 2_000_000  # vla rl's rl.eval_seed: disjoint from data, test and rollout seeds


def cmd_imitate(args: argparse.Namespace) -> None:
    """``vla train`` from --start on --data with the start's recipe, its statistics kept; the
    child's CPU seconds go to <out>/cpu.json."""
    start = Path(args.start)
    cmd = [sys.executable, "-m", "vlastack.cli", "train", "--config", str(start / "config.yaml"),
           "--data", args.data, "--out", args.out, f"train.init_from={start}", "data.norm_stats=init_from",
           f"train.steps={args.steps}", f"train.lr={args.lr}", "train.warmup_steps=100",
           f"train.num_threads={args.threads}", "train.eval_every=0", *args.overrides]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    rc = subprocess.call(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    Path(args.out, "cpu.json").write_text(
        json.dumps({"cpu_s": round(cpu, 1), "rc": rc, "argv": cmd[3:]}) + "\n"
    )
    print(f"imitation: {cpu / 3600:.2f} CPU-h (rc {rc})")
    raise SystemExit(rc)


def _score(
    policy: Path,
    episodes: int,
    out: Path,
    batch_episodes: int | None = None,
    decoding: tuple[tuple[str, str], ...] = (),
    seed: int = TEST_SEED,
) -> dict:
    """The policy on the test seeds (``seed``: others for validation), as bench/heads.py scores
    heads (re-planning as its config says, ``batch_episodes`` episodes per worker side by side, by
    default its config's), sampling as its config says or with ``decoding`` (e.g. a flow head's
    step_noise: then ``out`` gets the options as a suffix); kept in ``out`` and reused."""
    from vlastack.config import load_yaml
    from vlastack.sim.evaluate import evaluate
    from vlastack.sim.policies import Checkpoint

    out = out.with_name(out.name + "".join(f"_{k}={v}" for k, v in decoding))
    done = out / "eval.json"
    if done.exists():
        res = json.loads(done.read_text())
        if res["config"]["episodes"] == episodes and res["config"]["seed"] == seed:
            return res
    cfg = load_yaml(policy / "config.yaml")
    spec = Checkpoint(str(policy), decoding) if decoding else str(policy)
    return evaluate(spec, cfg.eval, suite="builtin", episodes=episodes, seed=seed,
                    seed_scheme="spread", num_workers=2, temporal_ensemble=0.0, videos=0,
                    cameras=cfg.model.camera_names, out_dir=out,
                    batch_episodes=batch_episodes or cfg.eval.batch_episodes)  # fmt: skip


def _decoding(args: argparse.Namespace, policy: Path | None = None) -> tuple[tuple[str, str], ...]:
    """How ``policy`` samples in a record: ``--decode`` for every row, or with
    ``--decode-from-validation`` the choice its own validation trials scored best (``validate``;
    a tie goes to the least step noise, the configured sampler first)."""
    from vlastack.models.heads.serving import parse_decoding

    if not getattr(args, "decode_from_validation", False) or policy is None:
        return tuple(parse_decoding(getattr(args, "decode", [])).items())
    trials = [t for t in _results().get("validation_trials", []) if t["policy"] == str(policy)]
    if not trials:
        raise SystemExit(f"--decode-from-validation: no validation trial of {policy} (bench/rl.py validate)")
    best = max(trials, key=lambda t: (t["success"], -float(t["decoding"].get("step_noise", 0))))
    return tuple(best["decoding"].items())


def _ema(policy: Path) -> Path:
    return policy / "ema" if (policy / "ema").is_dir() else policy


def _summary(res: dict) -> dict:
    o = res["overall"]
    return {"mean_task_success": res["mean_task_success"], "success": o["success_rate"], "ci95": o["ci95"],
            "n": o["n"], "tasks": {t: {"success": v["success_rate"], "ci95": v["ci95"], "n": v["n"]}
                                   for t, v in res["tasks"].items()}}  # fmt: skip


def paired(a: dict, b: dict) -> dict:
    """Success of ``a`` minus ``b`` on the same seeds: mean difference and its 95% interval (normal
    approximation over the per-seed differences), and the discordant pairs (McNemar)."""
    sa = {e["seed"]: float(e["success"]) for e in a["episodes"]}
    sb = {e["seed"]: float(e["success"]) for e in b["episodes"]}
    seeds = sorted(set(sa) & set(sb))
    d = [sa[s] - sb[s] for s in seeds]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / max(n - 1, 1))
    half = 1.96 * sd / math.sqrt(n)
    return {"n": n, "difference": round(mean, 4), "ci95": [round(mean - half, 4), round(mean + half, 4)],
            "only_first": sum(x > 0 for x in d), "only_second": sum(x < 0 for x in d)}  # fmt: skip


def paired_by_task(a: dict, b: dict) -> dict:
    """``paired`` within each task: where a gain on one task hides a loss on another."""
    tasks = dict.fromkeys(e["task"] for e in a["episodes"])
    return {
        t: paired(*({"episodes": [e for e in r["episodes"] if e["task"] == t]} for r in (a, b)))
        for t in tasks
    }


def _baseline(run: Path, ours: dict, label: str, args: argparse.Namespace) -> dict:
    """An imitation run (``imitate --out``) scored on the test seeds and paired with ``ours``."""
    dec = _decoding(args, _ema(run / "final"))
    res = _score(_ema(run / "final"), args.episodes, run / "eval_test", args.batch_episodes, dec)
    cpu = json.loads((run / "cpu.json").read_text())
    return {"run": str(run), "cpu_h": round(cpu["cpu_s"] / 3600, 3), "argv": cpu["argv"], "decoding": dict(dec),
            "test": _summary(res), f"{label}_minus_baseline": paired(ours, res)}  # fmt: skip


def _results() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": {}}


def _write(data: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1, default=str) + "\n")


def _save(name: str, record: dict, note: str) -> None:
    """``record`` (with ``note``) as ``runs[name]`` of rl.json, the other records kept."""
    if note:
        record["note"] = note
    data = _results()
    data["runs"][name] = record
    _write(data)


def _prior_stage(run: Path) -> dict:
    """The earlier stage a run started from (``vla rl --policy <run>/best``): that run's settings,
    the iteration its validation seeds picked, and the CPU seconds it took to get there."""
    from vlastack.config import load_yaml

    best = json.loads((run / "best.json").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    # best.json counts iterations from 1, metrics.jsonl from 0
    row = next(r for r in rows if r["iteration"] == best["iteration"] - 1)
    rl = vars(load_yaml(run / "config.yaml").rl)
    return {"run": str(run), "iteration": best["iteration"], "val_success": best["val_success"],
            "cpu_s": row["cpu_s"], "rollout_episodes": sum(r["episodes"] for r in rows[: best["iteration"]]),
            # the whole run, which may have gone on past the iteration it handed on
            "run_iterations": len(rows), "run_cpu_s": rows[-1]["cpu_s"], "rl": dict(rl)}  # fmt: skip


def cmd_record(args: argparse.Namespace) -> None:
    from vlastack.config import load_yaml

    rl_run, start = Path(args.rl), Path(args.start)
    base_run, *more_runs = (Path(b) for b in args.baseline)
    rows = [json.loads(x) for x in (rl_run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    cfg = load_yaml(rl_run / "config.yaml")
    # its EMA weights where it kept them, as bench/heads.py scores every trained head
    policies = {"start": start, "rl": rl_run / args.pick, "imitation": _ema(base_run / "final")}
    dec = {k: _decoding(args, p) for k, p in policies.items()}  # how each row samples
    outs = {"start": rl_run / "eval_start", "rl": rl_run / {"final": "eval_test", "best": "eval_test_best"}[args.pick],
            "imitation": base_run / "eval_test"}  # fmt: skip
    evals = {k: _score(p, args.episodes, outs[k], args.batch_episodes, dec[k]) for k, p in policies.items()}
    base_cpu = json.loads((base_run / "cpu.json").read_text())
    prior = _prior_stage(Path(args.continues)) if args.continues else None
    record = {
        "date": datetime.date.today().isoformat(),
        "environment": environment(),
        "cpu_flags": cpu_flags(),
        "start": str(start),
        # how each row sampled ({}: as its config says), and whether its validation trials chose it
        "decoding": {k: dict(v) for k, v in dec.items()},
        "decoding_from_validation": bool(args.decode_from_validation),
        "method": cfg.rl.method,
        "rl": {k: v for k, v in vars(cfg.rl).items()},
        # best/: the iteration the validation seeds picked (vla rl's best.json); the CPU-hours are
        # the whole run's all the same, since picking needed every iteration to be run
        "scored": args.pick if args.pick == "final" else json.loads((rl_run / "best.json").read_text()),
        # a later stage's CPU-hours include the stage it started from, up to the iteration it took
        "rl_cpu_h": round((rows[-1]["cpu_s"] + (prior["cpu_s"] if prior else 0)) / 3600, 3),
        **({"continues": prior} if prior else {}),
        "iterations": len(rows),
        "rollout_episodes": sum(r["episodes"] for r in rows),
        "curve": [
            {
                k: r[k]
                for k in (
                    "iteration",
                    "success",
                    "success_by_task",
                    "informative_groups",
                    "val_success",
                    "val_by_task",
                )
                if k in r
            }
            for r in rows
        ],
        "imitation": {
            "run": str(base_run),
            "cpu_h": round(base_cpu["cpu_s"] / 3600, 3),
            "argv": base_cpu["argv"],
        },
        "test": {"seed": TEST_SEED, "episodes": args.episodes, **{k: _summary(v) for k, v in evals.items()}},
        "rl_minus_imitation": paired(evals["rl"], evals["imitation"]),
        "rl_minus_start": paired(evals["rl"], evals["start"]),
        "rl_minus_imitation_by_task": paired_by_task(evals["rl"], evals["imitation"]),
        "rl_minus_start_by_task": paired_by_task(evals["rl"], evals["start"]),
    }
    # the start's greedy score on the same validation seeds as the curve (vla rl writes it)
    start_val = Path(args.start_val) if args.start_val else rl_run / "validation_start.json"
    if start_val.exists():
        record["validation_start"] = json.loads(start_val.read_text())
    # further baselines (e.g. imitation on other data), each scored and paired like the first
    for run in more_runs:
        record.setdefault("more_baselines", []).append(_baseline(run, evals["rl"], "rl", args))
    _save(args.name, record, args.note)
    t = record["test"]
    for k in ("start", "rl", "imitation"):
        lo, hi = t[k]["ci95"]
        tasks = ", ".join(f"{n} {v['success']:.2f}" for n, v in t[k]["tasks"].items())
        print(f"{k:10s} {t[k]['success']:.3f} [{lo:.3f}, {hi:.3f}]  ({tasks})")
    p = record["rl_minus_imitation"]
    print(f"rl - imitation: {p['difference']:+.3f} {p['ci95']} (paired over {p['n']} seeds); "
          f"CPU-h rl {record['rl_cpu_h']}, imitation {record['imitation']['cpu_h']}")  # fmt: skip
    for b in record.get("more_baselines", []):
        lo, hi = b["test"]["ci95"]
        p = b["rl_minus_baseline"]
        print(f"{b['run']}: {b['test']['success']:.3f} [{lo:.3f}, {hi:.3f}] ({b['cpu_h']} CPU-h); "
              f"rl - it: {p['difference']:+.3f} {p['ci95']}")  # fmt: skip
    print(f"wrote {RESULTS}")


def cmd_record_recap(args: argparse.Namespace) -> None:
    """Score the start, the RECAP policy (``vla recap`` + ``imitate`` with
    model.advantage_conditioning) and the baselines on the test seeds -> rl.json; RECAP's
    CPU-hours are its rollouts', its value and labels' and its training's."""
    start, run = Path(args.start), Path(args.run)
    rollouts = json.loads((Path(args.rollouts) / "meta" / "recap_rollouts.json").read_text())
    value = json.loads((Path(args.labelled) / "meta" / "recap_value.json").read_text())
    train_cpu = json.loads((run / "cpu.json").read_text())
    evals = {"start": _score(start, args.episodes, run / "eval_start", args.batch_episodes),
             "recap": _score(_ema(run / "final"), args.episodes, run / "eval_test", args.batch_episodes)}  # fmt: skip
    cpu = {"rollouts": rollouts["cpu_s"], "value_and_labels": value["cpu_s"], "training": train_cpu["cpu_s"]}
    record = {
        "date": datetime.date.today().isoformat(),
        "environment": environment(),
        "cpu_flags": cpu_flags(),
        "start": str(start),
        "method": "recap",
        "rollouts": {k: v for k, v in rollouts.items() if k != "episodes"},
        "value": value,
        "training": {"run": str(run), "argv": train_cpu["argv"]},
        "cpu_h": {k: round(v / 3600, 3) for k, v in cpu.items()}
        | {"total": round(sum(cpu.values()) / 3600, 3)},
        "test": {"seed": TEST_SEED, "episodes": args.episodes, **{k: _summary(v) for k, v in evals.items()}},
        "recap_minus_start": paired(evals["recap"], evals["start"]),
    }
    for b in args.baseline:
        record.setdefault("baselines", []).append(_baseline(Path(b), evals["recap"], "recap", args))
    _save(args.name, record, args.note)
    for k in ("start", "recap"):
        t = record["test"][k]
        tasks = ", ".join(f"{n} {v['success']:.2f}" for n, v in t["tasks"].items())
        print(f"{k:8s} {t['success']:.3f} {t['ci95']}  ({tasks})")
    print(f"recap CPU-h: {record['cpu_h']}")
    for b in record.get("baselines", []):
        p = b["recap_minus_baseline"]
        print(f"{b['run']}: {b['test']['success']:.3f} {b['test']['ci95']} ({b['cpu_h']} CPU-h); "
              f"recap - it: {p['difference']:+.3f} {p['ci95']}")  # fmt: skip
    print(f"wrote {RESULTS}")


def cmd_validate(args: argparse.Namespace) -> None:
    """A sampling choice (``--decode``) for one policy, scored on the validation seeds (2e6.., vla
    rl's) and kept in rl.json ``validation_trials``: the test seeds never pick a setting."""
    dec = _decoding(args)
    policy = Path(args.policy)
    res = _score(policy, args.episodes, Path(args.out), args.batch_episodes, dec, seed=VALIDATION_SEED)
    trial = {"date": datetime.date.today().isoformat(), "policy": str(policy), "decoding": dict(dec),
             "seed": VALIDATION_SEED, **_summary(res), "cpu_flags": cpu_flags()}  # fmt: skip
    data = _results()
    trials = [t for t in data.get("validation_trials", [])
              if (t["policy"], t["decoding"], t["n"]) != (trial["policy"], trial["decoding"], trial["n"])]  # fmt: skip
    data["validation_trials"] = [*trials, trial]
    _write(data)
    tasks = ", ".join(f"{n} {v['success']:.2f}" for n, v in trial["tasks"].items())
    print(f"{policy} {dict(dec) or 'as configured'}: {trial['success']:.3f} {trial['ci95']} ({tasks})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("imitate", help="the equal-compute imitation baseline")
    m.add_argument("--start", required=True, help="the policy folder RL starts from")
    m.add_argument("--data", required=True, help="new expert episodes")
    m.add_argument("--out", required=True)
    m.add_argument("--steps", type=int, required=True)
    m.add_argument("--lr", type=float, default=3e-4)
    m.add_argument("--threads", type=int, default=1)
    m.add_argument("overrides", nargs="*")
    m.set_defaults(func=cmd_imitate)
    r = sub.add_parser("record", help="score start / RL / imitation on the test seeds -> rl.json")
    r.add_argument("--name", required=True)
    r.add_argument("--start", required=True)
    r.add_argument("--rl", required=True)
    r.add_argument(
        "--baseline",
        required=True,
        action="append",
        help="an imitation run (bench/rl.py imitate --out); repeat for more, the first is the headline",
    )
    r.add_argument("--episodes", type=int, default=400)
    r.add_argument(
        "--batch-episodes",
        type=int,
        default=None,
        help="episodes per worker side by side, one batched query (default: the policy config's eval.batch_episodes)",
    )
    r.add_argument(
        "--pick",
        choices=("final", "best"),
        default="final",
        help="score the run's last policy, or the one its validation seeds picked (best/)",
    )
    r.add_argument(
        "--continues",
        default=None,
        help="the earlier vla rl run whose best/ this run started from; its CPU-hours to that iteration count",
    )
    r.add_argument("--start-val", default=None, help="JSON: the start on the validation seeds")
    r.add_argument(
        "--decode",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="sample every row this way (vla eval --decode; e.g. step_noise=0.3), chosen by `validate`",
    )
    r.add_argument(
        "--decode-from-validation",
        action="store_true",
        help="each row samples as its own best validation trial (`validate`) says",
    )
    r.add_argument("--note", default="", help="what the run tried, in words")
    r.set_defaults(func=cmd_record)
    v = sub.add_parser("validate", help="one policy and sampling choice on the validation seeds -> rl.json")
    v.add_argument("--policy", required=True)
    v.add_argument("--out", required=True, help="the evaluation's folder (reused when it is complete)")
    v.add_argument("--decode", action="append", default=[], metavar="KEY=VALUE")
    v.add_argument("--episodes", type=int, default=200)
    v.add_argument("--batch-episodes", type=int, default=None)
    v.set_defaults(func=cmd_validate)
    c = sub.add_parser("record-recap", help="score start / RECAP / baselines on the test seeds -> rl.json")
    c.add_argument("--name", required=True)
    c.add_argument("--start", required=True)
    c.add_argument("--run", required=True, help="the RECAP training run (bench/rl.py imitate --out)")
    c.add_argument("--rollouts", required=True, help="vla recap collect --out")
    c.add_argument("--labelled", required=True, help="vla recap label --out")
    c.add_argument("--baseline", action="append", default=[], help="an imitation run; repeat for more")
    c.add_argument("--episodes", type=int, default=400)
    c.add_argument("--batch-episodes", type=int, default=None)
    c.add_argument("--note", default="")
    c.set_defaults(func=cmd_record_recap)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
