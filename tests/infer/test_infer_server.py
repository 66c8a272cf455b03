import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from tests.infer.conftest import ACTION_DIM, make_obs
from vlastack.infer.policy import Policy
from vlastack.infer.server import PolicyServer, ServerThread
from vlastack.infer.wire import WireError, packb, unpackb

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def server(policy_dir):
    srv = PolicyServer(Policy.from_pretrained(policy_dir, seed=0), port=0, token=TOKEN, max_batch=4)
    with ServerThread(srv) as s:
        yield s


def _http(srv, path, body=None, token=TOKEN):
    req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}{path}", data=body)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_wire_matches_openpi_encoding():
    obj = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.int64(3), "s": "x", "n": [1, 2.5]}
    ours = unpackb(msgpack_numpy.packb(obj), 2**20)
    np.testing.assert_array_equal(ours["a"], obj["a"])
    assert ours["b"] == 3 and ours["s"] == "x" and ours["n"] == [1, 2.5]
    theirs = msgpack_numpy.unpackb(packb(obj))
    np.testing.assert_array_equal(theirs["a"], obj["a"])
    bad = msgpack_numpy.packb({"a": np.zeros(2)}).replace(b"<f8", b"|O8")
    with pytest.raises(WireError, match="dtype"):
        unpackb(bad, 2**20)


def test_openpi_client_round_trip(server):
    client = WebsocketClientPolicy("127.0.0.1", server.port, api_key=TOKEN)
    md = client.get_server_metadata()
    assert md["camera_names"] == ["scene", "wrist"] and md["action_dim"] == ACTION_DIM
    out = client.infer(make_obs())
    assert out["actions"].shape == (16, ACTION_DIM) and out["actions"].dtype == np.float32
    assert out["server_timing"]["infer_ms"] > 0
    flat = make_obs(1)
    flat = {"observation/image": flat["images"]["scene"], "observation/state": flat["state"], "prompt": "go"}
    assert client.infer(flat)["actions"].shape == (16, ACTION_DIM)
    with pytest.raises(RuntimeError, match="state"):
        client.infer({"images": make_obs()["images"], "prompt": "x"})
    assert client.infer(make_obs(2))["actions"].shape == (16, ACTION_DIM)  # connection still usable


def test_large_messages_decode_off_the_loop_same_answers(server, monkeypatch):
    """Messages up to INLINE_DECODE_BYTES are decoded on the event loop, larger ones on a decoder
    thread: both paths answer, and refuse a bad observation the same way."""
    from vlastack.infer import server as server_mod

    client = WebsocketClientPolicy("127.0.0.1", server.port, api_key=TOKEN)
    inline = client.infer(make_obs(3))["actions"]
    monkeypatch.setattr(server_mod, "INLINE_DECODE_BYTES", 0)  # every message off the loop
    off = client.infer(make_obs(3))["actions"]
    assert off.shape == inline.shape and np.isfinite(off).all()
    with pytest.raises(RuntimeError, match="state"):
        client.infer({"images": make_obs()["images"], "prompt": "x"})
    assert client.infer(make_obs(2))["actions"].shape == (16, ACTION_DIM)


def test_auth_rejected(server):
    import websockets

    with pytest.raises(websockets.exceptions.InvalidStatus, match="401"):
        WebsocketClientPolicy("127.0.0.1", server.port, api_key="wrong")
    with pytest.raises(websockets.exceptions.InvalidStatus, match="401"):
        WebsocketClientPolicy("127.0.0.1", server.port)
    assert _http(server, "/act", b"{}", token="nope")[0] == 401
    assert _http(server, "/metrics", token=None)[0] == 401
    assert _http(server, "/healthz", token=None) == (200, b"ok\n")


def test_http_act_healthz_metrics(server):
    obs = make_obs(3)
    img = obs["images"]["scene"]
    body = {
        "images": {
            "scene": {
                "b64": base64.b64encode(img.tobytes()).decode(),
                "dtype": "uint8",
                "shape": list(img.shape),
            }
        },
        "state": obs["state"].tolist(),
        "prompt": obs["prompt"],
    }
    status, raw = _http(server, "/act", json.dumps(body).encode())
    assert status == 200, raw
    actions = np.asarray(json.loads(raw)["actions"], np.float32)
    assert actions.shape == (16, ACTION_DIM) and np.isfinite(actions).all()
    body["images"]["scene"] = img.tolist()  # nested lists work too
    assert _http(server, "/act", json.dumps(body).encode())[0] == 200
    status, raw = _http(server, "/act", b'{"state": [1, 2]}')
    assert status == 400 and b"image" in raw
    status, text = _http(server, "/metrics")
    text = text.decode()
    assert status == 200 and 'vla_requests_total{transport="http",status="ok"}' in text
    assert "vla_request_latency_seconds_bucket" in text and 'vla_errors_total{reason="bad_request"}' in text


def test_concurrent_clients_are_micro_batched(server):
    errors, results = [], []

    def worker(i):
        try:
            c = WebsocketClientPolicy("127.0.0.1", server.port, api_key=TOKEN)
            for j in range(4):
                results.append(c.infer(make_obs(i * 10 + j))["server_timing"]["batch_size"])
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 24
    assert max(results) > 1 and max(results) <= 4  # batched, never above --max-batch


def test_cli_serve_sigterm_finishes_in_flight(policy_dir):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vlastack.cli",
            "serve",
            "--policy",
            str(policy_dir),
            "--port",
            "0",
            "--http-port",
            "-1",
            "--drain-timeout",
            "10",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        port = None
        deadline = time.time() + 60
        while port is None and time.time() < deadline:
            line = proc.stderr.readline()
            if "serving ws://" in line:
                port = int(line.split("ws://127.0.0.1:")[1].split()[0])
        assert port, "server did not report its port"
        client = WebsocketClientPolicy("127.0.0.1", port)
        got = []
        t = threading.Thread(target=lambda: got.append(client.infer(make_obs())))
        t.start()
        time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert got and got[0]["actions"].shape == (16, ACTION_DIM)
        assert proc.wait(30) == 0
        rest = proc.stderr.read()
        assert "shutting down:" in rest and "answered in" in rest, rest  # the drain is logged
    finally:
        if proc.poll() is None:
            proc.kill()


def test_token_head_policy_is_served_with_a_validity_flag(tmp_path):
    """A FAST token-head policy goes through Policy + server unchanged; replies carry `valid`."""
    import torch

    from tests.infer.conftest import make_normalizer, micro_config
    from vlastack.config import TokenHeadConfig
    from vlastack.models import build_model

    cfg = micro_config()
    cfg = type(cfg)(
        **{
            **cfg.__dict__,
            "head": "tokens",
            "head_options": TokenHeadConfig(tokenizer="fast", placement="new_rows"),
        }
    )
    torch.manual_seed(0)
    model = build_model(cfg)
    chunks = torch.linspace(-1, 1, 16)[None, :, None].repeat(64, 1, ACTION_DIM) * torch.rand(64, 1, 1)
    model.head.fit_tokenizer(torch.nn.functional.pad(chunks, (0, cfg.action_dim - ACTION_DIM)),
                             action_dim_mask=torch.arange(cfg.action_dim) < ACTION_DIM)  # fmt: skip
    model.save_pretrained(tmp_path)
    make_normalizer().save(tmp_path / "norm_stats.json")
    policy = Policy.from_pretrained(tmp_path, seed=0)
    local = policy.infer(make_obs())
    assert local["actions"].shape == (16, ACTION_DIM) and isinstance(local["valid"], bool)
    with ServerThread(PolicyServer(policy, port=0)) as srv:
        out = WebsocketClientPolicy("127.0.0.1", srv.port).infer(make_obs())
    assert out["actions"].shape == (16, ACTION_DIM) and out["valid"] == local["valid"]


def test_busy_port_is_one_line_naming_it(server, policy_dir, capsys):
    """Issue #34 item 2: a second server on a port in use says which port and what to pass."""
    from vlastack.cli import main

    for flag, port in (("--port", server.port), ("--http-port", server.http_port)):
        args = ["serve", "--policy", str(policy_dir), "--port", str(server.port if flag == "--port" else 0)]
        args += ["--http-port", str(port if flag == "--http-port" else -1)]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"error: port {port} on" in err and "already in use" in err and f"{flag} 0" in err, err
        assert "Traceback" not in err and "Errno" not in err


def _ws_error(srv, obs) -> str:
    """Send one observation over the websocket; the server's error text (or '' for actions)."""
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{srv.port}", additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        ws.recv()  # metadata
        ws.send(packb(obs))
        reply = ws.recv()
    return reply if isinstance(reply, str) else ""


def test_one_pixel_and_state_validator_on_every_path(server, policy_dir):
    """Issue #34 items 3 and 4: uint8, or float in [0, 1] (the same actions as its uint8 rounding),
    on the Python API, the websocket and HTTP; out-of-range floats, NaN and overflowing states are
    refused naming the key on all three (HTTP used to wrap 300 to 44 and -5 to 251)."""
    policy = Policy.from_pretrained(policy_dir, seed=0)
    obs = make_obs(4)
    as_float = {**obs, "images": {"scene": obs["images"]["scene"].astype(np.float32) / 255}}
    ref = policy.infer(obs)["actions"]
    same_noise = Policy.from_pretrained(policy_dir, seed=0)
    np.testing.assert_array_equal(same_noise.infer(as_float)["actions"], ref)
    body = {"images": {"scene": as_float["images"]["scene"].tolist()}, "state": obs["state"].tolist(),
            "prompt": obs["prompt"]}  # fmt: skip
    status, raw = _http(server, "/act", json.dumps(body).encode())
    assert status == 200, raw
    assert _ws_error(server, as_float) == ""

    img = obs["images"]["scene"]
    for value, says in ((300, "0..255"), (-5, "0..255"), (0.5 + 1, "[1.5, 1.5]")):
        bad = np.full(img.shape, value, np.float32 if isinstance(value, float) else np.int64)
        status, raw = _http(server, "/act", json.dumps({**body, "images": {"scene": bad.tolist()}}).encode())
        assert status == 400 and says.encode() in raw, (value, raw)
    nan = {**obs, "images": {"scene": np.full(img.shape, np.nan, np.float32)}}
    with pytest.raises(ValueError) as e:
        policy.infer(nan)
    for msg in (str(e.value), _ws_error(server, nan)):
        assert "image 'scene'" in msg and "NaN" in msg, msg

    huge64 = {**obs, "state": np.full(obs["state"].shape, 1e300, np.float64)}
    huge32 = {**obs, "state": np.full(obs["state"].shape, 3e38, np.float32)}
    with pytest.raises(ValueError, match="'state' has values beyond float32's range"):
        policy.infer(huge64)
    from unittest import mock

    # a std below 1 (here: x 10) takes a finite float32 state past float32's range when normalized
    with (
        mock.patch.object(policy.normalizer, "normalize", lambda key, x: x * np.float32(10)),
        pytest.raises(ValueError, match="'state' overflows when normalized"),
    ):
        policy.infer(huge32)
    assert "'state'" in _ws_error(server, huge64)
    b64 = {"b64": base64.b64encode(huge64["state"].tobytes()).decode(), "dtype": "float64",
           "shape": list(huge64["state"].shape)}  # fmt: skip
    status, raw = _http(server, "/act", json.dumps({**body, "state": b64}).encode())
    assert status == 400 and b"'state'" in raw and b"weights" not in raw, raw


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_fast_server_serves_plain_and_real_time_chunking(tmp_path, variant):
    """``vla serve --fast``: plain and RTC requests through the real openpi client answer as the
    unprepared policy does (same seed, same request order); pi0.5's RTC needs the adaptive norms'
    own dense layers back (``fastpath.generic_time``)."""
    from tests.infer.conftest import make_normalizer, micro_config
    from vlastack.config import apply_overrides, tiny
    from vlastack.models import build_model

    cfg = micro_config() if variant == "pi0" else apply_overrides(tiny(), [
        "model.head_options.variant=pi05", "model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1",
        "model.head_options.num_denoise_steps=2", "model.max_text_len=128"]).model  # fmt: skip
    torch.manual_seed(0)
    build_model(cfg).save_pretrained(tmp_path)
    make_normalizer().save(tmp_path / "norm_stats.json")
    ref = Policy.from_pretrained(tmp_path, seed=0)
    srv = PolicyServer(Policy.from_pretrained(tmp_path, seed=0, fast=True), port=0, max_batch=1)
    prefix = np.linspace(0, 1, 8 * ACTION_DIM, dtype=np.float32).reshape(8, ACTION_DIM)
    reqs = [make_obs(0), {**make_obs(1), "action_prefix": prefix, "inference_delay": 2}, make_obs(2)]
    with ServerThread(srv) as s:
        client = WebsocketClientPolicy("127.0.0.1", s.port)
        for i, req in enumerate(reqs):
            got, want = client.infer(req)["actions"], ref.infer(req)["actions"]
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=f"request {i}")


class _CountingPolicy:
    """A stand-in policy: records the size of each forward pass."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def infer_results(self, obs: list) -> list[dict]:
        self.batches.append(len(obs))
        return [{"actions": np.zeros((2, 3), np.float32)} for _ in obs]


def test_batcher_latency_cap_gathers_staggered_requests():
    from vlastack.infer.metrics import Metrics
    from vlastack.infer.server import Batcher

    # Environments that step out of lockstep: with a 5 s cap, three observations 20 ms apart share
    # one pass (max_batch 3 ends the wait early); the cap is an upper bound, so no timing can flip it.
    pol = _CountingPolicy()
    b = Batcher(pol, max_batch=3, metrics=Metrics(), max_wait_ms=5000)
    t0 = time.perf_counter()
    futs = []
    for i in range(3):
        futs.append(b.submit(make_obs(i)))
        time.sleep(0.02)
    sizes = [f.result(30)[1]["batch_size"] for f in futs]
    assert sizes == [3, 3, 3] and pol.batches == [3] and time.perf_counter() - t0 < 5
    # A lone observation waits for the cap, then goes alone (its queue_ms says how long it waited).
    f = b.submit(make_obs(9))
    b2 = Batcher(_CountingPolicy(), max_batch=8, metrics=Metrics(), max_wait_ms=100)
    out, timing = b2.submit(make_obs(0)).result(30)
    assert timing["batch_size"] == 1 and timing["queue_ms"] >= 99 and out["actions"].shape == (2, 3)
    b2.close()
    b.close()  # the queued one is answered before the thread stops
    assert f.result(1)[1]["batch_size"] == 1
    with pytest.raises(ValueError, match="max_wait_ms"):
        Batcher(pol, max_batch=2, metrics=Metrics(), max_wait_ms=-1)


def test_batcher_answers_what_is_queued_behind_a_stop():
    from vlastack.infer.metrics import Metrics
    from vlastack.infer.server import Batcher, Unavailable

    go = threading.Event()

    class Held(_CountingPolicy):  # holds the first pass until the queue is laid out
        def infer_results(self, obs: list) -> list[dict]:
            go.wait(30)
            return super().infer_results(obs)

    b = Batcher(Held(), max_batch=4, metrics=Metrics())
    first = b.submit(make_obs(0))
    while not b.q.empty():  # the thread took it and sits in the held pass
        time.sleep(0.001)
    second = b.submit(make_obs(1))
    b.q.put(None)  # a stop, then a request that slipped in behind it
    late = b.submit(make_obs(2))
    go.set()
    b.thread.join(30)
    assert first.result(1)[1]["batch_size"] == 1 and second.result(1)[1]["batch_size"] == 1
    with pytest.raises(Unavailable):
        late.result(1)


def test_batcher_abandon_fails_what_has_not_started():
    from vlastack.infer.metrics import Metrics
    from vlastack.infer.server import Batcher, Unavailable

    go = threading.Event()

    class Held(_CountingPolicy):
        def infer_results(self, obs: list) -> list[dict]:
            go.wait(30)
            return super().infer_results(obs)

    b = Batcher(Held(), max_batch=1, metrics=Metrics())
    running = b.submit(make_obs(0))
    while not b.q.empty():
        time.sleep(0.001)
    queued = [b.submit(make_obs(i)) for i in range(1, 4)]
    assert b.abandon("drain timeout") == 3
    go.set()
    b.close()
    assert running.result(1)[1]["batch_size"] == 1  # a pass under way finishes
    for f in queued:
        with pytest.raises(Unavailable, match="drain timeout"):
            f.result(1)


def test_pick_threads_counts_free_cpus(monkeypatch):
    from vlastack.infer import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: 4)
    monkeypatch.setattr(threads, "idle_cpus", lambda s: 1.2)
    assert threads.pick_threads()[0] == 1
    monkeypatch.setattr(threads, "idle_cpus", lambda s: 0.1)
    assert threads.pick_threads()[0] == 1  # never 0
    monkeypatch.setattr(threads, "idle_cpus", lambda s: 7.9)  # a big machine, a small cpuset
    assert threads.pick_threads()[0] == 4
    monkeypatch.setattr(threads, "idle_cpus", lambda s: None)
    assert threads.pick_threads()[0] == 4
    assert threads.pick_threads(3)[0] == 3
    with pytest.raises(ValueError, match="--threads"):
        threads.pick_threads(0)
