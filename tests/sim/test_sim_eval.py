"""Evaluator: chunk execution, ensembling, Wilson CIs, outputs, baselines, bad policies, crashes."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import av
import numpy as np
import pytest
from gymnasium import spaces

from vlastack.sim.evaluate import EvalWorkerError, evaluate, run_episode, wilson
from vlastack.sim.policies import ExpertPolicy, PolicyOutputError, RandomPolicy, check_actions


class CountingEnv:
    """A 1-D env that records executed actions; succeeds never; 12 steps long."""

    task_name = "count"
    action_space = spaces.Box(-1, 1, (4,), np.float32)

    def reset(self, seed=None):
        self.actions = []
        return self._obs(), {}

    def step(self, a):
        self.actions.append(np.asarray(a).copy())
        return self._obs(), 0.0, False, len(self.actions) >= 12, {"success": False}

    def _obs(self):
        return {
            "images": {"scene": np.zeros((8, 8, 3), np.uint8)},
            "state": np.zeros(2, np.float32),
            "prompt": "x",
        }


class QueryPolicy:
    """Chunk k (0-based query count) is filled with the value k."""

    def __init__(self, horizon=16):
        self.horizon, self.queries = horizon, 0

    def infer(self, obs):
        a = np.full((self.horizon, 4), float(self.queries), np.float32)
        self.queries += 1
        return {"actions": a}


class BadPolicy:
    def __init__(self, kind):
        self.kind = kind

    def infer(self, obs):
        a = np.zeros((8, 4), np.float32)
        if self.kind == "nan":
            a[3, 1] = np.nan
        elif self.kind == "shape":
            a = np.zeros((8, 7), np.float32)
        elif self.kind == "dtype":
            a = np.zeros((8, 4), np.int64)
        return {"actions": a}


def nan_policy_factory():
    return BadPolicy("nan")


class CrashPolicy:
    def infer(self, obs):
        os._exit(3)  # simulate a segfaulting/killed worker


def crash_factory():
    return CrashPolicy()


def test_steps_per_chunk_and_temporal_ensemble():
    env, pol = CountingEnv(), QueryPolicy()
    run_episode(env, pol, "q", seed=0, steps_per_chunk=5)
    assert pol.queries == 3  # 12 steps / 5 per chunk
    np.testing.assert_array_equal([a[0] for a in env.actions], [0] * 5 + [1] * 5 + [2] * 2)
    env, pol = CountingEnv(), QueryPolicy(horizon=3)
    run_episode(env, pol, "q", seed=0, steps_per_chunk=8)  # short chunks: re-query when they run out
    assert pol.queries == 4
    env, pol = CountingEnv(), QueryPolicy()
    run_episode(env, pol, "q", seed=0, steps_per_chunk=2, temporal_ensemble=0.5)
    w = np.exp(-0.5 * np.arange(2))
    assert env.actions[1][0] == 0.0  # only chunk 0 covers step 1
    assert env.actions[2][0] == pytest.approx((w[0] * 0 + w[1] * 1) / w.sum())  # chunks 0 and 1
    assert env.actions[4][0] == pytest.approx(
        (0 * 1 + 1 * w[1] + 2 * np.exp(-1.0)) / (1 + w[1] + np.exp(-1.0))
    )


def test_wilson_interval():
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-3)
    assert wilson(20, 20)[1] == 1.0 and wilson(20, 20)[0] > 0.8


def test_wilson_contains_its_rate_for_every_count(tmp_path):
    # wilson(6, 6) once came out as (.., 0.9999999999999999): plot() then drew a negative error bar
    # and `vla eval` exited 2 after writing eval.json (seen on a 6/6 Meta-World group).
    for n in range(1, 201):
        for k in range(n + 1):
            lo, hi = wilson(k, n)
            assert 0.0 <= lo <= k / n <= hi <= 1.0, (k, n, lo, hi)
        assert wilson(n, n)[1] == 1.0 and wilson(0, n)[0] == 0.0
    from vlastack.sim.evaluate import plot

    stat = {"n": 6, "successes": 6, "success_rate": 1.0, "ci95": [0.61, 0.9999999999999999]}
    res = {"policy": "p", "suite": "s", "tasks": {"a": stat}, "groups": {"g": stat}, "overall": stat}
    plot(res, tmp_path / "eval.png")  # an interval from an older eval.json, off by one ulp
    assert (tmp_path / "eval.png").stat().st_size > 0


def test_check_actions_messages():
    with pytest.raises(PolicyOutputError, match=r"policy 'p' at step 7.*NaN"):
        check_actions({"actions": np.full((2, 4), np.nan, np.float32)}, 4, "p", "step 7")
    with pytest.raises(PolicyOutputError, match=r"shape \[H, 4\].*\(2, 3\)"):
        check_actions({"actions": np.zeros((2, 3), np.float32)}, 4, "p", "step 0")
    with pytest.raises(PolicyOutputError, match="float32, got dtype int64"):
        check_actions({"actions": np.zeros((2, 4), np.int64)}, 4, "p", "step 0")
    with pytest.raises(PolicyOutputError, match="must return"):
        check_actions(np.zeros((2, 4)), 4, "p", "step 0")
    assert check_actions({"actions": np.zeros((2, 4))}, 4, "p", "s").dtype == np.float32


@pytest.mark.parametrize("kind", ["nan", "shape", "dtype"])
def test_bad_policy_output_names_policy_and_step(kind):
    with pytest.raises(PolicyOutputError, match=r"policy 'BadPolicy' at step 0 of episode 0 \(task reach"):
        evaluate(BadPolicy(kind), tasks=("reach",), episodes=1, num_workers=0, videos=0)


def test_expert_in_process_writes_outputs(tmp_path):
    res = evaluate(ExpertPolicy(), episodes=8, num_workers=0, out_dir=tmp_path, videos=2)
    assert res["overall"]["success_rate"] == 1.0 and res["overall"]["n"] == 8
    assert set(res["tasks"]) == {"reach", "push", "pick_place", "stack"}
    assert all(t["n"] == 2 for t in res["tasks"].values())
    assert [e["seed"] for e in res["episodes"]] == list(range(1_000_000, 1_000_008))
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["overall"]["ci95"][0] > 0.6 and (tmp_path / "eval.png").stat().st_size > 1000
    assert len(saved["videos"]) == 2
    with av.open(saved["videos"][0]) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) >= 2 and frames[0].shape == (256, 256, 3)


def test_parallel_workers_random_vs_expert(tmp_path):
    t0 = time.perf_counter()
    rnd = evaluate("random", episodes=8, num_workers=2, out_dir=tmp_path / "r", videos=2, cameras=("scene",))
    exp = evaluate("expert", episodes=8, num_workers=2, videos=0, cameras=("scene",))
    assert exp["overall"]["success_rate"] == 1.0
    assert rnd["overall"]["success_rate"] < exp["overall"]["success_rate"]
    assert (
        len(rnd["episodes"]) == 8 and len(json.loads((tmp_path / "r/eval.json").read_text())["videos"]) == 2
    )
    assert time.perf_counter() - t0 < 60
    assert isinstance(RandomPolicy().infer({})["actions"], np.ndarray)


def test_bad_policy_error_crosses_process_boundary():
    with pytest.raises(PolicyOutputError, match=r"nan_policy_factory.*NaN"):
        evaluate(
            nan_policy_factory, tasks=("reach",), episodes=2, num_workers=1, videos=0, cameras=("scene",)
        )


def test_crashed_worker_is_reported_not_hung():
    t0 = time.perf_counter()
    with pytest.raises(EvalWorkerError, match=r"worker process died.*crash_factory"):
        evaluate(crash_factory, tasks=("reach",), episodes=4, num_workers=2, videos=0, cameras=("scene",))
    assert time.perf_counter() - t0 < 60


def test_broken_checkpoint_error_crosses_process_boundary(tmp_path):
    """A policy folder the worker cannot load reports why, not as a dead worker."""
    from vlastack.config import load_config
    from vlastack.models import build_model

    build_model(load_config("tiny").model).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model"]["vision"]["widht"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model\.vision\.widht: unknown key"):
        evaluate(str(tmp_path), tasks=("reach",), episodes=1, num_workers=1, videos=0, cameras=("scene",))


def test_user_errors():
    with pytest.raises(ValueError, match="cannot be sent to worker"):
        evaluate(RandomPolicy(), episodes=1, num_workers=2)
    with pytest.raises(ValueError, match="neither 'random', 'expert' nor an existing"):
        evaluate("/no/such/ckpt", episodes=1, num_workers=0)


class GainPolicy:
    """A deterministic state-feedback policy with ``infer_batch``; records its batch sizes."""

    batchable = True

    def __init__(self, adim=4, horizon=4):
        self.adim, self.horizon, self.batches = adim, horizon, []

    def reset(self):
        pass

    def _chunk(self, obs):
        s = np.asarray(obs["state"], np.float32)
        a = np.tanh(np.resize(s, self.adim) * 3.0 - 0.5)
        return {"actions": np.repeat(a[None], self.horizon, 0).astype(np.float32)}

    def infer(self, obs):
        self.batches.append(1)
        return self._chunk(obs)

    def infer_batch(self, obs_list, streams):
        assert len(streams) == len(set(streams)) == len(obs_list)  # one stream per episode
        self.batches.append(len(obs_list))
        return [self._chunk(o) for o in obs_list]


def test_lockstep_groups_balance_workers():
    from vlastack.sim.evaluate import lockstep_groups

    jobs = list(range(100))
    groups = lockstep_groups(jobs, 16, 2)
    assert (
        len(groups) == 8 and [j for g in groups for j in g] == jobs and {len(g) for g in groups} <= {12, 13}
    )
    assert lockstep_groups(jobs[:3], 16, 2) == [[0, 1], [2]]
    assert lockstep_groups(jobs[:5], 16, 1) == [jobs[:5]] and lockstep_groups([], 16, 2) == []


def test_lockstep_equals_one_at_a_time(tmp_path):
    """Episodes side by side (``batch_episodes``) give the episodes one at a time would, frames too."""
    kw = dict(episodes=6, num_workers=0, max_steps=25, steps_per_chunk=2, cameras=("scene",))
    one, side = GainPolicy(), GainPolicy()
    a = evaluate(one, out_dir=tmp_path / "a", videos=2, **kw)
    b = evaluate(side, out_dir=tmp_path / "b", videos=2, batch_episodes=4, **kw)
    assert a["episodes"] == b["episodes"] and a["config"]["batch_episodes"] == 1
    assert b["config"]["batch_episodes"] == 4
    assert set(one.batches) == {1} and max(side.batches) == 3  # 6 episodes in two groups of 3
    assert len(one.batches) > 2 * len(side.batches)
    for x, y in zip(a["videos"], b["videos"], strict=True):
        assert os.path.basename(x) == os.path.basename(y)
    # Not batchable (no flag): the same evaluation, one at a time.
    plain = QueryPolicy(horizon=8)
    res = evaluate(plain, tasks=("reach",), batch_episodes=4, videos=0, **{**kw, "episodes": 2})
    assert res["overall"]["n"] == 2


@pytest.mark.integration
def test_lockstep_workers_real_policy(tmp_path):
    """A real tiny checkpoint through worker processes, side by side: every episode, in order."""
    from vlastack.config import load_config
    from vlastack.models import build_model

    cfg = replace(load_config("tiny").model, state_dim=5, action_dim=4)  # the built-in suite's
    build_model(cfg).save_pretrained(tmp_path)
    res = evaluate(
        str(tmp_path), episodes=6, num_workers=2, batch_episodes=3, max_steps=6, videos=0,
        cameras=cfg.camera_names,
    )  # fmt: skip
    assert [e["seed"] for e in res["episodes"]] == list(range(1_000_000, 1_000_006))
    # Every episode ran to its end: the step limit, or an early success (random weights and flow
    # noise from an unseeded generator can touch a reach target by chance; seen once in a full run).
    assert (
        all(e["steps"] == 6 or e["success"] for e in res["episodes"]) and res["config"]["batch_episodes"] == 3
    )


class Interrupted(ExpertPolicy):
    """The scripted expert, cut off (as by a kill) when its ``stop_at``-th episode starts."""

    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        self.stop_at, self.started = stop_at, 0

    def reset(self) -> None:
        if self.started == self.stop_at:
            raise KeyboardInterrupt
        self.started += 1


def test_interrupted_evaluation_resumes_to_the_same_result(tmp_path, capsys):
    """An evaluation cut off midway and re-run with --resume runs only the missing episodes and
    writes the eval.json (and videos) of an uninterrupted run; other settings are refused."""
    kw = {"episodes": 8, "num_workers": 0, "videos": 4, "image_size": 32}
    full = evaluate(Interrupted(), out_dir=tmp_path / "full", **kw)
    with pytest.raises(KeyboardInterrupt):
        evaluate(Interrupted(stop_at=5), out_dir=tmp_path / "cut", **kw)
    journal = tmp_path / "cut" / "eval.partial.jsonl"
    assert len(journal.read_text().splitlines()) == 1 + 5 and not (tmp_path / "cut" / "eval.json").exists()
    with journal.open("a") as f:
        f.write('{"elapsed_s": 1.0, "result": {"epis')  # the line a kill cut in half
    with pytest.raises(ValueError, match="another policy or with other settings"):
        evaluate(Interrupted(), out_dir=tmp_path / "cut", resume=True, **{**kw, "seed": 7})
    policy = Interrupted()
    res = evaluate(policy, out_dir=tmp_path / "cut", resume=True, **kw)
    assert policy.started == 3 and res["resumed_episodes"] == 5
    assert "resuming: 5 of 8 episodes done" in capsys.readouterr().out
    assert res["episodes"] == full["episodes"] and res["tasks"] == full["tasks"]
    names = [os.path.basename(v) for v in json.loads((tmp_path / "cut" / "eval.json").read_text())["videos"]]
    assert names == [os.path.basename(v) for v in full["videos"]] and len(names) == 4
    assert sorted(os.listdir(tmp_path / "cut" / "videos")) == sorted(names)  # candidates cleared
    assert not journal.exists()
    from vlastack.folderlock import FolderLock

    held = FolderLock(tmp_path / "cut" / ".lock", "vla eval", "x", "y")
    held.acquire()  # a second evaluation into a folder in use is refused
    try:
        with pytest.raises(ValueError, match=r"evaluation folder .*cut is in use by vla eval pid \d+"):
            evaluate(Interrupted(), out_dir=tmp_path / "cut", resume=True, **kw)
    finally:
        held.release()
    with pytest.raises(ValueError, match="pass out_dir"):
        evaluate(Interrupted(), resume=True, **kw)
    # Without --resume, a journal left behind is replaced, and said so.
    with pytest.raises(KeyboardInterrupt):
        evaluate(Interrupted(stop_at=2), out_dir=tmp_path / "again", **kw)
    policy = Interrupted()
    evaluate(policy, out_dir=tmp_path / "again", **kw)
    assert policy.started == 8 and "held 2 episodes of an unfinished evaluation" in capsys.readouterr().err


class SamplingPolicy:
    """Draws its chunks from ``self.generator``, as a flow head with ``step_noise`` or a token head
    with a temperature does; records every chunk."""

    def __init__(self):
        import torch

        self.generator, self.chunks = torch.Generator(), []

    def infer(self, obs):
        import torch

        a = torch.rand((4, 4), generator=self.generator).numpy() * 2 - 1
        self.chunks.append(a)
        return {"actions": a.astype(np.float32)}


def test_a_sampling_policy_draws_the_same_in_every_evaluation():
    """The evaluator seeds a policy's generator from each episode's seed, so what a stochastic
    sampler draws does not depend on what ran before it (another evaluation, or the episodes a
    worker happened to take first)."""
    pol = SamplingPolicy()
    kw = dict(
        tasks=("reach",),
        episodes=2,
        num_workers=0,
        max_steps=6,
        steps_per_chunk=4,
        videos=0,
        cameras=("scene",),
    )
    evaluate(pol, **kw)
    first, pol.chunks = pol.chunks, []
    evaluate(pol, **kw)
    assert len(first) == len(pol.chunks) == 4
    for a, b in zip(first, pol.chunks, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[2])  # the episodes' seeds differ, and so do their draws
