"""Fuzzing a running seed: >= 1,000 malformed request frames, >= 1,000 malformed manifests, and a
slow-loris run. The seed must answer every bad request with an ERROR frame or a close, never leak a
thread traceback, never hold more threads or descriptors than its connection cap allows, and still
serve a correct transfer afterwards. Seeded generation; sizes are CI-sized (a few seconds)."""

from __future__ import annotations

import copy
import json
import random
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi import FastAPI, Response

from vllm_ascend.netloader.client import NetLoaderError, SeedClient
from vllm_ascend.netloader.manifest import Manifest, ManifestError
from vllm_ascend.netloader.protocol import (
    MAGIC,
    PREFIX,
    VERSION,
    MessageType,
    ProtocolError,
    encode,
    loads_bounded,
)
from vllm_ascend.netloader.seed_server import SeedServer
from vllm_ascend.netloader.transfer import TensorStreamServer

from .conftest import make_state_dict, open_fds, read_answer, same_tensors

FRAMES = 1200
MANIFESTS = 1200
HTTP_MANIFESTS = 60
CAP = 6


def _frame(
    kind: int, header: bytes, payload: bytes = b"", version: int = VERSION, magic: bytes = MAGIC
) -> bytes:
    return PREFIX.pack(magic, version, kind, len(header), len(payload)) + header + payload


def _json_value(rng: random.Random, depth: int = 0):
    """A random JSON value: deep nesting, huge or negative integers, floats, odd strings."""
    pick = rng.randrange(9 if depth < 12 else 6)
    if pick == 0:
        return rng.choice([0, -1, 2**63, -(2**63) - 1, 10 ** rng.randrange(1, 400), rng.randrange(1 << 70)])
    if pick == 1:
        return rng.choice([1.5, -0.0, 1e308, float("nan"), float("inf")])
    if pick == 2:
        return rng.choice(
            ["", "step", "embed.weight", "\u0000", "é" * rng.randrange(50), "x" * rng.randrange(3000)]
        )
    if pick == 3:
        return rng.choice([True, False, None])
    if pick in (4, 5):
        return "layers.0.q"
    if pick in (6, 7):
        return [_json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        rng.choice(["names", "x", "mac", "nonce", "message"]): _json_value(rng, depth + 1) for _ in range(2)
    }


def _malformed_requests(rng: random.Random, n: int) -> list[bytes]:
    valid = encode(MessageType.TENSOR_REQUEST, {"names": ["step", "layers.0.q"]})
    out: list[bytes] = []
    while len(out) < n:
        case = rng.randrange(11)
        if case == 0:  # random bytes
            out.append(rng.randbytes(rng.randrange(0, 300)))
        elif case == 1:  # bit flips in a valid request
            data = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            out.append(bytes(data))
        elif case == 2:  # truncated
            out.append(valid[: rng.randrange(len(valid))])
        elif case == 3:  # prefix fields out of range
            header = b'{"names":[]}'
            out.append(
                PREFIX.pack(
                    rng.choice([MAGIC, b"VANX", b"\0\0\0\0"]),
                    rng.randrange(256),
                    rng.randrange(256),
                    rng.choice([len(header), 0, 1 << 20, (1 << 32) - 1]),
                    rng.choice([0, 1, (1 << 64) - 1]),
                )
                + header
            )
        elif case == 4:  # random JSON under "names"
            text = json.dumps({"names": _json_value(rng)}, allow_nan=True).encode()
            out.append(_frame(MessageType.TENSOR_REQUEST, text))
        elif case == 5:  # random JSON header
            out.append(
                _frame(MessageType.TENSOR_REQUEST, json.dumps(_json_value(rng), allow_nan=True).encode())
            )
        elif case == 6:  # deep nesting
            depth = rng.randrange(9, 200_000)
            out.append(_frame(MessageType.TENSOR_REQUEST, b'{"names":' + b"[" * depth + b"]" * depth + b"}"))
        elif case == 7:  # huge integers, non-UTF-8, broken JSON
            body = rng.choice(
                [
                    b'{"names":[' + b"9" * rng.randrange(20, 50_000) + b"]}",
                    b'{"names":["\xff\xfe"]}',
                    b'{"names":["a"',
                    b'{"names":["a"]}' * 3,
                ]
            )
            out.append(_frame(MessageType.TENSOR_REQUEST, body))
        elif case == 8:  # another message type where the request belongs
            kind = rng.choice([MessageType.TENSOR, MessageType.END, MessageType.ERROR, MessageType.CHALLENGE])
            header = {
                MessageType.TENSOR: {"name": "step", "offset": 0, "start": 0, "length": 0},
                MessageType.END: {"tensors": 0, "bytes": 0},
                MessageType.ERROR: {"message": "x"},
                MessageType.CHALLENGE: {"nonce": "00", "auth": False},
            }[kind]
            out.append(encode(kind, header))
        elif case == 9:  # many unknown names (the ERROR message must be cut to fit a frame)
            names = [f"n{rng.randrange(1 << 30)}" for _ in range(rng.randrange(1, 30_000))]
            out.append(encode(MessageType.TENSOR_REQUEST, {"names": names}))
        else:  # a request that lies about its payload
            out.append(
                _frame(
                    MessageType.TENSOR_REQUEST, b'{"names":[]}', payload=rng.randbytes(rng.randrange(1, 64))
                )
            )
    return out


def _exchange(port: int, request: bytes) -> tuple[list, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        try:
            conn.sendall(request)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the seed already answered and closed
        return read_answer(conn)


def _check_answer(frames: list, ending: str, state_dict) -> str:
    """Classify one answer; anything but an ERROR frame, a close or a correct answer fails the test."""
    assert not ending.startswith("bad frame"), ending
    assert frames == [] or frames[0][0] == "CHALLENGE", frames[:1]
    rest = frames[1:]
    if not rest:
        return "closed"
    if rest[0][0] == "ERROR":
        assert len(rest) == 1, rest
        return "error frame"
    # the mutation happened to be a valid request: the answer must be whole and consistent
    assert rest[-1][0] == "END", rest[-3:]
    sent = sum(p for kind, _, p in rest if kind == "TENSOR")
    assert rest[-1][1]["bytes"] == sent
    assert all(h["name"] in state_dict for kind, h, _ in rest if kind == "TENSOR")
    return "served"


def test_fuzzed_requests(thread_errors):
    state_dict = make_state_dict()
    rng = random.Random(20261201)
    requests = _malformed_requests(rng, FRAMES)
    with SeedServer.serving(state_dict, max_connections=CAP, timeout=5, chunk_bytes=512) as seed:
        threads, fds = threading.active_count(), open_fds()
        peak = [0, 0]

        def one(request: bytes) -> str:
            frames, ending = _exchange(seed.stream.port, request)
            peak[0] = max(peak[0], threading.active_count())
            peak[1] = max(peak[1], open_fds())
            return _check_answer(frames, ending, state_dict)

        with ThreadPoolExecutor(4) as pool:  # 4 clients at once, under the cap: nothing is refused
            outcomes = list(pool.map(one, requests))
        with SeedClient(seed.url, retries=0) as client:
            assert same_tensors(dict(client.iter_tensors()), state_dict)
        deadline = time.monotonic() + 30
        while seed.stream.active and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seed.stream.active == 0 and seed.stream.refused == 0
    counts = {k: outcomes.count(k) for k in set(outcomes)}
    assert len(outcomes) >= 1000
    assert counts["error frame"] >= 0.9 * len(outcomes), counts
    # The 4 client threads and at most CAP handlers, plus one: a handler thread still exiting after its connection
    # stopped counting as active while the next one starts (seen once in a clean-clone run: peak one above).
    assert peak[0] <= threads + 4 + CAP + 1
    assert peak[1] <= fds + 4 + CAP + 4  # client sockets, handler sockets, a little slack
    assert thread_errors == []


def _mutate_manifest(rng: random.Random, good: dict):
    bad = copy.deepcopy(good)
    for _ in range(rng.randrange(1, 4)):
        tensors = bad.get("tensors")
        use_top = rng.random() < 0.3 or not isinstance(tensors, list) or not tensors
        target = bad if use_top else rng.choice(tensors)
        if not isinstance(target, dict):
            continue
        key = rng.choice([*target.keys(), "extra"])
        action = rng.randrange(4)
        if action == 0:
            target.pop(key, None)
        elif action == 1:
            target[key] = _json_value(rng)
        elif action == 2 and isinstance(bad.get("tensors"), list):
            bad["tensors"].append(copy.deepcopy(rng.choice(bad["tensors"] or [None])))
        else:
            target[key] = rng.choice([[2**40], [-1], [1] * 100, "float32", 2**64, None, {}, [[]]])
    return bad


def test_fuzzed_manifests():
    good = Manifest.from_state_dict(make_state_dict())[0].to_dict()
    rng = random.Random(7)
    outcomes = {"valid": 0, "ManifestError": 0, "ProtocolError": 0}
    for _ in range(MANIFESTS):
        candidate = _mutate_manifest(rng, good)
        text = json.dumps(candidate, allow_nan=True).encode()
        if rng.random() < 0.3:  # byte-level damage too
            data = bytearray(text)
            data[rng.randrange(len(data))] = rng.randrange(256)
            text = bytes(data)
        try:
            Manifest.from_dict(loads_bounded(text, "manifest", max_bytes=1 << 24))
            outcomes["valid"] += 1
        except (ManifestError, ProtocolError) as exc:
            outcomes[type(exc).__name__] += 1
    assert sum(outcomes.values()) == MANIFESTS
    assert outcomes["ManifestError"] + outcomes["ProtocolError"] >= 0.9 * MANIFESTS, outcomes


def test_fuzzed_manifests_through_the_client():
    """A seed serving damaged manifests over HTTP: the client raises only the package's own errors."""
    good = Manifest.from_state_dict(make_state_dict())[0].to_dict()
    rng = random.Random(11)
    current = {"body": b""}
    app = FastAPI()

    @app.get("/manifest")
    def manifest() -> Response:
        return Response(current["body"], media_type="application/json")

    stream = TensorStreamServer(*Manifest.from_state_dict({}))
    errors = set()
    with SeedServer(stream, app=app) as seed:
        for i in range(HTTP_MANIFESTS):
            if i % 3 == 0:
                depth = rng.randrange(9, 100_000)
                current["body"] = b'{"tensors":' + b"[" * depth + b"]" * depth + b"}"
            else:
                current["body"] = json.dumps(_mutate_manifest(rng, good)).encode()
            with SeedClient(seed.url, retries=0) as client:
                try:
                    client.fetch_manifest()
                except (ManifestError, NetLoaderError) as exc:
                    errors.add(type(exc).__name__)
    assert errors == {"ManifestError"}


def test_slow_loris(thread_errors):
    """Many idle and partial connections from one address: they never take a serving slot; past the per-peer
    bound of pending connections the oldest are dropped, the rest closed at the handshake deadline, no growth."""
    state_dict = make_state_dict()
    valid = encode(MessageType.TENSOR_REQUEST, {"names": []})
    partials = [b"", valid[:3], valid[:18], valid[:-2], struct.pack("!4s", MAGIC)]
    clients = 200
    with SeedServer.serving(state_dict, max_connections=CAP, timeout=1.0, handshake_timeout=1.0) as seed:
        threads, fds = threading.active_count(), open_fds()
        conns = []
        for i in range(clients):
            conn = socket.create_connection(("127.0.0.1", seed.stream.port), timeout=30)
            conn.sendall(partials[i % len(partials)])
            conns.append(conn)
        # the seed holds a thread and a socket per pending connection (at most max_pending) and per served
        # request (at most CAP)
        bound = CAP + seed.stream.max_pending
        assert threading.active_count() <= threads + bound
        assert open_fds() <= fds + clients + bound + 2
        endings = []
        for conn in conns:
            with conn:
                frames, ending = read_answer(conn)
                assert ending in ("close", "reset"), ending
                kinds = [f[0] for f in frames]
                assert kinds in (["ERROR"], ["CHALLENGE", "ERROR"], []), kinds
                endings.append(frames[-1][1]["message"] if frames else ending)
        deadline = time.monotonic() + 30
        # a connection's thread ends a moment after its socket closed: wait (bounded) for the last ones
        while (seed.stream.active or threading.active_count() > threads) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seed.stream.active == 0
        assert threading.active_count() <= threads and open_fds() <= fds
        with SeedClient(seed.url, retries=0) as client:
            assert same_tensors(dict(client.iter_tensors()), state_dict)
    per_peer = seed.stream.max_pending_per_peer
    dropped = sum(m.startswith(f"seed busy: dropped, more than {per_peer} unauthenticated") for m in endings)
    assert seed.stream.refused == 0  # no request completed, so none was counted against the cap
    assert dropped >= clients - per_peer - 5, endings
    assert endings.count("no complete request within 1 s") + dropped >= clients - 5, endings
    assert thread_errors == []


@pytest.mark.parametrize("clients", [64])
def test_connection_flood_then_transfer(clients, thread_errors):
    """Connections opened and dropped at once, many at a time: the seed stays within its cap and serves."""
    state_dict = make_state_dict()
    with SeedServer.serving(state_dict, max_connections=CAP, timeout=1.0, handshake_timeout=1.0) as seed:
        threads = threading.active_count()
        for _ in range(clients):
            socket.create_connection(("127.0.0.1", seed.stream.port), timeout=30).close()
        assert threading.active_count() <= threads + CAP
        with SeedClient(seed.url, retries=30, backoff=0.05) as client:
            assert same_tensors(dict(client.iter_tensors()), state_dict)
    assert thread_errors == []
