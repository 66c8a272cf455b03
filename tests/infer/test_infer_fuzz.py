"""Hostile input against a live server: it must answer every bad message with a reason (or close
an oversized one), keep serving, and keep its memory bounded."""

import http.client
import random
import time

import msgpack
import numpy as np
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.infer.conftest import make_obs
from vlastack.infer.policy import Policy
from vlastack.infer.server import PolicyServer, ServerThread

MAX_BYTES = 256 * 1024


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _nd(dtype="<f4", shape=(6,), data=b"\0" * 24, **extra):
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": list(shape), **extra}


def hostile_messages(rng: random.Random, valid: bytes):
    """Yield (kind, bytes|str) forever, cycling through attack families with random parameters."""
    img = _nd("|u1", (8, 8, 3), b"\1" * 192)
    state = _nd()
    families = [
        lambda: ("garbage", rng.randbytes(rng.randint(1, 300))),
        lambda: ("truncated", valid[: rng.randint(1, len(valid) - 1)]),
        lambda: ("text", "hello " * rng.randint(1, 50)),
        lambda: ("not_a_dict", msgpack.packb(rng.choice([[1, 2], 3, "x", None, 1.5, b"raw"]))),
        lambda: (
            "wrong_type_state",
            msgpack.packb({"images": {"scene": img}, "state": rng.choice(["s", 1, [1] * 6]), "prompt": "p"}),
        ),
        lambda: (
            "wrong_type_prompt",
            msgpack.packb({"images": {"scene": img}, "state": state, "prompt": rng.choice([1, [], {}])}),
        ),
        lambda: ("images_not_dict", msgpack.packb({"images": [img], "state": state, "prompt": "p"})),
        lambda: ("huge_shape", msgpack.packb({"state": _nd(shape=(2 ** rng.randint(31, 62),))})),
        lambda: (
            "huge_image",
            msgpack.packb(
                {"images": {"scene": _nd("|u1", (60000, 60000, 3), b"\0" * 8)}, "state": state, "prompt": "p"}
            ),
        ),
        lambda: ("declared_str_2GB", b"\x81\xa1a\xdb\x7f\xff\xff\xff" + rng.randbytes(16)),
        lambda: ("declared_array_4G", b"\xdd\xff\xff\xff\xff" + b"\xc0" * rng.randint(0, 64)),
        lambda: ("declared_map_4G", b"\xdf\xff\xff\xff\xff" + b"\xa1a\xc0" * rng.randint(0, 16)),
        lambda: (
            "size_mismatch",
            msgpack.packb(
                {"images": {"scene": img}, "state": _nd(data=b"\0" * rng.randint(0, 23)), "prompt": "p"}
            ),
        ),
        lambda: (
            "bad_dtype",
            msgpack.packb(
                {"state": _nd(dtype=rng.choice(["|O8", "<c8", ">f4", "|V24", "<U6", "float32", 7]))}
            ),
        ),
        lambda: (
            "nan_state",
            msgpack_numpy.packb(
                {
                    "images": {"scene": np.zeros((8, 8, 3), np.uint8)},
                    "state": np.full(6, rng.choice([np.nan, np.inf, -np.inf]), np.float32),
                    "prompt": "p",
                }
            ),
        ),
        lambda: (
            "wrong_shape",
            msgpack_numpy.packb(
                {
                    "images": {"scene": np.zeros(rng.choice([(8, 8), (8, 8, 4), (2, 2, 2, 3)]), np.uint8)},
                    "state": np.zeros(6, np.float32),
                    "prompt": "p",
                }
            ),
        ),
        lambda: (
            "wrong_state_dim",
            msgpack_numpy.packb(
                {
                    "images": {"scene": np.zeros((8, 8, 3), np.uint8)},
                    "state": np.zeros(rng.randint(0, 30) or 7, np.float32),
                    "prompt": "p",
                }
            ),
        ),
        lambda: ("unknown_key", msgpack_numpy.packb({**make_obs(), f"k{rng.randint(0, 999)}": 1})),
        lambda: (
            "unknown_camera",
            msgpack_numpy.packb({**make_obs(), "images": {"cam_x": np.zeros((8, 8, 3), np.uint8)}}),
        ),
        lambda: ("deep_nesting", b"\x91" * rng.randint(50, 200_000) + b"\xc0"),
        lambda: ("deep_maps", b"\x81\xa1a" * rng.randint(20, 5000) + b"\xc0"),
        lambda: ("ext_type", msgpack.packb(msgpack.ExtType(rng.randint(0, 127), b"xyz"))),
        lambda: ("timestamp", msgpack.packb({"t": msgpack.Timestamp(1, 2)})),
        lambda: ("extra_nd_keys", msgpack.packb({"state": _nd(evil=b"x")})),
        lambda: (
            "npgeneric_bad",
            msgpack.packb({"state": {b"__npgeneric__": True, b"data": "x" * 10, b"dtype": "<f4"}}),
        ),
        lambda: ("int_keys", msgpack.packb({1: 2, 3: 4}, strict_types=False)),
        lambda: ("long_prompt", msgpack_numpy.packb({**make_obs(), "prompt": "a" * 5000})),
        lambda: ("empty", b""),
    ]
    while True:
        yield families[rng.randrange(len(families))]()


def test_fuzz_server_survives_hostile_messages(policy_dir):
    srv = PolicyServer(Policy.from_pretrained(policy_dir, seed=0), port=0, max_message_bytes=MAX_BYTES)
    with ServerThread(srv) as s:
        url = f"ws://127.0.0.1:{s.port}"
        valid = msgpack_numpy.packb(make_obs())
        ws = connect(url, max_size=None, compression=None)
        ws.recv()  # metadata
        ws.send(valid)
        assert isinstance(ws.recv(), bytes)
        rss0 = _rss_mb()
        rng = random.Random(0)
        gen = hostile_messages(rng, valid)
        kinds: dict[str, int] = {}
        sent, closed, t0 = 0, 0, time.time()
        while sent < 1100 and time.time() - t0 < 60:
            kind, msg = next(gen)
            if sent % 100 == 50:  # now and then, more than the size limit: the server closes
                kind, msg = "oversized", b"\x00" * (MAX_BYTES + rng.randint(1, 4096))
            ws.send(msg)
            sent += 1
            kinds[kind] = kinds.get(kind, 0) + 1
            try:
                reply = ws.recv(timeout=10)
                assert isinstance(reply, str) and reply.startswith("error: "), (kind, reply[:200])
                assert kind != "oversized"
            except ConnectionClosed as e:
                assert kind == "oversized" and e.rcvd.code == 1009, (kind, e)
                closed += 1
                ws = connect(url, max_size=None, compression=None)
                ws.recv()
        assert sent >= 1000, f"only {sent} messages in time"
        assert closed >= 10 and len(kinds) >= 25
        # Raw HTTP: hostile bodies and headers on the /act port.
        for i in range(60):
            conn = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=10)
            body = [
                b"{",
                b"[1,2]",
                b'{"state": "x"}',
                b"\xff\xfe",
                b"[" * 100_000,
                b'{"images": {"scene": {"b64": "!!", "dtype": "uint8", "shape": [9999999, 9999999]}}}',
            ][i % 6]
            headers = {"Content-Length": str(len(body))} if i % 7 else {"Content-Length": "99999999999"}
            conn.request("POST", "/act", body=body, headers=headers)
            status = conn.getresponse().status
            assert status in (400, 413), (i, status)
            conn.close()
        ws.close()
        # Still serving: the real client gets actions.
        client = WebsocketClientPolicy("127.0.0.1", s.port)
        assert client.infer(make_obs(5))["actions"].shape == (16, 7)
        growth = _rss_mb() - rss0
        assert growth < 150, f"RSS grew by {growth:.0f} MB"
        assert srv.metrics.errors["bad_request"] >= 900
    print(
        f"fuzz: {sent} ws messages ({closed} oversized closes), 60 http bodies, RSS +{growth:.1f} MB, "
        f"{time.time() - t0:.1f}s; kinds: {sorted(kinds)}"
    )
