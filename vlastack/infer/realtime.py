"""Acting while thinking: execute action chunks at the control rate while the next one computes.

    cfg = ExecutionConfig(method="rtc_inference", delay=-1)     # delay -1: measured live
    runner = RealtimeRunner(policy, cfg, action_dim=7, steps_per_chunk=4, hz=10)
    stats = runner.run(obs, step, max_steps=300)   # step(action) -> (next obs, done)

``policy`` is anything with ``infer(obs) -> {"actions": [H, A]}``: an in-process ``Policy`` or
openpi's ``WebsocketClientPolicy`` talking to ``vla serve`` (the real-time chunking keys travel in
the observation dict: ``action_prefix``, ``inference_delay``, ``rtc_method``; see infer/obs.py).

Timeline of one request (d = the inference delay in control steps, s = the execution horizon):
the request at step t carries the observation of step t; the chunk arrives at step t + d, and
meanwhile the robot runs d more actions of the chunk it is executing (``naive_async``, the RTC
methods) or holds still (``sync``). An asynchronous chunk is indexed by the step it was requested
at, so its first action used is its d-th, whatever delay was estimated. The next request goes
out s = max(``steps_per_chunk``, d) steps after the previous one. Methods (``EXECUTION_METHODS``):

- ``sync``: hold while computing, then run the chunk from its start (the robot pauses);
- ``naive_async``: switch to the new chunk on arrival (it may disagree: a jump);
- ``temporal_ensemble``: ACT's exponential average of every arrived chunk covering the step;
- ``rtc_inference``: the request carries the leftover of the executing chunk and the delay
  estimate; the policy inpaints (guided flow sampling, models/heads/flow/rtc.py);
- ``rtc_training``: the same request, answered by feeding the committed actions clean (a policy
  trained with ``train.rtc.max_delay``).

Edge cases: the first chunk has no prefix (plain sampling, the robot holds until it arrives); a
delay above half the horizon H cannot be covered by the executing chunk (s + d > H), so those
requests fall back to ``sync`` with a logged warning; a late chunk (live delay above the
estimate) leaves the queue empty for a few steps: the robot holds and ``starved_steps`` counts
them; a missing estimate (warm-up) is sent as "unknown" and the policy treats it as 0.

Delay: ``ExecutionConfig.delay`` >= 0 simulates it exactly (deterministic: the chunk is used at
step t + d whatever the compute took); -1 measures it live with ``DelayEstimator``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vlastack.config import ACTION_REPRESENTATIONS, EXECUTION_METHODS, ExecutionConfig

log = logging.getLogger(__name__)
ASYNC = ("naive_async", "temporal_ensemble", "rtc_inference", "rtc_training", "bid")
RTC = ("rtc_inference", "rtc_training", "bid")  # the methods whose requests carry the leftover


def hold_action(
    last: np.ndarray | None, action_dim: int, representation: str = "delta", state: np.ndarray | None = None
) -> np.ndarray:
    """The action that keeps the robot still, the gripper (last dim) as it was.

    ``delta`` (the built-in suite, Meta-World, LIBERO): zero deltas. ``absolute``: the current
    position as the target, read from ``state`` [S] whose first ``action_dim - 1`` dims are in the
    action's units (the built-in suite's ee xyz; a joint-position robot's joints), the convention of
    absolute-target + gripper action spaces. Not the last commanded target: the arm may not have
    reached it, and holding means stopping where it is."""
    a = np.zeros(action_dim, np.float32)
    if representation == "absolute":
        s = None if state is None else np.asarray(state, np.float32).reshape(-1)
        if s is None or s.shape[0] < action_dim - 1:
            raise ValueError(
                f"holding with absolute actions needs the state's first {action_dim - 1} dims (the "
                f"current position), got {None if s is None else s.shape}"
            )
        a[:-1] = s[: action_dim - 1]
    elif representation not in ACTION_REPRESENTATIONS:
        raise ValueError(f"representation must be 'delta' or 'absolute', got {representation!r}")
    if last is not None:
        a[-1] = last[-1]
    return a


class DelayEstimator:
    """Live inference delay in control steps: a quantile of the recent latencies, rounded up.

    The first ``warmup`` latencies (compilation, cold caches) are dropped, and old ones leave the
    ``window``, so one spike cannot pin the estimate (a running max would). None until a latency
    past the warm-up is known."""

    def __init__(self, hz: float, warmup: int = 2, quantile: float = 0.9, window: int = 20) -> None:
        if hz <= 0 or warmup < 0 or not 0 < quantile <= 1 or window < 1:
            raise ValueError(f"need hz > 0, warmup >= 0, quantile in (0, 1], window >= 1; got {hz}, "
                             f"{warmup}, {quantile}, {window}")  # fmt: skip
        self.hz, self.warmup, self.quantile = hz, warmup, quantile
        self.seen = 0
        self.latencies: deque[float] = deque(maxlen=window)

    def add(self, seconds: float) -> None:
        self.seen += 1
        if self.seen > self.warmup:
            self.latencies.append(seconds)

    def estimate(self) -> int | None:
        """Control steps that pass during one inference (>= 0), or None when unknown."""
        if not self.latencies:
            return None
        q = float(np.quantile(np.array(self.latencies), self.quantile))
        return max(0, math.ceil(q * self.hz - 1e-9))


@dataclass
class Request:
    t: int  # the step whose observation it carries
    prefix: np.ndarray | None  # the executing chunk from step t on, [n, A] (RTC methods)
    delay: int | None  # the estimate of the delay
    sync: bool  # hold while it computes, then run the chunk from its start
    # RTC: the committed actions the policy is told (inference_delay), max(delay, min_commit)
    # within the prefix; None = unknown (the policy takes 0)
    commit: int | None = None


@dataclass
class ExecutionStats:
    steps: int = 0
    requests: int = 0
    boundary_jumps: list[float] = field(default_factory=list)  # |a_new - a_prev| at each switch
    # |(a_new - a_prev) - (a_prev - a_prev2)| at each switch: the jump less the motion in progress
    # (for absolute targets, the change of the commanded step: what a payload feels)
    boundary_jumps2: list[float] = field(default_factory=list)
    starved_steps: int = 0  # steps with no action ready (a chunk came later than planned)
    paused_steps: int = 0  # steps held on purpose: sync waits, and the wait for the first chunk
    fallbacks: int = 0  # requests that fell back to sync (delay > H / 2)
    latencies_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        j, j2 = self.boundary_jumps, self.boundary_jumps2
        return {
            "steps": self.steps, "requests": self.requests, "boundaries": len(j),
            "max_jump": max(j) if j else 0.0, "mean_jump": float(np.mean(j)) if j else 0.0,
            "max_jump2": max(j2) if j2 else 0.0, "mean_jump2": float(np.mean(j2)) if j2 else 0.0,
            "starved_steps": self.starved_steps, "paused_steps": self.paused_steps, "fallbacks": self.fallbacks,
        }  # fmt: skip


class ChunkExecutor:
    """Per-step bookkeeping of chunk execution for every method: which request is due, what it
    carries, which action runs. No threads and no clocks (``RealtimeRunner`` and the simulator
    drive it), so it is deterministic and testable step by step."""

    def __init__(
        self, method: str, steps_per_chunk: int, ensemble: float = 0.0, overlap: int = 0, min_commit: int = 0
    ) -> None:
        if method not in EXECUTION_METHODS:
            raise ValueError(f"method must be one of {' | '.join(EXECUTION_METHODS)}, got {method!r}")
        if steps_per_chunk < 1:
            raise ValueError(f"steps_per_chunk must be >= 1, got {steps_per_chunk}")
        if method == "temporal_ensemble" and ensemble <= 0:
            raise ValueError("temporal_ensemble needs an ensemble weight > 0 (eval.temporal_ensemble)")
        if overlap < 0:
            raise ValueError(f"overlap must be >= 0 (0 = the whole leftover), got {overlap}")
        self.method, self.steps_per_chunk, self.ensemble = method, steps_per_chunk, ensemble
        self.overlap = overlap  # RTC: prefix actions sent, at least the delay (0: all left)
        if min_commit < 0:
            raise ValueError(f"min_commit must be >= 0 (0 = the delay), got {min_commit}")
        self.min_commit = min_commit  # RTC: committed actions told to the policy, at least
        self.reset()

    def reset(self) -> None:
        self.t = 0
        self.chunks: deque[tuple[int, np.ndarray]] = deque()  # (step of index 0, [H, A])
        self.pending: Request | None = None
        self.last_request: int | None = None
        self.last_action: np.ndarray | None = None
        self.prev_action: np.ndarray | None = None  # the one executed before last_action
        self.horizon: int | None = None  # known from the first chunk
        self.stats = ExecutionStats()
        self._switched = False
        self._switch_at = 0  # the step a switch counts at: the new chunk's first uncommitted action

    def plan(self, delay: int) -> tuple[int, bool]:
        """-> (execution horizon s, synchronous fallback) for an expected ``delay``."""
        s = max(self.steps_per_chunk, delay)
        if self.method == "sync" or self.horizon is None:
            return self.steps_per_chunk, self.method == "sync"
        if delay > self.horizon // 2:  # the executing chunk cannot cover the wait
            return self.steps_per_chunk, True
        return min(s, self.horizon - delay), False

    def due(self, delay: int) -> bool:
        """Whether a request should go out at this step (given the delay it expects)."""
        if self.pending is not None:
            return False
        if not self.chunks:
            return True
        s, sync = self.plan(delay)
        if self.method == "sync" or sync:
            return self.t - self.chunks[-1][0] >= min(s, len(self.chunks[-1][1]))
        return self.last_request is None or self.t - self.last_request >= s

    def request(self, delay: int | None) -> Request:
        """Start a request at this step; ``delay`` is the estimate it carries (None = unknown)."""
        sync = not self.chunks or self.plan(delay or 0)[1]
        if sync and self.chunks and self.method != "sync":
            self.stats.fallbacks += 1
            if self.stats.fallbacks == 1:
                log.warning(
                    "inference delay %s exceeds half the action horizon (%s): the executing chunk "
                    "cannot cover it; falling back to synchronous execution (the robot holds while "
                    "the next chunk computes)", delay, self.horizon,
                )  # fmt: skip
        prefix, commit = None, None
        if self.method in RTC and self.chunks:
            origin, chunk = self.chunks[-1]
            rest = chunk[self.t - origin :]
            if self.overlap:
                rest = rest[: max(self.overlap, delay or 0, self.min_commit)]
            prefix = rest if len(rest) else None
            if prefix is not None and (delay is not None or self.min_commit):
                commit = min(max(delay or 0, self.min_commit), len(prefix))
        self.pending = Request(self.t, prefix, delay, sync, commit)
        self.last_request = self.t
        self.stats.requests += 1
        return self.pending

    def deliver(self, chunk: np.ndarray) -> None:
        """The pending request's chunk [H, A] arrives at this step."""
        req = self.pending
        if req is None:
            raise ValueError("deliver() without a pending request")
        self.pending = None
        self.horizon = len(chunk)
        origin = self.t if req.sync else req.t
        if req.sync:  # it starts now: the next request is due s steps from here
            self.last_request = self.t
        if self.t - origin >= len(chunk):
            log.warning("a chunk arrived %s steps late, past its end; dropped", self.t - origin)
            return
        if self.method != "temporal_ensemble":
            self.chunks.clear()
        self.chunks.append((origin, np.asarray(chunk, np.float32)))
        self._switched = self.last_action is not None
        # Its committed actions continue the old plan (min_commit above the delay): the switch,
        # and its jump, is where the policy's own actions start.
        self._switch_at = origin + (req.commit or 0) if not req.sync else self.t

    def action(self) -> np.ndarray | None:
        """This step's action [A], or None when nothing may run (sync wait, empty queue)."""
        if self.pending is not None and self.pending.sync:
            return None
        t = self.t
        while self.chunks and t - self.chunks[0][0] >= len(self.chunks[0][1]):
            self.chunks.popleft()
        if not self.chunks:
            return None
        if self.method == "temporal_ensemble":
            w = np.exp(-self.ensemble * np.arange(len(self.chunks)))
            acts = np.stack([c[t - t0] for t0, c in self.chunks])
            return ((w[:, None] * acts).sum(0) / w.sum()).astype(np.float32)
        origin, chunk = self.chunks[-1]
        return chunk[t - origin]

    def advance(self, executed: np.ndarray | None, held: bool) -> None:
        """After the step ran ``executed`` (a chunk's action) or held (``held``, no action ready)."""
        st = self.stats
        if executed is not None:
            if self._switched and self.last_action is not None and self.t >= self._switch_at:
                st.boundary_jumps.append(float(np.linalg.norm(executed - self.last_action)))
                if self.prev_action is not None:
                    dv = (executed - self.last_action) - (self.last_action - self.prev_action)
                    st.boundary_jumps2.append(float(np.linalg.norm(dv)))
                self._switched = False
            self.prev_action, self.last_action = self.last_action, executed
        elif held:
            planned = self.pending is not None and (self.pending.sync or self.last_action is None)
            if planned:
                st.paused_steps += 1
            else:
                st.starved_steps += 1
        st.steps += 1
        self.t += 1


class RealtimeRunner:
    """The control loop: one action per tick from the executor; chunks computed in a background
    thread from the observation at request time. ``hz=None`` runs as fast as the env steps
    (simulation); with a simulated delay (``cfg.delay >= 0``) everything is deterministic."""

    def __init__(
        self,
        policy: Any,
        cfg: ExecutionConfig,
        action_dim: int,
        steps_per_chunk: int,
        hz: float | None = None,
        ensemble: float = 0.0,
        assumed_delay: int | None = None,
        check: Callable[[Any, int], np.ndarray] | None = None,
        representation: str = "delta",
    ) -> None:
        """``action_dim``: the env's (for the hold action before the first chunk);
        ``representation``: what the actions mean, ``delta`` or ``absolute`` (``hold_action``);
        ``assumed_delay``: the estimate sent to the policy when it should differ from the
        simulated delay (tests of mis-estimation); ``check(reply, t) -> [H, A]`` validates a
        reply (default: its ``"actions"``)."""
        if cfg.delay < 0 and hz is None:
            raise ValueError("a live delay (execution.delay=-1) needs the control rate hz")
        self.policy, self.cfg, self.hz, self.action_dim = policy, cfg, hz, action_dim
        if representation not in ACTION_REPRESENTATIONS:
            raise ValueError(f"representation must be 'delta' or 'absolute', got {representation!r}")
        self.representation = representation
        self.executor = ChunkExecutor(cfg.method, steps_per_chunk, ensemble, cfg.overlap, cfg.min_commit)
        self.estimator = DelayEstimator(hz or 1.0, cfg.delay_warmup, cfg.delay_quantile)
        self.assumed_delay = assumed_delay
        self.check = check or (lambda reply, t: np.asarray(reply["actions"], np.float32))
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="vla-chunk")

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def _estimate(self) -> int | None:
        if self.assumed_delay is not None:
            return self.assumed_delay
        return self.cfg.delay if self.cfg.delay >= 0 else self.estimator.estimate()

    def _infer(self, obs: dict, req: Request, t: int) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        if req.prefix is not None:
            obs = {**obs, "action_prefix": req.prefix, "rtc_method": self.cfg.method}
            if req.commit is not None:
                obs["inference_delay"] = int(req.commit)
        chunk = self.check(self.policy.infer(obs), t)
        return chunk, time.perf_counter() - t0

    def _arrivals(self, future: Future | None) -> Future | None:
        """Deliver the pending chunk if it arrives at this step; -> the future still pending."""
        ex = self.executor
        if future is None or ex.pending is None:
            return future
        simulated = self.cfg.delay >= 0
        if (simulated and ex.t >= ex.pending.t + self.cfg.delay) or (not simulated and future.done()):
            chunk, latency = future.result()  # simulated: waits for it, so timing cannot matter
            self.estimator.add(latency)
            ex.stats.latencies_s.append(latency)
            ex.deliver(chunk)
            return None
        return future

    def run(
        self, obs: dict, step: Callable[[np.ndarray], tuple[dict, bool]], max_steps: int
    ) -> ExecutionStats:
        """Run until ``step`` says done or ``max_steps``; returns the executor's stats."""
        ex = self.executor
        ex.reset()
        future: Future | None = None
        next_tick = time.perf_counter()
        for _ in range(max_steps):
            future = self._arrivals(future)
            est = self._estimate()
            if ex.due(est or 0):
                req = ex.request(est)
                future = self._arrivals(self.pool.submit(self._infer, obs, req, ex.t))  # d = 0: now
            action = ex.action()
            if action is None:
                state = obs.get("state", obs.get("observation/state")) if isinstance(obs, dict) else None
                run = hold_action(ex.last_action, self.action_dim, self.representation, state)
            else:
                run = action
            obs, done = step(run)
            ex.advance(action, held=action is None)
            if self.hz is not None:
                next_tick += 1.0 / self.hz
                time.sleep(max(0.0, next_tick - time.perf_counter()))
            if done:
                break
        return ex.stats
