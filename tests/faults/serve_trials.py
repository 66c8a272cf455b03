"""Serving trials (loopback only): NaN policies, bursts of 50 clients, clients that vanish, SIGTERM.

Used by tests/faults/test_serve_faults.py and bench/faults.py; each returns a ``Trial``.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.faults.helpers import PY, ROOT
from tests.faults.trials import Trial
from tests.infer.conftest import make_obs

HOST = "127.0.0.1"


def act_body(seed: int = 0) -> bytes:
    obs = make_obs(seed)
    img = obs["images"]["scene"]
    scene = {"b64": base64.b64encode(img.tobytes()).decode(), "dtype": "uint8", "shape": list(img.shape)}
    return json.dumps(
        {"images": {"scene": scene}, "state": obs["state"].tolist(), "prompt": obs["prompt"]}
    ).encode()


def post_act(port: int, body: bytes, timeout: float = 60) -> tuple[int, bytes]:
    """One POST /act on a fresh connection; connection errors propagate."""
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        c.request("POST", "/act", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def get(port: int, path: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


@contextlib.contextmanager
def serving(policy: Any, **kw: Any):
    from vlastack.infer.server import PolicyServer, ServerThread

    srv = PolicyServer(policy, port=0, **kw)
    with ServerThread(srv) as s:
        yield s


def metric(srv: Any, name: str) -> float:
    text = get(srv.http_port, "/metrics")[1].decode()
    m = re.search(re.escape(name) + r" ([0-9.e+]+)", text)
    return float(m.group(1)) if m else 0.0


# ----------------------------------------------------------------------------- NaN outputs


def nan_http_trial(srv: Any) -> Trial:
    before = metric(srv, 'vla_errors_total{reason="non_finite_output"}')
    t0 = time.perf_counter()
    status, raw = post_act(srv.http_port, act_body())
    dt = time.perf_counter() - t0
    try:
        reply = json.loads(raw)  # strict JSON: a NaN token would not be valid JSON anyway
    except ValueError:
        reply = {}
    counted = metric(srv, 'vla_errors_total{reason="non_finite_output"}') - before
    ok = (
        status == 500
        and "non-finite" in str(reply.get("error", ""))
        and "actions" not in reply
        and counted == 1
    )
    return Trial(
        "nan_output_http",
        ok,
        dt,
        {"status": status, "reply": raw[:200].decode("latin-1"), "counted": counted},
    )


def nan_ws_trial(srv: Any) -> Trial:
    """Through the real openpi client: the error frame becomes a ``RuntimeError``, never actions."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    client = WebsocketClientPolicy(HOST, srv.port)
    t0 = time.perf_counter()
    try:
        out = client.infer(make_obs())
        got = f"actions {np.asarray(out['actions']).ravel()[:3]}"
        ok = False
    except RuntimeError as e:
        got, ok = str(e)[:200], "non-finite" in str(e)
    dt = time.perf_counter() - t0
    return Trial("nan_output_ws", ok, dt, {"reply": got})


# ----------------------------------------------------------------------------- bursts


def _burst(n: int, fn) -> tuple[list, float]:
    barrier = threading.Barrier(n)
    out: list = [None] * n

    def worker(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except Exception as e:  # counted below
            out[i] = e

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out, time.perf_counter() - t0


def concurrent_http_trial(srv: Any, n: int = 50) -> Trial:
    bodies = [act_body(i) for i in range(n)]
    out, dt = _burst(n, lambda i: post_act(srv.http_port, bodies[i])[0])
    errors = [f"{type(r).__name__}: {r}"[:80] for r in out if not isinstance(r, int)]
    ok_n = sum(r == 200 for r in out)
    return Trial("concurrent_http_50", ok_n == n, dt, {"served": ok_n, "errors": sorted(set(errors))[:5]})


def concurrent_ws_trial(srv: Any, n: int = 50) -> Trial:
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    obs = [make_obs(i) for i in range(n)]

    def one(i: int) -> bool:
        c = WebsocketClientPolicy(HOST, srv.port)
        try:
            return c.infer(obs[i])["actions"].shape[0] > 0
        finally:
            c._ws.close()

    out, dt = _burst(n, one)
    errors = [f"{type(r).__name__}: {r}"[:80] for r in out if r is not True]
    return Trial(
        "concurrent_ws_50", not errors, dt, {"served": sum(r is True for r in out), "errors": errors[:5]}
    )


# ----------------------------------------------------------------------------- a client that vanishes


@contextlib.contextmanager
def capture_server_output():
    """Everything the server prints or logs meanwhile (stderr of every thread + vlastack.serve logs)."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("vlastack.serve")
    old_level, old_stderr = log.level, sys.stderr
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    sys.stderr = buf
    try:
        yield buf
    finally:
        sys.stderr = old_stderr
        log.removeHandler(handler)
        log.setLevel(old_level)


def disconnect_mid_post_trial(srv: Any) -> Trial:
    body = act_body()
    with capture_server_output() as buf:
        t0 = time.perf_counter()
        s = socket.create_connection((HOST, srv.http_port))
        s.sendall(
            f"POST /act HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:100]
        )
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        s.close()
        time.sleep(0.5)
        healthy = get(srv.http_port, "/healthz")[0] == 200
        dt = time.perf_counter() - t0
    text = buf.getvalue()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    ok = healthy and "Traceback" not in text and len(lines) <= 1
    return Trial("client_disconnect_mid_post", ok, dt, {"output": text[-600:], "lines": len(lines)})


# ----------------------------------------------------------------------------- drain


class SlowPolicy:
    """Delegates to a policy; every forward pass takes ``delay`` seconds longer."""

    def __init__(self, policy: Any, delay: float) -> None:
        self.policy, self.delay = policy, delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def infer_results(self, obs_list: list) -> list:
        time.sleep(self.delay)
        return self.policy.infer_results(obs_list)


def drain_trial(policy: Any) -> Trial:
    """While a slow request is in flight the server is told to stop; a new HTTP request, a new
    websocket and a message on an open websocket arriving during the drain all get a reply."""
    import websockets
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from vlastack.infer.server import PolicyServer, ServerThread

    srv = PolicyServer(SlowPolicy(policy, 1.5), port=0, drain_timeout_s=30)
    th = ServerThread(srv)
    th.__enter__()
    got: dict[str, Any] = {}
    try:
        open_ws = WebsocketClientPolicy(HOST, srv.port)
        flight = threading.Thread(target=lambda: got.update(first=post_act(srv.http_port, act_body())[0]))
        flight.start()
        deadline = time.time() + 30
        while srv.metrics.in_flight < 1 and time.time() < deadline:
            time.sleep(0.01)
        t0 = time.perf_counter()
        th.loop.call_soon_threadsafe(th.stop_event.set)
        while not srv.draining and time.time() < deadline:
            time.sleep(0.005)
        try:
            got["late_http"] = post_act(srv.http_port, act_body(1), timeout=10)[0]
        except Exception as e:
            got["late_http"] = f"{type(e).__name__}: {e}"[:80]
        try:
            WebsocketClientPolicy(HOST, srv.port)
            got["late_ws"] = "connected"
        except websockets.exceptions.InvalidStatus as e:
            got["late_ws"] = e.response.status_code
        except Exception as e:
            got["late_ws"] = f"{type(e).__name__}: {e}"[:80]
        try:
            open_ws.infer(make_obs())
            got["open_ws"] = "actions"
        except RuntimeError as e:
            got["open_ws"] = "shutting down" if "shutting down" in str(e) else str(e)[:80]
        except Exception as e:
            got["open_ws"] = f"{type(e).__name__}: {e}"[:80]
        dt = time.perf_counter() - t0
        flight.join(30)
    finally:
        th.__exit__(None, None, None)
    ok = got == {"first": 200, "late_http": 503, "late_ws": 503, "open_ws": "shutting down"}
    return Trial("request_during_drain", ok, dt, got)


def drain_timeout_trial(
    policy: Any, clients: int = 6, delay: float = 0.6, drain_timeout: float = 1.0
) -> Trial:
    """Issue #66: more work in flight at the stop than the drain timeout allows (``clients``
    websocket requests and 2 HTTP ones, one ``delay`` s forward pass each, ``max_batch`` 1). Each client still gets
    a reply before its close: actions, or an explicit "shutting down" error, never the bare close;
    the server is done within the drain timeout plus one forward pass and the closing steps."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from vlastack.infer.server import PolicyServer, ServerThread

    srv = PolicyServer(SlowPolicy(policy, delay), port=0, max_batch=1, drain_timeout_s=drain_timeout)
    th = ServerThread(srv)
    th.__enter__()
    got: list[str] = []
    lock = threading.Lock()
    try:
        conns = [WebsocketClientPolicy(HOST, srv.port) for _ in range(clients)]

        def one(c: Any, i: int) -> None:
            try:
                c.infer(make_obs(i))
                r = "actions"
            except RuntimeError as e:
                r = "shutting down" if "shutting down" in str(e) else f"error: {str(e)[:60]}"
            except Exception as e:  # a close without a reply
                r = f"NO REPLY ({type(e).__name__})"
            with lock:
                got.append(r)

        def http(i: int) -> None:
            try:
                status = post_act(srv.http_port, act_body(100 + i), timeout=30)[0]
                r = {200: "actions", 503: "shutting down"}.get(status, f"http {status}")
            except Exception as e:  # a cut connection: no reply
                r = f"NO REPLY (http {type(e).__name__})"
            with lock:
                got.append(r)

        threads = [threading.Thread(target=one, args=(c, i), daemon=True) for i, c in enumerate(conns)]
        threads += [threading.Thread(target=http, args=(i,), daemon=True) for i in range(2)]
        for t in threads:
            t.start()
        deadline = time.time() + 30
        while srv.metrics.in_flight < clients + 2 and time.time() < deadline:
            time.sleep(0.005)
        t0 = time.perf_counter()
        th.loop.call_soon_threadsafe(th.stop_event.set)
        for t in threads:
            t.join(30)
        th.thread.join(30)
        dt = time.perf_counter() - t0
    finally:
        th.__exit__(None, None, None)
    kinds = {k: got.count(k) for k in sorted(set(got))}
    ok = (
        len(got) == clients + 2
        and set(kinds) <= {"actions", "shutting down"}
        and kinds.get("shutting down", 0) > 0  # the timeout was reached: the case under test
        and srv.unanswered == 0
        and dt <= drain_timeout + delay + 2.0
    )
    return Trial(
        "drain_timeout_in_flight", ok, dt, {"replies": kinds, "unanswered": srv.unanswered, "s": round(dt, 2)}
    )


# ----------------------------------------------------------------------------- vla serve + SIGTERM


def start_cli_server(policy_dir: Path, *extra: str) -> tuple[subprocess.Popen, int, int]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [PY, "-m", "vlastack.cli", "serve", "--policy", str(policy_dir), "--port", "0", *extra],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"serving ws://127.0.0.1:(\d+) \(HTTP on (\d+)\)", line)
        if m:
            return proc, int(m.group(1)), int(m.group(2))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("vla serve did not start")


def sigterm_and_wait(proc: subprocess.Popen, timeout: float = 60) -> tuple[int | None, float]:
    """SIGTERM ``proc`` -> (its exit code, None if it had to be killed after ``timeout``; seconds)."""
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    return rc, time.perf_counter() - t0


def sigterm_under_load_trial(
    policy_dir: Path, clients: int = 8, backoff_s: float = 0.02, drain_timeout: float = 10.0
) -> Trial:
    """``vla serve`` gets SIGTERM while clients keep sending (on fresh connections, backing off
    ``backoff_s`` after a 503; 0: a retry storm): every request that reached the server gets a reply
    (200, or 503 while draining); afterwards connections are refused, never reset half-way; the
    process exits 0 within ``drain_timeout`` (+2 s for the exit; a storm once held it 28.6 s)."""
    proc, _, hport = start_cli_server(policy_dir, "--drain-timeout", str(drain_timeout))
    stop = threading.Event()
    results: list[str] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        body = act_body(i)
        while not stop.is_set():
            try:
                r = str(post_act(hport, body, timeout=30)[0])
            except ConnectionRefusedError:
                r = "refused"
            except Exception as e:
                r = type(e).__name__
            with lock:
                results.append(r)
            if r == "refused":
                return
            if r == "503" and backoff_s:  # a client that honours "shutting down" backs off first
                time.sleep(backoff_s)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    rc, dt = sigterm_and_wait(proc)
    stop.set()
    for t in threads:
        t.join(30)
    kinds = {k: results.count(k) for k in sorted(set(results))}
    bad = {k: v for k, v in kinds.items() if k not in ("200", "503", "refused")}
    ok = rc == 0 and not bad and kinds.get("200", 0) > 0 and dt <= drain_timeout + 2
    name = "sigterm_under_load" + ("" if backoff_s else "_retry_storm")
    return Trial(name, ok, dt, {"rc": rc, "exit_s": round(dt, 2), "replies": kinds})


def large_upload_sigterm_trial(
    policy_dir: Path,
    ws_clients: int = 8,
    http_clients: int = 0,
    side: int = 2000,
    drain_timeout: float = 10,
    eager: bool = False,
) -> Trial:
    """Issue #34 item 1: ``vla serve --drain-timeout`` gets SIGTERM while websocket (and HTTP)
    clients keep uploading ``side`` x ``side`` images, one request at a time each. Every message a
    websocket client finished sending gets a reply (actions, or ``shutting down`` after which the
    client stops, as a polite client does), never only the close frame; HTTP clients get 200 or 503,
    never a reset; the process exits 0 within ``drain_timeout`` (+2 s of slack for the exit).
    ``eager``: clients retry at once after ``shutting down`` / 503 until closed or refused; a message
    sent after the client was told ``shutting down`` may then get the close frame (the client knows
    to go elsewhere), any other may not."""
    from openpi_client import msgpack_numpy
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    proc, port, hport = start_cli_server(policy_dir, "--drain-timeout", str(drain_timeout))
    signalled = threading.Event()
    results: list[str] = []
    lock = threading.Lock()

    def note(r: str) -> None:
        with lock:
            results.append(r)

    def big_obs(i: int) -> dict:
        obs = make_obs(i)
        obs["images"]["scene"] = np.random.default_rng(i).integers(0, 256, (side, side, 3), dtype=np.uint8)
        return obs

    def ws_client(i: int) -> None:
        msg = msgpack_numpy.packb(big_obs(i))
        try:
            ws = connect(f"ws://{HOST}:{port}", max_size=None, open_timeout=30, close_timeout=5)
            ws.recv(timeout=30)  # metadata
        except Exception as e:
            return note(f"ws connect: {type(e).__name__}")
        told = False  # this client was told "shutting down"
        with ws:
            while True:
                try:
                    ws.send(msg)
                except ConnectionClosed:
                    return note("ws closed before the message was sent")  # no bytes of it to answer
                try:
                    reply = ws.recv(timeout=60)
                except ConnectionClosed as e:
                    if told:
                        return note("ws closed after shutting down")
                    return note(f"ws closed as it was sent (close {e.rcvd.code if e.rcvd else None})")
                except TimeoutError:
                    return note("ws RESET (no reply in 60 s)")
                if isinstance(reply, bytes):
                    note("ws actions")
                elif "shutting down" in reply:
                    note("ws shutting down")
                    told = True
                    if not eager:
                        return None
                else:
                    return note(f"ws error: {reply[:60]}")

    def http_client(i: int) -> None:
        img = big_obs(i)["images"]["scene"]
        body = json.dumps({
            "images": {"scene": {"b64": base64.b64encode(img.tobytes()).decode(), "dtype": "uint8",
                                 "shape": list(img.shape)}},
            "state": make_obs(i)["state"].tolist(), "prompt": "pick up the red cube",
        }).encode()  # fmt: skip
        while True:
            try:
                r = f"http {post_act(hport, body, timeout=60)[0]}"
            except ConnectionRefusedError:
                return note("http refused")
            except Exception as e:
                return note(f"http RESET ({type(e).__name__})")
            note(r)
            if (r == "http 503" and not eager) or (r == "http 200" and signalled.is_set()):
                return

    threads = [threading.Thread(target=ws_client, args=(i,), daemon=True) for i in range(ws_clients)]
    threads += [threading.Thread(target=http_client, args=(i,), daemon=True) for i in range(http_clients)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    signalled.set()
    rc, exit_s = sigterm_and_wait(proc)
    for t in threads:
        t.join(60)
    log_tail = proc.stderr.read()[-2000:] if proc.stderr else ""
    kinds = {k: results.count(k) for k in sorted(set(results))}
    # The server's count is the truth for "arrived before the close": a client whose send completed
    # just as the close frame went out sees a close without a reply, but its message never arrived.
    m = re.search(r"drained: (\d+) websocket message\(s\) arrived but got no reply", log_tail)
    lost = (int(m.group(1)) if m else 0) + sum(v for k, v in kinds.items() if "RESET" in k)
    drained = re.findall(r"(?:shutting down|drained): .*", log_tail)
    ok = (
        rc == 0
        and lost == 0
        and exit_s <= drain_timeout + 2
        and any("actions" in k or "200" in k for k in kinds)
        and any(d.startswith("drained") for d in drained)
    )
    return Trial(
        "sigterm_large_uploads" + ("_eager" if eager else ""),
        ok,
        exit_s,
        {
            "rc": rc,
            "exit_s": round(exit_s, 2),
            "replies": kinds,
            "lost": lost,
            "log": drained[-2:],
        },
    )
