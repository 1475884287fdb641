"""Malformed AUTH frames and random bytes on the stream port: each gets one clean ERROR frame (our own
message, never Python's exception text), and the seed keeps serving. Seeded, bounded, loopback only."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import socket
import struct
import threading
import time

import pytest
import torch

from vllm_ascend.netloader.client import SeedClient
from vllm_ascend.netloader.protocol import MAGIC, PREFIX, VERSION, FrameReader, MessageType, encode
from vllm_ascend.netloader.security import ServerSecurity
from vllm_ascend.netloader.seed_server import SeedServer

TOKEN = b"0123456789abcdef0123456789abcdef"
NOT_A_MAC = "authentication failed: the AUTH frame's 'mac' must be 64 hexadecimal digits (HMAC-SHA256)"
PYTHON_TEXT = re.compile(r"\b\w+(Error|Exception)\b|Traceback|internal error|codec can.t")


@pytest.fixture
def thread_errors(monkeypatch):
    seen: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


@pytest.fixture(scope="module")
def token_seed(state_dict):
    with SeedServer.serving(state_dict, security=ServerSecurity(TOKEN), handshake_timeout=2) as seed:
        yield seed


def _auth(header: bytes, payload: bytes = b"") -> bytes:
    """An AUTH frame with a raw ``header`` (any bytes) and ``payload``."""
    return PREFIX.pack(MAGIC, VERSION, MessageType.AUTH, len(header), len(payload)) + header + payload


def _answer(port: int, data: bytes) -> str:
    """The seed's ERROR message for ``data`` sent after its CHALLENGE (exactly those two frames come back)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        reader = FrameReader(conn.recv_into)
        assert reader.next().type is MessageType.CHALLENGE
        with contextlib.suppress(OSError):  # the seed may close before reading everything
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
        frame = reader.next()
        assert frame is not None and frame.type is MessageType.ERROR
        with contextlib.suppress(ConnectionResetError):
            assert reader.next() is None
    return frame.header["message"]


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


CASES = {
    "non-ASCII": (encode(MessageType.AUTH, {"mac": "é" * 64}), NOT_A_MAC),
    "non-ASCII digits": (encode(MessageType.AUTH, {"mac": "٠" * 64}), NOT_A_MAC),
    "short": (encode(MessageType.AUTH, {"mac": "ab" * 31}), NOT_A_MAC),
    "long": (encode(MessageType.AUTH, {"mac": "ab" * 33}), NOT_A_MAC),
    "oversized": (encode(MessageType.AUTH, {"mac": "a" * 500_000}), NOT_A_MAC),
    "spaced": (encode(MessageType.AUTH, {"mac": " ".join(["ab"] * 32)}), NOT_A_MAC),
    "lone surrogate": (_auth(b'{"mac":"\\ud800' + b"0" * 63 + b'"}'), NOT_A_MAC),
    "empty": (encode(MessageType.AUTH, {"mac": ""}), NOT_A_MAC),
    "wrong MAC": (
        encode(MessageType.AUTH, {"mac": "0" * 64}),
        "authentication failed: the MAC does not match this seed's token",
    ),
    "number": (_auth(b'{"mac":123}'), "AUTH frame header: field 'mac' must be str, got 123"),
    "list": (_auth(b'{"mac":["a"]}'), "AUTH frame header: field 'mac' must be str, got ['a']"),
    "extra field": (_auth(b'{"mac":"00","x":1}'), "AUTH frame header: unknown field 'x'; allowed: mac"),
    "no field": (_auth(b"{}"), "AUTH frame header: missing field 'mac'"),
    "not an object": (_auth(b'"mac"'), "AUTH frame header must be a JSON object, got str"),
    "not JSON": (
        _auth(b"{mac}"),
        "AUTH frame header is not valid JSON (Expecting property name enclosed in double quotes at offset 1)",
    ),
    "not UTF-8": (_auth(b'{"mac":"\xff"}'), "AUTH frame header is not valid UTF-8 (byte 0xff at offset 8)"),
    "NaN": (_auth(b'{"mac":NaN}'), "AUTH frame header: NaN is not a number this protocol accepts"),
    "payload": (_auth(b'{"mac":"00"}', b"12345"), "AUTH frame must carry no payload, got 5 bytes"),
    "huge header length": (
        struct.pack("!4sBBIQ", MAGIC, VERSION, MessageType.AUTH, 1 << 31, 0),
        "frame header length 2147483648 exceeds the limit of 1048576",
    ),
    "truncated header": (
        _auth(b'{"mac":"00"}')[:25],
        "truncated frame: stream ended after 7 of 12 AUTH header bytes",
    ),
    "other version": (
        PREFIX.pack(MAGIC, 9, MessageType.AUTH, 2, 0) + b"{}",
        "unsupported protocol version 9; this side speaks 2",
    ),
    "unknown type": (
        PREFIX.pack(MAGIC, VERSION, 77, 2, 0) + b"{}",
        "unknown message type 77; allowed: 1 (TENSOR_REQUEST), 2 (TENSOR), 3 (END), 4 (ERROR), 5 (CHALLENGE), "
        "6 (AUTH)",
    ),
    "request first": (
        encode(MessageType.TENSOR_REQUEST, {"names": []}),
        "authentication required: expected an AUTH frame, got a TENSOR_REQUEST frame",
    ),
    "nothing": (b"", "authentication required: expected an AUTH frame, got an empty stream"),
    "HTTP": (b"GET / HTTP/1.1\r\n\r\n", "bad frame magic b'GET ', expected b'VANL'"),
}


def test_malformed_auth_frames_get_clean_errors(token_seed, state_dict, thread_errors, caplog):
    caplog.set_level(logging.ERROR)
    for name, (data, message) in CASES.items():
        assert _answer(token_seed.stream.port, data) == message, name
    with SeedClient(token_seed.url, token=TOKEN, retries=0) as client:
        got = dict(client.iter_tensors())
    assert all(_raw(got[n]) == _raw(state_dict[n]) for n in state_dict)
    assert thread_errors == [] and caplog.records == []


def _random_input(rng: random.Random) -> bytes:
    """Random bytes, or an AUTH frame whose header is random bytes or JSON with a random ``mac``."""
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 300))
    if kind == 1:
        return _auth(rng.randbytes(rng.randrange(0, 200)))
    if kind == 2:  # random code points, surrogates included
        text = "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(0, 80)))
        return _auth(json.dumps({"mac": text}).encode())
    header = json.dumps(
        {"mac": "".join(rng.choice("0123456789abcdefABCDEF g") for _ in range(rng.randrange(60, 68)))}
    )
    return _auth(header.encode(), rng.randbytes(rng.choice([0, 0, 3])))


def test_random_auth_input_fuzz(token_seed, state_dict, thread_errors, caplog):
    caplog.set_level(logging.ERROR)
    rng = random.Random(20240611)
    started = time.monotonic()
    messages = [_answer(token_seed.stream.port, _random_input(rng)) for _ in range(300)]
    assert time.monotonic() - started < 20
    leaks = [m for m in messages if PYTHON_TEXT.search(m) or "\n" in m]
    assert leaks == []
    assert sum(m == NOT_A_MAC for m in messages) > 50  # the MAC check itself was reached often
    assert sum(m.startswith("bad frame magic") for m in messages) > 30
    with SeedClient(token_seed.url, token=TOKEN, retries=0) as client:
        got = dict(client.iter_tensors())
    assert all(_raw(got[n]) == _raw(state_dict[n]) for n in state_dict)
    deadline = time.monotonic() + 5
    while token_seed.stream.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert token_seed.stream.pending == 0 and token_seed.stream.active == 0
    assert thread_errors == [] and caplog.records == []
