"""Tiny thread-safe Prometheus metrics (text exposition format 0.0.4), no dependency."""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Callable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, cum = [], 0
        sep = "," if labels else ""
        for b, c in zip(self.buckets, self.counts):
            cum += c
            out.append(f'{name}_bucket{{{labels}{sep}le="{b}"}} {cum}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        lab = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{lab} {self.sum:.6f}", f"{name}_count{lab} {self.count}"]
        return out


class Metrics:
    """Request counters by transport/status, errors by reason, latency and batch-size histograms;
    ``decode_stats``: a token head's chunk counters (``Policy.decode_stats``), read at render time."""

    def __init__(self, decode_stats: Callable[[], dict[str, int]] | None = None) -> None:
        self.decode_stats = decode_stats
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str], int] = defaultdict(int)
        self.errors: dict[str, int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        self.batch = Histogram(BATCH_BUCKETS)
        self.connections = 0
        self.in_flight = 0

    def request(self, transport: str, status: str, seconds: float | None = None) -> None:
        with self.lock:
            self.requests[(transport, status)] += 1
            if seconds is not None:
                self.latency.setdefault(transport, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def error(self, reason: str) -> None:
        with self.lock:
            self.errors[reason] += 1

    def batch_size(self, n: int) -> None:
        with self.lock:
            self.batch.observe(n)

    def add(self, name: str, delta: int) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + delta)

    def render(self) -> str:
        with self.lock:
            lines = [
                "# HELP vla_requests_total Inference requests by transport and status.",
                "# TYPE vla_requests_total counter",
            ]
            lines += [
                f'vla_requests_total{{transport="{t}",status="{s}"}} {n}'
                for (t, s), n in sorted(self.requests.items())
            ]
            lines += [
                "# HELP vla_errors_total Rejected or failed requests by reason.",
                "# TYPE vla_errors_total counter",
            ]
            lines += [f'vla_errors_total{{reason="{r}"}} {n}' for r, n in sorted(self.errors.items())]
            lines += [
                "# HELP vla_request_latency_seconds End-to-end latency of successful requests.",
                "# TYPE vla_request_latency_seconds histogram",
            ]
            for t, h in sorted(self.latency.items()):
                lines += h.lines("vla_request_latency_seconds", f'transport="{t}"')
            lines += [
                "# HELP vla_batch_size Observations per forward pass.",
                "# TYPE vla_batch_size histogram",
            ]
            lines += self.batch.lines("vla_batch_size")
            lines += [
                "# HELP vla_connections Open websocket connections.",
                "# TYPE vla_connections gauge",
                f"vla_connections {self.connections}",
                "# HELP vla_in_flight Requests queued or running.",
                "# TYPE vla_in_flight gauge",
                f"vla_in_flight {self.in_flight}",
            ]
        if self.decode_stats is not None:  # outside our lock: Policy updates these under its own
            d = self.decode_stats()
            lines += [
                "# HELP vla_token_chunks_total Token-head chunks decoded, invalid (not a full chunk), "
                "and replaced by the last valid one (model.head_options.invalid_decode=repeat_last).",
                "# TYPE vla_token_chunks_total counter",
            ]
            lines += [f'vla_token_chunks_total{{result="{k}"}} {v}' for k, v in sorted(d.items())]
        return "\n".join(lines) + "\n"
