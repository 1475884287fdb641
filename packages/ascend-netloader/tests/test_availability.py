"""Unauthenticated load cannot deny service to authenticated clients: floods of idle connections on both
ports (from one address and from many), and a flood of nonce requests. Loopback only (127.0.0.0/8 gives
distinct peer addresses), every connection bounded in time."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
import torch

from vllm_ascend.netloader.client import SeedClient
from vllm_ascend.netloader.protocol import FrameReader
from vllm_ascend.netloader.security import ServerSecurity
from vllm_ascend.netloader.seed_server import SeedServer

TOKEN = b"0123456789abcdef0123456789abcdef"
HANDSHAKE = 2.0
TLS_DECODE_ERROR_ALERT = b"\x15\x03\x03\x00\x02\x02\x32"  # what OpenSSL says when a handshake is cut off


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(_raw(got[n]) == _raw(want[n]) for n in want)


def _open(port: int, source: str, count: int) -> list[socket.socket]:
    """``count`` idle connections to ``port`` from the loopback address ``source``."""
    return [
        socket.create_connection(("127.0.0.1", port), timeout=HANDSHAKE + 5, source_address=(source, 0))
        for _ in range(count)
    ]


def _wait(condition, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "the seed did not get there in time"
        time.sleep(0.01)


def _stream_fates(conns: list[socket.socket]) -> list[str]:
    """What the seed said to each idle stream connection before it closed it (after its CHALLENGE)."""
    fates = []
    for conn in conns:
        with conn:
            frames = list(iter(FrameReader(conn.recv_into).next, None))
            assert frames[0].type.name == "CHALLENGE" and len(frames) == 2
            fates.append(frames[1].header["message"])
    return fates


@pytest.fixture
def guarded_seed(state_dict):
    """A seed with a token, a cap of 2 and small pending limits, so floods are cheap."""
    security = ServerSecurity(TOKEN)
    with SeedServer.serving(
        state_dict,
        security=security,
        max_connections=2,
        handshake_timeout=HANDSHAKE,
        max_pending=24,
        max_pending_per_peer=8,
    ) as seed:
        yield seed


def test_idle_stream_connections_from_the_clients_own_address(guarded_seed, state_dict):
    """The probe's case: 40 idle connections (far over the cap of 2) from the client's own address."""
    seed = guarded_seed
    idle = _open(seed.stream.port, "127.0.0.1", 40)
    _wait(lambda: seed.stream.pending == 8)  # the 32 oldest were dropped at once
    started = time.monotonic()
    with SeedClient(seed.url, token=TOKEN, retries=0) as client:
        assert _same(dict(client.iter_tensors()), state_dict)
    assert time.monotonic() - started < HANDSHAKE  # not after waiting the flood out
    with httpx.Client(base_url=seed.url) as http:
        assert http.get("/health").status_code == 200
    fates = _stream_fates(idle)
    dropped = "seed busy: dropped, more than 8 unauthenticated connections from 127.0.0.1"
    late = f"no complete request within {HANDSHAKE:g} s"
    # the client's connection pushed out one more of them; the rest waited for the deadline
    assert fates == [dropped] * 33 + [late] * 7
    assert seed.stream.pending == 0 and seed.stream.active == 0


def test_idle_stream_connections_from_many_addresses(guarded_seed, state_dict):
    """6 addresses × 8 idle connections overflow max_pending (24): the oldest go, and a client still loads."""
    seed = guarded_seed
    floods = {f"127.0.0.{i}": _open(seed.stream.port, f"127.0.0.{i}", 8) for i in range(2, 8)}
    _wait(lambda: seed.stream.pending == 24)
    with SeedClient(seed.url, token=TOKEN, retries=0) as client:
        assert _same(dict(client.iter_tensors()), state_dict)
    fates = [fate for conns in floods.values() for fate in _stream_fates(conns)]
    dropped = "seed busy: dropped, more than 24 unauthenticated connections"
    late = f"no complete request within {HANDSHAKE:g} s"
    assert fates == [dropped] * 25 + [late] * 23  # the 24 oldest, then one for the client's connection
    assert seed.stream.pending == 0


def test_idle_http_connections(guarded_seed, state_dict):
    """The probe's case on the HTTP port: 300 idle connections; /health, the manifest and a load still work."""
    seed = guarded_seed
    idle = _open(seed.port, "127.0.0.1", 150) + _open(seed.port, "127.0.0.2", 150)
    _wait(lambda: seed.pending == 16)  # 8 from each address; the others were closed at once
    started = time.monotonic()
    with httpx.Client(base_url=seed.url) as http:
        health = http.get("/health")
        assert (health.status_code, health.json()["status"]) == (200, "ok")
    with SeedClient(seed.url, token=TOKEN, retries=0) as client:
        assert client.fetch_manifest().total_bytes == health.json()["bytes"]
        assert _same(dict(client.iter_tensors()), state_dict)
        assert _raw(client.fetch_tensor("step")) == _raw(state_dict["step"])
    assert time.monotonic() - started < HANDSHAKE
    for conn in idle:  # every idle connection is closed without a word, at once or at the deadline
        with conn:
            assert conn.recv(1024) == b""
    _wait(lambda: seed.pending == 0)


def test_unauthenticated_requests_do_not_take_request_slots(guarded_seed, state_dict):
    """Requests without a valid MAC are answered before the cap: a flood of them leaves no 503."""
    seed = guarded_seed
    with httpx.Client(base_url=seed.url) as http:
        for _ in range(50):
            assert http.get("/manifest").status_code == 401
            assert http.get("/manifest", headers={"X-Netloader-Auth": "00:11"}).status_code == 401
        with SeedClient(seed.url, token=TOKEN, retries=0) as client:
            assert client.fetch_manifest().total_bytes == http.get("/health").json()["bytes"]


def test_idle_connections_to_a_tls_seed(state_dict, tls_files):
    """With TLS, connections that never start (or never finish) their handshake are pending like any other."""
    security = ServerSecurity(TOKEN, tls_files["cert"], tls_files["key"])
    with SeedServer.serving(
        state_dict, security=security, handshake_timeout=HANDSHAKE, max_pending=24, max_pending_per_peer=8
    ) as seed:
        stream_idle = _open(seed.stream.port, "127.0.0.1", 30)
        http_idle = _open(seed.port, "127.0.0.1", 30)
        for conn in http_idle[-3:]:
            conn.sendall(b"\x16\x03\x01\x00")  # the start of a TLS record, never finished
        _wait(lambda: seed.stream.pending == 8 and seed.pending == 8)
        started = time.monotonic()
        with SeedClient(seed.url, token=TOKEN, ca_file=tls_files["ca"], retries=0) as client:
            assert _same(dict(client.iter_tensors()), state_dict)
            assert _raw(client.fetch_tensor("step")) == _raw(state_dict["step"])
        assert time.monotonic() - started < HANDSHAKE
        for conn in stream_idle + http_idle:  # closed; at most a TLS alert, never a frame or an HTTP answer
            with conn:
                answer = conn.recv(1024)
                assert answer in (b"", TLS_DECODE_ERROR_ALERT) and conn.recv(1024) == b""
        _wait(lambda: seed.stream.pending == 0 and seed.pending == 0)
