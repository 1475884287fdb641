"""Finding 3: the stream port bounds idle and partial connections, caps connections, and answers
every bad request (nested headers, huge integers, huge name lists, handler crashes) with an ERROR frame."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
import torch
from fastapi import FastAPI, Response

import vllm_ascend.netloader.client as client_module
from vllm_ascend.netloader.client import NetLoaderError, PeerUnavailable, SeedClient
from vllm_ascend.netloader.manifest import Manifest, ManifestError
from vllm_ascend.netloader.protocol import (
    MAGIC,
    MAX_ERROR_CHARS,
    PREFIX,
    VERSION,
    FrameReader,
    MessageType,
    chunk_source,
    encode,
)
from vllm_ascend.netloader.seed_server import SeedServer
from vllm_ascend.netloader.transfer import TensorStreamServer


@pytest.fixture
def thread_errors(monkeypatch):
    """Exceptions that escape any thread while the test runs."""
    seen: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _frames(conn: socket.socket) -> list[tuple[str, dict]]:
    """Every frame the seed sends until it closes the connection (headers only)."""
    reader = FrameReader(conn.recv_into)
    out = []
    while (frame := reader.next()) is not None:
        out.append((frame.type.name, frame.header))
    return out


def _ask(port: int, request: bytes) -> list[tuple[str, dict]]:
    with _connect(port) as conn:
        conn.sendall(request)
        conn.shutdown(socket.SHUT_WR)
        frames = _frames(conn)
    assert frames[0][0] == "CHALLENGE"
    return frames[1:]


def _raw_request(header: bytes) -> bytes:
    return PREFIX.pack(MAGIC, VERSION, MessageType.TENSOR_REQUEST, len(header), 0) + header


def test_malformed_headers_get_error_frames(seed, thread_errors):
    port = seed.stream.port
    deep = b'{"names":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert _ask(port, _raw_request(deep)) == [
        ("ERROR", {"message": "TENSOR_REQUEST frame header nests 100001 levels deep; at most 8 are allowed"})
    ]
    huge = b'{"names":[' + b"1" * 100_000 + b"]}"
    [(kind, header)] = _ask(port, _raw_request(huge))
    assert kind == "ERROR" and header["message"].startswith("TENSOR_REQUEST frame header: integer 1111")
    assert header["message"].endswith("is out of range (|n| <= 2**63-1)")
    names = [f"missing.{i}" for i in range(30_000)]
    [(kind, header)] = _ask(port, encode(MessageType.TENSOR_REQUEST, {"names": names}))
    full = "invalid weight manifest: 30000 problems\n" + "\n".join(
        f"  - tensor {n!r} is not served by the seed" for n in names
    )
    assert kind == "ERROR" and len(header["message"]) == MAX_ERROR_CHARS
    assert header["message"] == full[: MAX_ERROR_CHARS - len(f" … (cut from {len(full)} characters)")] + (
        f" … (cut from {len(full)} characters)"
    )
    assert thread_errors == []


def test_idle_and_trickling_connections_are_closed_at_the_deadline(state_dict, thread_errors):
    with SeedServer.serving(state_dict, handshake_timeout=0.5) as server:
        port = server.stream.port
        idle = [_connect(port) for _ in range(3)]
        trickle = _connect(port)
        request = encode(MessageType.TENSOR_REQUEST, {"names": []})
        received, sent = bytearray(), 0
        trickle.settimeout(0.05)
        # One byte per 0.05 s of silence for the first 0.3 s (each read is quick, the request stays incomplete),
        # then silence: a byte still in flight when the seed closes would make its kernel reset the connection
        # and drop the ERROR frame before this side reads it.
        stop_sending, give_up = time.monotonic() + 0.3, time.monotonic() + 10
        while True:
            assert time.monotonic() < give_up, "the seed kept a late connection open"
            try:
                chunk = trickle.recv(1 << 16)
            except TimeoutError:
                if time.monotonic() < stop_sending:
                    trickle.sendall(request[sent : sent + 1])
                    sent += 1
                continue
            if not chunk:
                break  # the seed closed the connection
            received += chunk
        assert sent < len(request)
        expected = [("ERROR", {"message": "no complete request within 0.5 s"})]
        frames = FrameReader(chunk_source([bytes(received)]))
        assert [(f.type.name, f.header) for f in iter(frames.next, None)][1:] == expected
        trickle.close()
        for conn in idle:
            with conn:
                assert _frames(conn)[1:] == expected
        deadline = time.monotonic() + 10
        while server.stream.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.stream.pending == 0 and server.stream.active == 0
    assert thread_errors == []


class HeldStream(TensorStreamServer):
    """Holds every request it serves until ``release`` is set (the requests occupy serving slots)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    def _serve(self, stream, entries) -> None:
        self.release.wait(10)
        super()._serve(stream, entries)


def test_requests_over_the_cap_are_answered_busy_and_waited_for(state_dict, thread_errors):
    """The cap counts requests being served; one past it is told ``seed busy``, which clients wait out."""
    manifest, data = Manifest.from_state_dict(state_dict)
    stream = HeldStream(manifest, data, max_connections=3)
    request = encode(MessageType.TENSOR_REQUEST, {"names": ["step"]})
    with SeedServer(stream) as server:
        held = [_connect(stream.port) for _ in range(3)]
        for conn in held:
            conn.sendall(request)
        deadline = time.monotonic() + 10
        while stream.active < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        baseline = threading.active_count()
        for _ in range(5):
            assert _ask(stream.port, request) == [
                ("ERROR", {"message": "seed busy: 3 requests are being served; retry later"})
            ]
        assert stream.refused == 5 and stream.active == 3
        assert threading.active_count() <= baseline + 1  # the refused ones' threads are gone
        threading.Timer(0.5, stream.release.set).start()
        started = time.monotonic()
        with SeedClient(server.url, retries=0, backoff=0.05) as client:  # busy does not use up retries
            got = dict(client.iter_tensors())
        assert time.monotonic() - started >= 0.4
        for conn in held:
            with conn:
                assert [kind for kind, _ in _frames(conn)] == ["CHALLENGE", "TENSOR", "END"]
    assert all(_raw(got[n]) == _raw(state_dict[n]) for n in state_dict)
    assert thread_errors == []


def test_a_seed_busy_for_too_long_is_unavailable(state_dict):
    manifest, data = Manifest.from_state_dict(state_dict)
    stream = HeldStream(manifest, data, max_connections=1)
    with SeedServer(stream) as server, _connect(stream.port) as held:
        held.sendall(encode(MessageType.TENSOR_REQUEST, {"names": []}))
        deadline = time.monotonic() + 10
        while stream.active < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        with SeedClient(server.url, backoff=0.05, busy_wait=0.6) as client:
            with pytest.raises(PeerUnavailable) as info:
                dict(client.iter_tensors())
        assert 0.6 <= time.monotonic() - started < 3
        assert str(info.value) == (
            f"streaming tensors: seed {server.url} stayed busy for 0.6 s; last answer: "
            "seed busy: 1 requests are being served; retry later"
        )
        stream.release.set()


def test_a_crashing_handler_answers_with_an_error_frame(state_dict, thread_errors):
    manifest, data = Manifest.from_state_dict(state_dict)
    del data["mask"]  # the handler fails with KeyError while streaming
    stream = TensorStreamServer(manifest, data).start()
    try:
        frames = _ask(stream.port, encode(MessageType.TENSOR_REQUEST, {"names": ["mask"]}))
    finally:
        stream.stop()
    assert frames == [("ERROR", {"message": "KeyError: 'mask'"})]
    assert thread_errors == []


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_connections": 0}, "max_connections must be a positive integer, got 0"),
        ({"max_pending": -1}, "max_pending must be a positive integer, got -1"),
        ({"max_pending_per_peer": 2.5}, "max_pending_per_peer must be a positive integer, got 2.5"),
        ({"timeout": 0}, "timeout must be a number of seconds in (0, 86400], got 0"),
        ({"timeout": float("nan")}, "timeout must be a number of seconds in (0, 86400], got nan"),
        (
            {"handshake_timeout": float("inf")},
            "handshake_timeout must be a number of seconds in (0, 86400], got inf",
        ),
    ],
)
def test_bad_limits(kwargs, message):
    with pytest.raises(ValueError) as info:
        TensorStreamServer(*Manifest.from_state_dict({}), **kwargs)
    assert str(info.value) == message


def test_frame_header_size_is_checked_before_reading(seed):
    prefix = struct.pack("!4sBBIQ", MAGIC, VERSION, MessageType.TENSOR_REQUEST, 1 << 30, 0)
    assert _ask(seed.stream.port, prefix) == [
        ("ERROR", {"message": "frame header length 1073741824 exceeds the limit of 1048576"})
    ]


def test_idle_and_partial_http_connections_are_closed_at_the_deadline(state_dict):
    with SeedServer.serving(state_dict, handshake_timeout=0.5) as server:
        conns = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(10)]
        for i, conn in enumerate(conns):
            if i % 2:
                conn.sendall(b"GET /hea")  # a request head that never completes
        for conn in conns:
            with conn:
                assert conn.recv(1024) == b""  # closed by the seed, nothing answered
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert conn.recv(1024).startswith(b"HTTP/1.1 200 OK")


def test_client_bounds_what_a_seed_answers(monkeypatch):
    """A hostile control plane (huge, deeply nested or non-object answers) gets the client's own errors."""
    nested = b"[" * 100_000 + b"]" * 100_000
    answer = {"status": 200, "body": b'{"format":' + nested + b"}"}
    app = FastAPI()

    @app.get("/manifest")
    def manifest() -> Response:
        return Response(answer["body"], status_code=answer["status"], media_type="application/json")

    def fetch_error(cls: type[Exception]) -> str:
        with SeedClient(seed.url, retries=0) as client, pytest.raises(cls) as info:
            client.fetch_manifest()
        return str(info.value)

    stream = TensorStreamServer(*Manifest.from_state_dict({}))
    with SeedServer(stream, app=app) as seed:
        assert fetch_error(ManifestError) == (
            f"invalid weight manifest: manifest from {seed.url} nests 100001 levels deep; at most 8 are allowed"
        )
        answer["status"], answer["body"] = 404, nested
        message = fetch_error(NetLoaderError)
        assert message.startswith(f"fetching the manifest: seed {seed.url} answered 404: [[[[")
        assert message.endswith(f" … (cut from {len(nested)} characters)") and len(message) < 1200
        monkeypatch.setattr(client_module, "MAX_MANIFEST_BYTES", 1000)
        answer["status"] = 200
        assert fetch_error(PeerUnavailable) == (
            f"fetching the manifest: seed {seed.url} failed 1 attempts; last error: ProtocolError: "
            "GET /manifest: the seed's answer exceeds 1000 bytes"
        )


def test_starting_twice_is_one_server(state_dict):
    with SeedServer.serving(state_dict).start() as server:
        threads = threading.active_count()
        assert server.start() is server and server.stream.start() is server.stream
        assert threading.active_count() == threads
        with SeedClient(server.url, retries=0) as client:
            assert _raw(client.fetch_tensor("step")) == _raw(state_dict["step"])
