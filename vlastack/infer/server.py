"""``vla serve``: a policy behind an openpi-compatible websocket and a small HTTP API.

Websocket (openpi protocol, works with ``openpi_client.websocket_client_policy``): on connect the
server sends the policy metadata (msgpack-numpy); each binary message is one observation and gets
``{"actions": float32 [H, A], "server_timing": {...}}`` back. A bad message gets a text frame with
the reason (openpi-client raises it as ``RuntimeError``) and the connection stays usable; a message
over ``max_message_bytes`` closes the connection (code 1009).

HTTP (``http_port``, default ``port + 1``; ``GET`` also answers on the websocket port):
``POST /act`` (JSON observation -> JSON actions), ``GET /healthz``, ``GET /metrics`` (Prometheus).

Every reply, on either transport, comes out of ``Batcher``: a policy output with a NaN or inf is
never sent as actions. Its request fails with ``NonFiniteOutput`` (HTTP 500 ``{"error": ...}``, a
websocket ``error:`` text frame; metric ``vla_errors_total{reason="non_finite_output"}``). On
SIGTERM the server drains, all within ``drain_timeout_s``: both listeners stay open until in-flight
requests finish, and what arrives meanwhile gets a reply (HTTP 503, websocket 503 at the handshake
or an ``error: ... shutting down`` frame), not a bare close. Each open websocket is closed (1001) by
its own handler once it has been quiet for ``drain_grace_s``: every message whose bytes arrived
before the close frame has had its reply, so a client always knows whether to retry. Decoding and
checking a message over ``INLINE_DECODE_BYTES`` (1 MiB) run off the event loop, so large uploads
cannot stall the drain.

All observations go through one ``Batcher`` thread, which runs at most ``max_batch`` of them per
forward pass: there is never more than one forward pass at a time. With ``token`` set, requests
need ``Authorization: Bearer <token>`` or ``Authorization: Api-Key <token>`` (what openpi-client
sends for ``api_key``); ``/healthz`` stays open.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import errno
import hmac
import json
import logging
import queue
import struct
import sys
import threading
import time
from collections.abc import Hashable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State

from vlastack.infer.metrics import Metrics
from vlastack.infer.obs import Obs, ObsError
from vlastack.infer.policy import Policy
from vlastack.infer.wire import WireError, obs_from_json, packb, unpackb

try:  # the drain's unread-bytes test (Unix); elsewhere it relies on the arrival time alone
    import fcntl
    import termios
except ImportError:  # pragma: no cover
    fcntl = termios = None  # type: ignore[assignment]

log = logging.getLogger("vlastack.serve")


# Messages up to this size are decoded and checked on the event loop: for pi0's three 224x224 images
# (450 KB) that takes ~0.1-0.3 ms, and the hand-off to a decoder thread and back cost more (0.15 ms
# less overhead inline: bench/serve_overhead.py, docs/gpu.md "What vla serve adds"). Larger uploads
# still go to the decoder threads, so a many-megabyte message cannot stall the loop or the drain.
INLINE_DECODE_BYTES = 2**20


class Unavailable(RuntimeError):
    """The server is shutting down or its queue is full."""


class NonFiniteOutput(RuntimeError):
    """The policy produced NaN/inf actions: the request fails, nothing is sent to the robot."""


def _finite_or_raise(result: dict) -> dict:
    """Pass ``result`` through if every float array in it is finite, else raise ``NonFiniteOutput``."""
    for k, v in result.items():
        a = np.asarray(v)
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            bad = int((~np.isfinite(a)).sum())
            raise NonFiniteOutput(
                f"the policy produced {bad} non-finite values (NaN/inf) in '{k}' of shape {list(a.shape)}; "
                "no actions sent (check the weights, e.g. `vla eval` on this policy)"
            )
    return result


class Batcher:
    """One inference thread. ``submit`` queues a checked observation and returns a Future of
    ``(actions float32 [H, A], timing dict)``; queued observations are batched dynamically.

    A forward pass takes what is queued, up to ``max_batch``. With ``max_wait_ms`` > 0 it waits up
    to that long after the oldest queued observation arrived for more to come (the latency cap):
    N environment workers stepping in lockstep then share one pass instead of N, at most
    ``max_wait_ms`` later. With 0 (the default) it never waits: what queued during the previous
    pass is the batch, which already batches a saturated server.
    """

    def __init__(
        self,
        policy: Policy,
        max_batch: int,
        metrics: Metrics,
        max_queue: int = 1024,
        max_wait_ms: float = 0.0,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not max_wait_ms >= 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.policy, self.max_batch, self.metrics = policy, max_batch, metrics
        self.max_wait_s = max_wait_ms / 1e3
        self.q: queue.Queue = queue.Queue(maxsize=max_queue)
        self.thread = threading.Thread(target=self._run, name="vla-infer", daemon=True)
        self.thread.start()

    def submit(self, obs: Obs) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            self.q.put_nowait((obs, fut, time.perf_counter()))
        except queue.Full:
            raise Unavailable("server queue is full; retry later") from None
        return fut

    def _gather(self, first: tuple) -> tuple[list, bool]:
        """``first`` and what follows it into one batch -> (items, stop seen)."""
        items = [first]
        deadline = first[2] + self.max_wait_s  # from the oldest one's arrival: its wait is capped
        while len(items) < self.max_batch:
            left = deadline - time.perf_counter()
            try:
                nxt = self.q.get(timeout=left) if left > 0 else self.q.get_nowait()
            except queue.Empty:
                break
            if nxt is None:  # stop: this batch still runs, then the thread ends
                return items, True
            items.append(nxt)
        return items, False

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self.q.get()
            if item is None:
                return
            items, stop = self._gather(item)
            # A request whose waiter gave up (the drain timeout cancels it) is not computed.
            items = [it for it in items if it[1].set_running_or_notify_cancel()]
            if not items:
                continue
            t0 = time.perf_counter()
            try:
                results = self.policy.infer_results([o for o, _, _ in items])
            except Exception as e:  # a failed batch fails its requests, not the server
                log.exception("inference failed")
                for _, fut, _ in items:
                    fut.set_exception(e)
                continue
            infer_ms = (time.perf_counter() - t0) * 1e3
            self.metrics.batch_size(len(items))
            for i, (_, fut, queued) in enumerate(items):
                timing = {"infer_ms": infer_ms, "queue_ms": (t0 - queued) * 1e3, "batch_size": len(items)}
                try:  # the one check every reply passes: no NaN/inf is ever sent as an action
                    fut.set_result((_finite_or_raise(results[i]), timing))
                except NonFiniteOutput as e:
                    log.warning("request refused: %s", e)
                    fut.set_exception(e)
        # a stop seen inside a batch: what was queued behind it still gets its answer
        self.abandon("server is shutting down")

    def abandon(self, reason: str) -> int:
        """Fail every queued observation not yet in a forward pass with ``Unavailable(reason)`` (the
        drain timeout: what has not started cannot finish in time) -> how many."""
        n = 0
        while True:
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                return n
            if item is None:  # a stop already queued stays queued
                self.q.put(None)
                return n
            if item[1].set_running_or_notify_cancel():  # (False: its waiter already gave up)
                item[1].set_exception(Unavailable(reason))
                n += 1

    def close(self) -> None:
        """Finish everything queued, then stop the thread."""
        self.q.put(None)
        self.thread.join()


def _reason(e: Exception) -> str:
    """The metric label of a failed request."""
    if isinstance(e, Unavailable):
        return "unavailable"
    if isinstance(e, NonFiniteOutput):
        return "non_finite_output"
    return "bad_request"


class _HTTPServer(ThreadingHTTPServer):
    """The HTTP listener: a deep accept backlog (the default of 5 resets bursts of clients) and one
    log line, not a traceback, for a client that goes away mid-request."""

    request_queue_size = 256
    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open_connections, self.count_lock = 0, threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.count_lock:
            self.open_connections += 1
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.count_lock:
                self.open_connections -= 1

    def close_answering_pending(self, wait_s: float) -> None:
        """Stop listening, after answering (503 while draining) the connections already waiting in
        the accept backlog (closing a listener resets those: to a client, no reply). Then wait up to
        ``wait_s`` for open connections to finish, so no reply is cut off when the process exits
        (every reply while draining closes its connection; only idle keep-alive ones can wait)."""
        # Clients that retry at once after a 503 refill the backlog as fast as it is answered (a retry
        # storm once held the exit 28.6 s): shrink it first, so new connections wait in the kernel
        # for a slot and are refused once the socket closes, then answer what is queued, for a
        # bounded time.
        with contextlib.suppress(OSError):
            self.socket.listen(0)
        self.socket.setblocking(False)
        stop_at = time.monotonic() + min(1.0, max(wait_s / 2, 0.1))
        while time.monotonic() < stop_at:
            try:
                request, addr = self.socket.accept()
            except OSError:  # BlockingIOError: the backlog is empty
                break
            request.setblocking(True)
            self.process_request(request, addr)
        self.server_close()
        deadline = time.monotonic() + wait_s
        while self.open_connections > 0 and time.monotonic() < deadline:
            time.sleep(0.01)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.info("http: client %s went away (%s)", client_address[0], type(exc).__name__)
        else:
            log.exception("http: error while handling a request from %s", client_address[0])


class _Connection(ServerConnection):
    """A websocket connection that notes when its last bytes arrived (the drain's quiet test)."""

    last_data = 0.0
    told = False  # it has been sent "server is shutting down"
    received = 0  # messages whose last byte arrived while the connection was open (before a close)
    answered = 0

    def process_event(self, event: Any) -> None:
        if (
            isinstance(event, Frame)
            and event.fin
            and event.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)
            and self.protocol.state is State.OPEN
        ):
            self.received += 1
        super().process_event(event)

    def data_received(self, data: bytes) -> None:
        self.last_data = time.monotonic()
        super().data_received(data)

    def unread_bytes(self) -> int:
        """Bytes that arrived in the kernel's socket buffer but were not read yet (a busy event loop,
        or reading paused for flow control); 0 where the platform cannot tell."""
        try:
            sock = self.transport.get_extra_info("socket")
            raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
            return struct.unpack("i", raw)[0]
        except (AttributeError, OSError):
            return 0


def _authorized(header: str | None, token: str | None) -> bool:
    if not token:
        return True
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    return scheme.lower() in ("bearer", "api-key") and hmac.compare_digest(value.strip(), token)


class PolicyServer:
    def __init__(
        self,
        policy: Policy,
        host: str = "127.0.0.1",
        port: int = 8000,
        http_port: int | None = None,
        token: str | None = None,
        max_batch: int = 8,
        max_message_bytes: int = 16 * 2**20,
        drain_timeout_s: float = 10.0,
        drain_grace_s: float = 0.2,
        max_wait_ms: float = 0.0,
    ) -> None:
        self.policy, self.host, self.port = policy, host, port
        self.http_port = port + 1 if http_port is None and port else (http_port or 0)
        self.token, self.max_bytes, self.drain_timeout_s = token, max_message_bytes, drain_timeout_s
        self.drain_grace_s = drain_grace_s
        # a token head's decode counters (test doubles and flow heads have none)
        counted = getattr(policy, "decode_stats", None) is not None
        self.metrics = Metrics(decode_stats=(lambda: dict(policy.decode_stats)) if counted else None)
        self.batcher = Batcher(policy, max_batch, self.metrics, max_wait_ms=max_wait_ms)
        self.metadata = policy.metadata | {
            "max_message_bytes": max_message_bytes,
            "max_batch": max_batch,
            "max_wait_ms": max_wait_ms,
        }
        self.draining = False
        self.unanswered = 0  # websocket messages that arrived before a close and got no reply
        self._drain_started: asyncio.Event | None = None  # made on the serving loop
        self._drain_deadline: asyncio.Event | None = None  # set when the drain timeout is reached
        self._deadline_passed = False  # the same, for the HTTP handler threads
        # msgpack decoding and the observation check of a large image take tens of ms: off the loop
        self._decoder = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="vla-decode")
        self.ready = threading.Event()

    # ------------------------------------------------------------------ shared request path

    def _act(self, obs: Any, stream: Hashable | None) -> concurrent.futures.Future:
        """``stream``: whose query this is (``Obs.stream``): a websocket connection is one client's
        episode, whose state (a token head's last valid chunk) no other client may receive; an
        HTTP request (None) stands alone."""
        if self.draining:
            raise Unavailable("server is shutting down")
        return self.batcher.submit(dataclasses.replace(self.policy.check(obs), stream=stream))

    def _ws_act(self, msg: bytes, stream: Hashable) -> concurrent.futures.Future:
        if self.draining:  # answered at once, without decoding a large upload first
            raise Unavailable("server is shutting down")
        return self._act(unpackb(msg, self.max_bytes), stream)

    @staticmethod
    def _reply(result: dict, timing: dict, t0: float) -> dict:
        """``result`` is the policy's dict (``actions``, and ``valid`` for token heads)."""
        return result | {"server_timing": timing | {"total_ms": (time.perf_counter() - t0) * 1e3}}

    # ------------------------------------------------------------------ websocket

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            if self.draining:
                return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")
            return connection.respond(HTTPStatus.OK, "ok\n")
        if self.draining:
            self.metrics.error("unavailable")
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "server is shutting down\n")
        if not _authorized(request.headers.get("Authorization"), self.token):
            self.metrics.error("unauthorized")
            return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong API token\n")
        if path == "/metrics":
            resp = connection.respond(HTTPStatus.OK, self.metrics.render())
            resp.headers["Content-Type"] = "text/plain; version=0.0.4"
            return resp
        return None

    async def _ws_handler(self, ws: _Connection) -> None:
        self.metrics.add("connections", 1)
        try:
            await ws.send(packb(self.metadata))
            while (msg := await self._next_message(ws)) is not None:
                await self._ws_request(ws, msg)
            await ws.close(1001, "server shutting down")  # draining, and quiet: nothing unanswered
        except ConnectionClosed:
            pass
        finally:
            self.metrics.add("connections", -1)
            self.policy.reset(("ws", ws.id))  # what was kept for this client goes with it
            if ws.protocol.close_rcvd_then_sent is False:  # the server closed first: none may be left
                self.unanswered += max(ws.received - ws.answered, 0)

    async def _next_message(self, ws: _Connection) -> str | bytes | None:
        """The connection's next message; None once the server drains and the connection has either
        been told "shutting down" (a message already received is still answered first) or been quiet
        (no byte received) for ``drain_grace_s`` (a large upload still arriving is read and
        answered). Raises ``ConnectionClosed`` when the client closes."""
        recv = asyncio.ensure_future(ws.recv())
        try:
            if ws.told:  # what arrives after the notice was sent after it: the client knows
                await asyncio.wait({recv}, timeout=0.005)  # a message already received is handed over
                return recv.result() if recv.done() else None
            if not self.draining:
                stop = asyncio.ensure_future(self._drain_started.wait())
                try:
                    await asyncio.wait({recv, stop}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
            while not recv.done():
                await asyncio.wait({recv}, timeout=self.drain_grace_s)
                await asyncio.sleep(0.001)  # one more poll: bytes already in the socket get read
                if time.monotonic() - ws.last_data >= self.drain_grace_s and not ws.unread_bytes():
                    break  # quiet: no bytes of a next message on the way
            return recv.result() if recv.done() else None
        finally:
            if not recv.done():
                recv.cancel()  # safe in websockets' asyncio API: no message is lost

    async def _ws_request(self, ws: _Connection, msg: str | bytes) -> None:
        t0 = time.perf_counter()
        self.metrics.add("in_flight", 1)
        try:
            if isinstance(msg, str):
                raise WireError("expected a binary msgpack message, got text")
            if len(msg) <= INLINE_DECODE_BYTES:
                fut = self._ws_act(msg, ("ws", ws.id))
            else:
                fut = await self._before_deadline(
                    asyncio.get_running_loop().run_in_executor(
                        self._decoder, self._ws_act, msg, ("ws", ws.id)
                    )
                )
            result, timing = await self._before_deadline(asyncio.wrap_future(fut))
            await ws.send(packb(self._reply(result, timing, t0)))
            ws.answered += 1
            self.metrics.request("ws", "ok", time.perf_counter() - t0)
        except (WireError, ObsError, Unavailable, NonFiniteOutput) as e:
            reason = _reason(e)
            self.metrics.request("ws", reason)
            self.metrics.error(reason)
            await ws.send(f"error: {e}")
            ws.answered += 1
            ws.told = ws.told or isinstance(e, Unavailable)
        except ConnectionClosed:
            raise
        except Exception as e:  # the model failed: report it, keep serving
            log.exception("request failed")
            self.metrics.request("ws", "error")
            self.metrics.error("internal")
            await ws.send(f"error: internal: {type(e).__name__}: {e}"[:1000])
            ws.answered += 1
        finally:
            self.metrics.add("in_flight", -1)

    def _http_result(self, fut: concurrent.futures.Future) -> tuple:
        """``fut``'s result for an HTTP handler thread, or ``Unavailable`` (a 503) once the drain
        timeout has passed: the process is about to exit, and a reply beats a cut connection."""
        while True:
            try:
                return fut.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                if self._deadline_passed:
                    fut.cancel()
                    raise Unavailable(
                        f"server is shutting down: no answer within the {self.drain_timeout_s:g} s drain timeout"
                    ) from None

    async def _before_deadline(self, aw: Any) -> Any:
        """``await aw``, unless the drain timeout comes first: then ``Unavailable``, so the request
        gets an explicit "shutting down" reply before its connection is closed, never the bare close."""
        task = asyncio.ensure_future(aw)
        if self._drain_deadline is None:
            return await task
        gate = asyncio.ensure_future(self._drain_deadline.wait())
        try:
            await asyncio.wait({task, gate}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gate.cancel()
        if task.done():
            return task.result()
        task.cancel()  # the batcher may still run it; its answer has nobody left to go to
        raise Unavailable(
            f"server is shutting down: no answer within the {self.drain_timeout_s:g} s drain timeout"
        )

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; then drain (module docstring) and return."""
        httpd = None
        self._drain_started = asyncio.Event()
        self._drain_deadline = asyncio.Event()
        with _port_in_use("--port", self.host, self.port):
            listener = await serve(
                self._ws_handler,
                self.host,
                self.port,
                process_request=self._process_request,
                max_size=self.max_bytes,
                compression=None,
                ping_interval=None,  # a client may block in a slow control loop; do not drop it
                close_timeout=1.0,  # a client that never answers the close frame cannot hold the exit
                create_connection=_Connection,
            )
        async with listener as server:
            self.port = server.sockets[0].getsockname()[1]
            if self.http_port >= 0:
                with _port_in_use("--http-port", self.host, self.http_port):
                    httpd = _HTTPServer((self.host, self.http_port), _make_http_handler(self))
                self.http_port = httpd.server_address[1]
                threading.Thread(target=httpd.serve_forever, name="vla-http", daemon=True).start()
            log.info("serving ws://%s:%d (HTTP on %d)", self.host, self.port, self.http_port)
            self.ready.set()
            await stop.wait()
            # Drain: both listeners stay open, so what arrives now gets a reply (503 / an error
            # frame) instead of a reset, until the in-flight requests have their answers.
            self.draining = True
            self._drain_started.set()
            t0, at_stop = time.monotonic(), self.metrics.in_flight
            # the closing steps below take up to ~1.5 s (websocket close handshakes, HTTP replies)
            deadline = t0 + max(self.drain_timeout_s - 1.5, 0.5)
            while self.metrics.in_flight > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            left = self.metrics.in_flight
            # websockets close themselves once quiet (``_next_message``); wait for that, bounded
            while self.metrics.connections > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            # The timeout: what is still queued or waiting gets "shutting down" now (sent during the
            # grace sleep below), not a bare close, and the exit does not wait for its forward pass.
            reason = f"server is shutting down: no answer within the {self.drain_timeout_s:g} s drain timeout"
            abandoned = self.batcher.abandon(reason)
            self._deadline_passed = True
            self._drain_deadline.set()
            log.info(
                "shutting down: %d request(s) in flight at the signal, %d answered in %.1f s%s%s",
                at_stop, at_stop - min(left, at_stop), time.monotonic() - t0,
                f", {left} still running at the {self.drain_timeout_s:g} s drain timeout ({abandoned} not "
                "started), told so" if left else "",
                f", {self.metrics.connections} websocket(s) still sending, closed" if self.metrics.connections
                else "",
            )  # fmt: skip
            await asyncio.sleep(self.drain_grace_s)  # replies on their way out; late arrivals answered
            server.server.close()
            if httpd is not None:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, httpd.shutdown)
                wait_s = max(deadline + 1.0 - time.monotonic(), 0.5)
                await loop.run_in_executor(None, httpd.close_answering_pending, wait_s)
            server.close()
        if self.draining:
            if self.unanswered:
                log.warning("drained: %d websocket message(s) arrived but got no reply", self.unanswered)
            else:
                log.info("drained: every websocket message that arrived before its close was answered")
        await asyncio.get_running_loop().run_in_executor(None, self.batcher.close)
        self._decoder.shutdown(wait=False)


@contextlib.contextmanager
def _port_in_use(flag: str, host: str, port: int):
    """A busy port becomes one ``ValueError`` naming it and the flag to change, not a traceback."""
    try:
        yield
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        raise ValueError(
            f"port {port} on {host} is already in use (another vla serve?): pass {flag} with a free port, "
            f"or {flag} 0 to pick one"
        ) from None


def _make_http_handler(srv: PolicyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 30  # seconds of silence before a connection is dropped (slow clients)
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("http: " + fmt, *args)

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            if srv.draining:  # tell keep-alive clients to reconnect elsewhere
                self.close_connection = True
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, reason: str, metric: str) -> None:
            srv.metrics.error(metric)
            srv.metrics.request("http", metric)
            self._send(status, json.dumps({"error": reason}).encode())

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                if srv.draining:
                    return self._send(503, b"shutting down\n", "text/plain")
                return self._send(200, b"ok\n", "text/plain")
            if not _authorized(self.headers.get("Authorization"), srv.token):
                return self._error(401, "missing or wrong API token", "unauthorized")
            if path == "/metrics":
                return self._send(200, srv.metrics.render().encode(), "text/plain; version=0.0.4")
            if path == "/metadata":
                return self._send(200, json.dumps(srv.metadata).encode())
            return self._error(404, f"no such path {path[:100]}", "not_found")

        def do_POST(self) -> None:
            t0 = time.perf_counter()
            if self.path.split("?", 1)[0] != "/act":
                return self._error(404, "POST only to /act", "not_found")
            if not _authorized(self.headers.get("Authorization"), srv.token):
                return self._error(401, "missing or wrong API token", "unauthorized")
            try:
                n = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self.close_connection = True
                return self._error(411, "Content-Length required", "bad_request")
            if not 0 <= n <= srv.max_bytes:
                self.close_connection = True  # the body is not read: the stream is unusable
                return self._error(413, f"body over {srv.max_bytes} bytes", "too_large")
            body = self.rfile.read(n)
            if len(body) < n:  # the client went away mid-body: nobody to answer
                self.close_connection = True
                srv.metrics.error("client_disconnected")
                log.info(
                    "http: client %s disconnected after %d of %d bytes", self.client_address[0], len(body), n
                )
                return None
            if srv.draining:  # answered at once, without parsing a large body first
                return self._error(503, "server is shutting down", "unavailable")
            srv.metrics.add("in_flight", 1)
            try:
                fut = srv._act(obs_from_json(body, srv.max_bytes), None)
                result, timing = srv._http_result(fut)
            except (WireError, ObsError) as e:
                return self._error(400, str(e), "bad_request")
            except Unavailable as e:
                return self._error(503, str(e), "unavailable")
            except NonFiniteOutput as e:
                return self._error(500, str(e), "non_finite_output")
            except Exception as e:
                log.exception("request failed")
                return self._error(500, f"internal: {type(e).__name__}: {e}", "internal")
            finally:
                srv.metrics.add("in_flight", -1)
            reply = srv._reply(result, timing, t0)
            reply["actions"] = reply["actions"].tolist()
            self._send(200, json.dumps(reply, allow_nan=False).encode())  # NaN is not JSON
            srv.metrics.request("http", "ok", time.perf_counter() - t0)

    return Handler


class ServerThread:
    """Run a ``PolicyServer`` on its own event loop in a background thread (tests, notebooks)."""

    def __init__(self, server: PolicyServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.stop_event: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._main, name="vla-serve", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.stop_event = asyncio.Event()
        self.loop.run_until_complete(self.server.serve(self.stop_event))

    def __enter__(self) -> PolicyServer:
        self.thread.start()
        if not self.server.ready.wait(30):
            raise RuntimeError("server did not start within 30 s")
        return self.server

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(60)


def run(server: PolicyServer) -> None:
    """Serve until SIGTERM/SIGINT, then drain in-flight requests and return."""
    import signal

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await server.serve(stop)

    asyncio.run(main())
