"""The asynchronous runtime (infer/realtime.py) with fake policies: scheduling, indexing, edge cases."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from vlastack.config import EXECUTION_METHODS, ConfigError, ExecutionConfig, load_config
from vlastack.infer.chunking import ActionChunker
from vlastack.infer.realtime import ChunkExecutor, DelayEstimator, RealtimeRunner, hold_action

H, A = 16, 3


class FakePolicy:
    """Chunk value = the step each action is meant for (obs step + index) in dim 0; dim 1 tags the
    request. Optional sleep (with jitter) makes it slow; it records what each request carried."""

    def __init__(self, sleep: float = 0.0, jitter: float = 0.0, seed: int = 0) -> None:
        self.sleep, self.jitter = sleep, jitter
        self.rng = np.random.default_rng(seed)
        self.requests: list[dict] = []
        self.lock = threading.Lock()

    def infer(self, obs: dict) -> dict:
        with self.lock:
            self.requests.append({k: v for k, v in obs.items() if k != "t"} | {"t": obs["t"]})
            extra = self.rng.uniform(0, self.jitter)
        if self.sleep:
            time.sleep(self.sleep + extra)
        a = np.zeros((H, A), np.float32)
        a[:, 0] = obs["t"] + np.arange(H)
        a[:, 1] = len(self.requests)
        return {"actions": a}


def run(method: str, delay: int, steps: int = 40, spc: int = 4, policy=None, **kw):
    policy = policy or FakePolicy()
    cfg = ExecutionConfig(
        method=method, delay=delay, overlap=kw.pop("overlap", 0), min_commit=kw.pop("min_commit", 0)
    )
    runner = RealtimeRunner(policy, cfg, A, spc, ensemble=kw.pop("ensemble", 0.1), **kw)
    executed = []
    state = {"t": 0}

    def step(action):
        executed.append(action.copy())
        state["t"] += 1
        return {"t": state["t"]}, False

    try:
        stats = runner.run({"t": 0}, step, steps)
    finally:
        runner.close()
    return np.stack(executed), stats, policy


@pytest.mark.parametrize("method", EXECUTION_METHODS)
@pytest.mark.parametrize("delay", [0, 1, 2, 4, 8])
def test_every_method_runs_and_never_starves(method, delay):
    ex, stats, _ = run(method, delay)
    assert len(ex) == 40 and np.isfinite(ex).all()
    assert stats.starved_steps == 0 and stats.fallbacks == 0
    # The robot holds only while waiting for the first chunk (and during sync waits).
    first_wait = delay
    assert stats.paused_steps >= first_wait
    if method != "sync":
        assert stats.paused_steps == first_wait


@pytest.mark.parametrize("method", ["naive_async", "rtc_inference", "rtc_training", "bid"])
@pytest.mark.parametrize("delay", [1, 2, 4, 8])
def test_async_chunks_are_indexed_by_the_actual_delay(method, delay):
    ex, stats, _pol = run(method, delay)
    # The first chunk runs from its start after the wait; after the first switch each executed
    # action is the one its chunk meant for that very step.
    switched = [t for t in range(len(ex)) if ex[t, 1] > 1]
    # The second request goes out s = max(4, d) steps after the first chunk arrived (step d).
    assert switched[0] == delay + max(4, delay) + delay
    assert (ex[switched, 0] == np.array(switched)).all()
    assert len(stats.boundary_jumps) == int(ex[-1, 1]) - 1


def test_sync_pauses_then_runs_from_the_start():
    ex, stats, _ = run("sync", 3, steps=30)
    # Request at 0, arrival at 3; 4 steps run (3..6); request at 7, arrival at 10, ...
    assert (ex[:3] == hold_action(None, A)).all()
    assert ex[3:7, 0].tolist() == [0, 1, 2, 3]
    assert (ex[7:10, :2] == 0).all() and ex[10, 0] == 7
    assert stats.paused_steps == 3 + 3 + 3 + 3 + 2 and stats.starved_steps == 0  # requests at 0, 7, .., 28


@pytest.mark.parametrize("ensemble", [0.0, 0.1])
def test_delay_zero_matches_the_synchronous_chunker(ensemble):
    method = "temporal_ensemble" if ensemble else "sync"
    ex, _, _ = run(method, 0, steps=30, ensemble=ensemble)
    chunker, ref, pol = ActionChunker(4, ensemble), [], FakePolicy()
    for t in range(30):
        ref.append(chunker.step(lambda t=t: pol.infer({"t": t})["actions"]))
    np.testing.assert_allclose(ex, np.stack(ref), atol=1e-6)


def test_first_chunk_has_no_prefix_then_rtc_requests_carry_the_leftover():
    _ex, _, pol = run("rtc_inference", 2, steps=30)
    assert "action_prefix" not in pol.requests[0]
    r = pol.requests[1]
    # Requested at step 2 + 4 = 6, while the first chunk (index 0 at step 2) runs: leftover from index 4.
    assert r["t"] == 6 and r["inference_delay"] == 2 and r["rtc_method"] == "rtc_inference"
    assert r["action_prefix"].shape == (H - 4, A) and r["action_prefix"][0, 0] == 4


def test_overlap_shortens_the_prefix_but_keeps_the_committed_actions():
    _ex, _, pol = run("rtc_inference", 2, steps=30, overlap=3)
    assert pol.requests[1]["action_prefix"].shape == (3, A) and pol.requests[1]["action_prefix"][0, 0] == 4
    _ex, _, pol = run("rtc_inference", 4, steps=30, overlap=2)  # never fewer than the delay
    assert pol.requests[1]["action_prefix"].shape == (4, A)
    with pytest.raises(ConfigError, match="overlap"):
        ExecutionConfig(method="rtc_inference", overlap=-1)


def test_delay_above_half_the_horizon_falls_back_to_sync_and_logs(caplog):
    with caplog.at_level(logging.WARNING, logger="vlastack.infer.realtime"):
        _ex, stats, _ = run("rtc_inference", 10, steps=50)
    assert stats.fallbacks > 0 and stats.starved_steps == 0
    assert "falling back to synchronous execution" in caplog.text


def test_mis_estimated_delay_uses_the_actual_one():
    # The policy is told 1 step, the chunk really arrives after 4: the runtime still switches at
    # the chunk's 4th action (no skipped or repeated actions), and says what it assumed.
    for assumed in (1, 7):
        ex, stats, pol = run("rtc_inference", 4, assumed_delay=assumed)
        assert all(r.get("inference_delay") == assumed for r in pol.requests[1:])
        switched = [t for t in range(len(ex)) if ex[t, 1] > 1]
        assert (ex[switched, 0] == np.array(switched)).all()
        assert stats.starved_steps == 0


def test_simulated_delay_is_deterministic_with_a_slow_jittery_policy():
    outs = [run("rtc_inference", 2, steps=24, policy=FakePolicy(0.003, 0.01, seed=s))[0] for s in (0, 1)]
    np.testing.assert_array_equal(outs[0], outs[1])


def test_live_runtime_with_a_slow_policy_never_starves():
    # 50 ms inference at 50 Hz: ~3 steps of delay, well inside the 16-step chunk.
    _, stats, pol = run("naive_async", -1, steps=40, policy=FakePolicy(0.05), hz=50.0)
    assert stats.starved_steps == 0 and stats.requests >= 5
    # Missing delay during warm-up: sent as "unknown" (rtc), no crash.
    _ex, stats, pol = run("rtc_inference", -1, steps=20, policy=FakePolicy(0.05), hz=50.0)
    assert "inference_delay" not in pol.requests[1] and stats.starved_steps == 0


def test_delay_estimator_is_robust():
    est = DelayEstimator(hz=10, warmup=2, quantile=0.9, window=5)
    assert est.estimate() is None
    est.add(5.0)  # compile spike, in the warm-up
    est.add(0.25)
    assert est.estimate() is None
    for _ in range(5):
        est.add(0.25)
    assert est.estimate() == 3
    est.add(2.0)  # one late spike does not stay forever
    for _ in range(5):
        est.add(0.12)
    assert est.estimate() == 2


def test_executor_and_config_refuse_bad_values():
    with pytest.raises(ValueError, match="method must be one of"):
        ChunkExecutor("fast", 4)
    with pytest.raises(ValueError, match="ensemble weight"):
        ChunkExecutor("temporal_ensemble", 4, 0.0)
    with pytest.raises(ConfigError, match=r"eval\.execution\.method"):
        load_config("tiny", overrides=["eval.execution.method=async"])
    with pytest.raises(ConfigError, match="temporal_ensemble"):
        load_config("tiny", overrides=["eval.execution.method=temporal_ensemble"])
    with pytest.raises(ConfigError, match="delay"):
        load_config("tiny", overrides=["eval.execution.delay=-2"])
    with pytest.raises(ConfigError, match="max_delay"):
        load_config("tiny", overrides=["train.rtc.max_delay=16"])
    with pytest.raises(ConfigError, match="pi0"):
        load_config("tiny", overrides=["train.rtc.max_delay=4", "model.head_options.variant=pi05"])
    with pytest.raises(ValueError, match="hz"):
        RealtimeRunner(FakePolicy(), ExecutionConfig(delay=-1), A, 4)


def test_second_difference_jump_leaves_out_the_motion_in_progress():
    ex, stats, _ = run("naive_async", 2)
    # the first chunk ends the initial hold: no switch
    switched = [t for t in range(2, len(ex)) if ex[t, 1] != ex[t - 1, 1] and ex[t - 2, 1] >= 1]
    want = [float(np.linalg.norm((ex[t] - ex[t - 1]) - (ex[t - 1] - ex[t - 2]))) for t in switched]
    assert len(switched) == len(stats.boundary_jumps2) >= 1
    np.testing.assert_allclose(stats.boundary_jumps2, want, rtol=1e-6)
    s = stats.summary()
    assert s["max_jump2"] == pytest.approx(max(want)) and s["mean_jump2"] == pytest.approx(np.mean(want))


class CommittingPolicy(FakePolicy):
    """As a policy trained with ``train.rtc.max_delay`` answers: the first ``inference_delay``
    actions of its chunk are the committed prefix, as given."""

    def infer(self, obs: dict) -> dict:
        a = super().infer(obs)["actions"]
        d = obs.get("inference_delay") or 0
        if d:
            a[:d] = obs["action_prefix"][:d]
        return {"actions": a}


@pytest.mark.parametrize("delay", [0, 1, 2])
def test_min_commit_tells_the_policy_at_least_that_many_committed_actions(delay):
    for min_commit in (0, 1, 3):
        ex, stats, pol = run("rtc_training", delay, spc=4, policy=CommittingPolicy(), min_commit=min_commit)
        commit = max(delay, min_commit)
        assert all(r["inference_delay"] == commit for r in pol.requests[1:])
        # The committed actions continue the old plan: no step is skipped or repeated (after the
        # first chunk, which runs from its start once it arrives)...
        assert (np.diff(ex[12:, 0]) == 1).all()
        # ...and a switch (its jump) counts where the new chunk's own actions start.
        switched = [t for t in range(2, len(ex)) if ex[t, 1] != ex[t - 1, 1] and ex[t - 2, 1] >= 1]
        assert len(switched) == len(stats.boundary_jumps) >= 3
        want = [float(np.linalg.norm(ex[t] - ex[t - 1])) for t in switched]
        np.testing.assert_allclose(stats.boundary_jumps, want, rtol=1e-6)
    with pytest.raises(ConfigError, match="min_commit"):
        ExecutionConfig(method="rtc_training", min_commit=-1)
    with pytest.raises(ValueError, match="min_commit"):
        ChunkExecutor("rtc_training", 4, min_commit=-1)
