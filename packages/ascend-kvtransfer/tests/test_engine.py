"""Two real Mooncake engines (TCP transport, P2P handshake) on 127.0.0.1 in this process."""

from __future__ import annotations

import re
import sys
import time
from importlib import metadata

import pytest
import torch

from vllm_ascend.kvtransfer import engine as engine_module
from vllm_ascend.kvtransfer.engine import (
    INSTALL_HINT,
    MooncakeEngine,
    Transfer,
    TransferError,
    installed_distribution,
    load_engine_class,
    probe,
)

SIZE = 4096


@pytest.fixture(scope="module")
def engines():
    a, b = MooncakeEngine("127.0.0.1", "tcp"), MooncakeEngine("127.0.0.1", "tcp")
    yield a, b
    a.close()
    b.close()


@pytest.fixture(scope="module")
def buffers(engines):
    a, b = engines
    g = torch.Generator().manual_seed(0)
    source = torch.randint(0, 256, (SIZE,), generator=g, dtype=torch.uint8)
    target = torch.zeros(SIZE, dtype=torch.uint8)
    a.register(source.data_ptr(), SIZE)
    b.register(target.data_ptr(), SIZE)
    return source, target


def test_engine_is_addressed_by_host_and_rpc_port(engines):
    a, b = engines
    assert re.fullmatch(r"127\.0\.0\.1:\d+", a.session_id)
    assert a.session_id == f"127.0.0.1:{a.rpc_port}"
    assert a.session_id != b.session_id
    assert (a.host, a.protocol) == ("127.0.0.1", "tcp")


def test_read_copies_the_peers_ranges(engines, buffers):
    a, b = engines
    source, target = buffers
    target.zero_()
    here = [target.data_ptr(), target.data_ptr() + 1000, target.data_ptr() + 3000]
    there = [source.data_ptr() + 17, source.data_ptr() + 2048, source.data_ptr()]
    b.read(a.session_id, Transfer(here, there, [100, 512, 1]))
    assert torch.equal(target[:100], source[17:117])
    assert torch.equal(target[1000:1512], source[2048:2560])
    assert target[3000] == source[0]
    untouched = torch.ones(SIZE, dtype=torch.bool)
    untouched[:100] = untouched[1000:1512] = untouched[3000] = False
    assert not target[untouched].any()


def test_write_copies_into_the_peers_ranges(engines, buffers):
    a, b = engines
    source, target = buffers
    target.zero_()
    # a writes its own bytes into b's registered target
    a.write(b.session_id, Transfer([source.data_ptr() + 5], [target.data_ptr() + 4000], [96]))
    assert torch.equal(target[4000:], source[5:101])
    assert not target[:4000].any()


def test_float_tensor_round_trip(engines):
    a, b = engines
    x = torch.randn(64, 32)
    y = torch.zeros(64, 32)
    a.register(x.data_ptr(), x.nbytes)
    b.register(y.data_ptr(), y.nbytes)
    row = 32 * 4
    b.read(a.session_id, Transfer([y.data_ptr() + 10 * row], [x.data_ptr() + 3 * row], [5 * row]))
    assert torch.equal(y[10:15], x[3:8])
    assert not y[:10].any() and not y[15:].any()


def test_register_is_idempotent_and_close_unregisters(engines):
    a, _ = engines
    t = torch.zeros(128, dtype=torch.uint8)
    a.register(t.data_ptr(), 128)
    a.register(t.data_ptr(), 128)
    assert a._registered.count((t.data_ptr(), 128)) == 1


def test_empty_transfer_is_a_no_op(engines):
    """Nothing to move contacts no peer: the same unserved session fails as soon as one range is asked."""
    _, b = engines
    t = torch.zeros(8, dtype=torch.uint8)
    b.register(t.data_ptr(), 8)
    assert b.read("127.0.0.1:1", Transfer([], [], [])) is None
    with pytest.raises(TransferError):
        b.read("127.0.0.1:1", Transfer([t.data_ptr()], [t.data_ptr()], [8]))


def test_transfer_needs_equal_lists():
    with pytest.raises(ValueError, match="a transfer needs as many local and remote addresses as lengths"):
        Transfer([1, 2], [3], [4, 5])
    assert Transfer([1, 2], [3, 4], [10, 20]).nbytes == 30


def test_read_from_a_session_nobody_serves_fails_in_bounded_time(engines, buffers):
    _, b = engines
    _, target = buffers
    start = time.monotonic()
    with pytest.raises(TransferError) as info:
        b.read("127.0.0.1:1", Transfer([target.data_ptr()], [0x1000], [64]))
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert message.startswith(
        "Mooncake batch_transfer_sync_read with 127.0.0.1:1 (1 ranges, 64 bytes) returned "
    )
    assert not message.endswith("returned 0")


def test_write_to_a_session_nobody_serves_fails(engines, buffers):
    a, _ = engines
    source, _ = buffers
    with pytest.raises(
        TransferError, match=re.escape("batch_transfer_sync_write with 127.0.0.1:1 (2 ranges, 30")
    ):
        a.write("127.0.0.1:1", Transfer([source.data_ptr(), source.data_ptr() + 64], [0, 64], [10, 20]))


def test_installed_distribution_is_the_tcp_build():
    found = installed_distribution()
    assert found == (
        "mooncake-transfer-engine-non-cuda",
        metadata.version("mooncake-transfer-engine-non-cuda"),
    )


def test_probe_reports_engine_transport_and_initializes(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "off")
    report = probe()
    assert set(report) == {"engine", "transport", "initializes"}
    name, version = installed_distribution()
    assert report["engine"] == f"{name} {version}"
    assert report["transport"] == "tcp (P2PHANDSHAKE, no metadata server)"
    assert re.fullmatch(r"yes \(session 127\.0\.0\.1:\d+\)", report["initializes"])


def test_load_engine_class_names_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)
    with pytest.raises(ImportError) as info:
        load_engine_class()
    message = str(info.value)
    assert message.startswith("the Mooncake transfer engine is not importable (")
    assert message.endswith(f"); {INSTALL_HINT}")
    assert "vllm-ascend[kvtransfer]" in message and "libibverbs1" in message


def test_probe_without_mooncake_says_why(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "off")
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)
    monkeypatch.setattr(engine_module, "DISTRIBUTIONS", ("no-such-mooncake-dist",))
    report = probe()
    assert report["engine"] == f"Mooncake not installed ({INSTALL_HINT})"
    assert report["initializes"].startswith("no: the Mooncake transfer engine is not importable")


def test_load_engine_class_is_mooncakes():
    cls = load_engine_class()
    assert (cls.__module__.split(".")[0], cls.__name__) == ("mooncake", "TransferEngine")
