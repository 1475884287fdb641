"""A real handshake socket on 127.0.0.1: metadata round trip, notices, malformed input, refusals."""

from __future__ import annotations

import re
import socket
import threading
import time

import msgspec
import pytest
import zmq

from vllm_ascend.kvtransfer.layout import LayerLayout, Region
from vllm_ascend.kvtransfer.side_channel import (
    Ack,
    AgentMetadata,
    Error,
    MetadataRequest,
    SideChannelError,
    SideChannelServer,
    TransferDone,
    ask,
)

META = AgentMetadata(
    engine_id="prefill-0",
    session="127.0.0.1:17001",
    tp_rank=1,
    tp_size=2,
    block_size=128,
    layers=[
        LayerLayout(
            "model.layers.0.self_attn.attn",
            [Region(0x7F0000001000, 65536, 65536, 128, 512, 2, 256), Region(0x7F0001001000, 65536, 65536)],
            False,
        ),
        LayerLayout("model.layers.0.mla", [Region(2**47 + 8, 147456, 147456)], True),
    ],
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Notices:
    def __init__(self):
        self.seen: list[TransferDone] = []
        self.arrived = threading.Event()

    def __call__(self, notice: TransferDone) -> None:
        if notice.request_id == "explode":
            raise KeyError("no such transfer")
        self.seen.append(notice)
        self.arrived.set()


@pytest.fixture
def server():
    notices = Notices()
    port = _free_port()
    srv = SideChannelServer("127.0.0.1", port, META, notices)
    yield srv, port, notices
    srv.close()


def test_metadata_round_trip(server):
    srv, port, _ = server
    assert srv.address == f"tcp://127.0.0.1:{port}"
    answer = ask(srv.address, MetadataRequest(), timeout=5)
    assert answer == META
    assert isinstance(answer.layers[0].regions[0], Region)
    assert answer.layers[0].regions[0].heads == 2 and answer.layers[1].replicated is True


def test_transfer_done_reaches_on_done_and_is_acked(server):
    srv, _, notices = server
    assert ask(srv.address, TransferDone("req-1", ok=False, expected=2), timeout=5) == Ack()
    assert ask(srv.address, TransferDone("req-2"), timeout=5) == Ack()
    assert notices.seen == [TransferDone("req-1", False, 2), TransferDone("req-2", True, 1)]


def _raw(address: str, payload: bytes) -> bytes:
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        sock.connect(address)
        sock.send(payload)
        return sock.recv()
    finally:
        sock.close(linger=0)


def test_garbage_gets_an_error_and_the_server_keeps_serving(server):
    srv, _, _ = server
    for garbage in (b"\xff\x00garbage", b"", msgspec.msgpack.encode({"type": "nope"})):
        reply = msgspec.msgpack.decode(_raw(srv.address, garbage), type=Error)
        assert reply.message.startswith("malformed side-channel message: "), reply
    assert ask(srv.address, MetadataRequest(), timeout=5) == META


def test_an_answer_type_sent_as_a_request_is_refused(server):
    srv, _, _ = server
    with pytest.raises(SideChannelError) as info:
        ask(srv.address, Ack(), timeout=5)
    assert str(info.value) == f"{srv.address} refused Ack: unexpected side-channel message Ack"


def test_failing_on_done_gives_an_error_naming_the_request(server):
    srv, _, notices = server
    with pytest.raises(SideChannelError) as info:
        ask(srv.address, TransferDone("explode"), timeout=5)
    assert str(info.value) == (
        f"{srv.address} refused TransferDone: notice for 'explode' failed: 'no such transfer'"
    )
    # still serving
    assert ask(srv.address, TransferDone("after"), timeout=5) == Ack()
    assert [n.request_id for n in notices.seen] == ["after"]


def test_many_clients_at_once(server):
    srv, _, notices = server
    errors = []

    def client(i):
        try:
            assert ask(srv.address, TransferDone(f"r{i}"), timeout=10) == Ack()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15)
    assert errors == []
    assert sorted(n.request_id for n in notices.seen) == sorted(f"r{i}" for i in range(16))


def test_ask_a_closed_port_times_out():
    address = f"tcp://127.0.0.1:{_free_port()}"
    start = time.monotonic()
    with pytest.raises(SideChannelError) as info:
        ask(address, MetadataRequest(), timeout=0.5)
    assert time.monotonic() - start < 3
    assert str(info.value) == f"no answer from {address} within 0.5 s"


def test_ask_after_the_server_closed_times_out():
    srv = SideChannelServer("127.0.0.1", _free_port(), META, lambda notice: None)
    assert ask(srv.address, MetadataRequest(), timeout=5) == META
    srv.close()
    with pytest.raises(SideChannelError, match=re.escape(f"no answer from {srv.address} within 0.3 s")):
        ask(srv.address, MetadataRequest(), timeout=0.3)


def test_binding_an_used_port_names_kv_port(server):
    _, port, _ = server
    with pytest.raises(SideChannelError) as info:
        SideChannelServer("127.0.0.1", port, META, lambda notice: None)
    message = str(info.value)
    assert message.startswith(f"cannot bind the KV transfer handshake socket tcp://127.0.0.1:{port} (")
    assert message.endswith(
        "another instance may use this kv_port: give each instance on a host its own kv_port "
        "(ranks take kv_port + rank)"
    )


def test_port_is_free_again_after_close():
    port = _free_port()
    SideChannelServer("127.0.0.1", port, META, lambda notice: None).close()
    # ZeroMQ releases a closed socket's port on its I/O thread: free again within a bounded time
    deadline = time.monotonic() + 5
    while True:
        try:
            again = SideChannelServer("127.0.0.1", port, META, lambda notice: None)
            break
        except SideChannelError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        assert ask(again.address, MetadataRequest(), timeout=5) == META
    finally:
        again.close()
