"""MooncakeWorker's notice bookkeeping (no vLLM parallel state: the fields __init__ sets, set here)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from types import SimpleNamespace

from vllm_ascend.kvtransfer.metadata import MooncakeConnectorMetadata, Peer, RecvTask
from vllm_ascend.kvtransfer.side_channel import TransferDone
from vllm_ascend.kvtransfer.worker import MooncakeWorker

PEER = Peer("p", "127.0.0.1", 1, 1)


def _worker(transfer_timeout=30.0):
    w = object.__new__(MooncakeWorker)
    w.config = SimpleNamespace(transfer_timeout=transfer_timeout, abort_request_timeout=480.0)
    w._lock = threading.Lock()
    w._finished_recving, w._finished_sending, w._failed_blocks = set(), set(), set()
    w._loading, w._released = set(), set()
    w._sending, w._awaiting = {}, {}
    w._early = defaultdict(list)
    return w


def _push_recv(req, transfer, blocks):
    return RecvTask(req, blocks, blocks, PEER, req, transfer)


def test_prefill_frees_after_every_reader_rank_said_done():
    w = _worker()
    w.bind(MooncakeConnectorMetadata(send={"r1": 60.0}))
    w._on_notice(TransferDone("r1", True, expected=2))
    assert w.get_finished() == (set(), set())
    w._on_notice(TransferDone("r1", True, expected=2))
    assert w.get_finished() == ({"r1"}, set())
    assert w.get_finished() == (set(), set())


def test_notice_before_the_plan_is_kept_until_it_arrives():
    w = _worker()
    w._on_notice(TransferDone("r1"))
    assert w.get_finished() == (set(), set())
    w.bind(MooncakeConnectorMetadata(send={"r1": 60.0}))
    assert w.get_finished() == ({"r1"}, set())


def test_layerwise_receive_ends_with_the_last_writer_and_failed_blocks_are_reported():
    w = _worker()
    w.bind(MooncakeConnectorMetadata(recv=[_push_recv("d1", "x1", [4, 5])]))
    w._on_notice(TransferDone("x1", True, expected=2))
    w._on_notice(TransferDone("x1", False, expected=2))
    assert w.get_finished() == (set(), {"d1"})
    assert w.get_block_ids_with_load_errors() == {4, 5}
    assert w.get_block_ids_with_load_errors() == set()


def test_released_request_ends_as_a_finished_send():
    w = _worker()
    w.bind(MooncakeConnectorMetadata(recv=[_push_recv("d1", "x1", [4])]))
    w.bind(MooncakeConnectorMetadata(release=["d1", "unknown"]))
    w._on_notice(TransferDone("x1"))
    assert w.get_finished() == ({"d1"}, set())


def test_expired_waits_end_and_fail_their_blocks():
    w = _worker(transfer_timeout=0.01)
    w.bind(MooncakeConnectorMetadata(recv=[_push_recv("d1", "x1", [7])], send={"p1": 0.01}))
    time.sleep(0.05)
    assert w.get_finished() == ({"p1"}, {"d1"})
    assert w.get_block_ids_with_load_errors() == {7}
