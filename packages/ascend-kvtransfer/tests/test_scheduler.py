"""The scheduler half: remote prefix accounting, delayed frees, aborts and the per-step worker plan."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from vllm.config import KVTransferConfig
from vllm.v1.request import RequestStatus

from vllm_ascend.kvtransfer.config import MooncakeTransferConfig
from vllm_ascend.kvtransfer.metadata import MooncakeConnectorMetadata, Peer, PushTask, RecvTask
from vllm_ascend.kvtransfer.scheduler import MooncakeScheduler

BS = 4


def _scheduler(role="kv_consumer", layerwise=False, tp=2, dp_rank=1, extra=None) -> MooncakeScheduler:
    vllm = SimpleNamespace(
        kv_transfer_config=KVTransferConfig(
            kv_connector="MooncakeConnectorV1",
            kv_role=role,
            kv_port=20001,
            engine_id=f"{role}-engine",
            kv_connector_extra_config={
                "side_channel_host": "10.0.0.7",
                "abort_request_timeout": 90,
                **(extra or {}),
            },
        ),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, data_parallel_rank=dp_rank),
        cache_config=SimpleNamespace(block_size=BS),
    )
    return MooncakeScheduler(
        vllm, MooncakeTransferConfig.from_vllm_config(vllm, on_npu=False), layerwise=layerwise
    )


class Manager:
    """vLLM's KVCacheManager as the connector uses it: a request's block ids per KV cache group."""

    def __init__(self):
        self.blocks: dict[str, list[int]] = {}

    def get_block_ids(self, req_id):
        return (list(self.blocks[req_id]),)


def _blocks(ids):
    return SimpleNamespace(get_unhashed_block_ids=lambda: list(ids))


def _request(req_id="req-1", prompt=10, params=None, status=RequestStatus.WAITING, computed=0):
    return SimpleNamespace(
        request_id=req_id,
        prompt_token_ids=list(range(prompt)),
        kv_transfer_params=params,
        status=status,
        num_computed_tokens=computed,
    )


def _pull_params(**kw):
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "prefill-engine",
        "remote_host": "10.0.0.1",
        "remote_port": 30000,
        "remote_block_ids": [11, 12, 13],
        "remote_request_id": "prefill-req-1",
        "remote_tp_size": 4,
    }
    params.update(kw)
    return params


def _step(scheduler, scheduled=None) -> MooncakeConnectorMetadata:
    return scheduler.build_connector_meta(SimpleNamespace(num_scheduled_tokens=scheduled or {}))


# -- decode (pull) -------------------------------------------------------------------------------
def test_decode_reports_the_uncomputed_prompt_as_async():
    s = _scheduler()
    assert s.get_num_new_matched_tokens(_request(prompt=10, params=_pull_params()), 0) == (10, True)
    assert s.get_num_new_matched_tokens(_request(prompt=10, params=_pull_params()), 4) == (6, True)
    assert s.get_num_new_matched_tokens(_request(prompt=8, params=_pull_params()), 8) == (0, False)


@pytest.mark.parametrize("params", [None, {}, {"do_remote_prefill": False}, {"do_remote_decode": True}])
def test_requests_without_remote_prefill_load_nothing(params):
    assert _scheduler().get_num_new_matched_tokens(_request(params=params), 0) == (0, False)


def test_producer_only_instance_never_loads():
    assert _scheduler(role="kv_producer").get_num_new_matched_tokens(_request(params=_pull_params()), 0) == (
        0,
        False,
    )


def test_missing_params_compute_here_with_a_warning(caplog):
    params = _pull_params(remote_host=None)
    del params["remote_block_ids"]
    with caplog.at_level(logging.WARNING):
        assert _scheduler().get_num_new_matched_tokens(_request(params=params), 0) == (0, False)
    assert params["do_remote_prefill"] is False
    assert (
        "request req-1 asks for remote prefill without kv_transfer_params remote_host, remote_block_ids; "
        "computing its prompt here"
    ) in caplog.text


def test_after_alloc_the_worker_gets_a_recv_task_once():
    s = _scheduler()
    params = _pull_params()
    request = _request(params=params)
    assert s.get_num_new_matched_tokens(request, 0) == (10, True)
    s.update_state_after_alloc(request, _blocks([5, 6, 7]), 10)
    assert params["do_remote_prefill"] is False
    # a second call (after the load) starts nothing
    s.update_state_after_alloc(request, _blocks([5, 6, 7]), 10)
    meta = _step(s)
    assert meta.recv == [
        RecvTask(
            "req-1", [5, 6, 7], [11, 12, 13], Peer("prefill-engine", "10.0.0.1", 30000, 4), "prefill-req-1"
        )
    ]
    assert (meta.send, meta.push, meta.release) == ({}, [], [])
    assert _step(s).recv == []


def test_local_prefix_hit_takes_the_trailing_remote_blocks():
    s = _scheduler()
    request = _request(prompt=12, params=_pull_params(remote_block_ids=[21, 22, 23]))
    assert s.get_num_new_matched_tokens(request, 4) == (8, True)
    s.update_state_after_alloc(request, _blocks([8, 9]), 8)
    (task,) = _step(s).recv
    assert (task.local_block_ids, task.remote_block_ids) == ([8, 9], [22, 23])


def test_no_external_tokens_still_tells_prefill():
    s = _scheduler()
    request = _request(prompt=8, params=_pull_params())
    s.update_state_after_alloc(request, _blocks([1, 2]), 0)
    (task,) = _step(s).recv
    assert (task.local_block_ids, task.remote_block_ids) == ([], [])


def test_peer_tp_falls_back_to_the_declared_prefill_then_to_ours():
    s = _scheduler(extra={"prefill": {"tp_size": 8}})
    params = _pull_params()
    del params["remote_tp_size"]
    request = _request(params=params)
    s.update_state_after_alloc(request, _blocks([1, 2, 3]), 10)
    assert _step(s).recv[0].peer.tp_size == 8
    s = _scheduler(tp=2)
    params = _pull_params(remote_tp_size=None)
    s.update_state_after_alloc(_request(params=params), _blocks([1, 2, 3]), 10)
    assert _step(s).recv[0].peer.tp_size == 2


def test_abort_of_a_loading_request_releases_it_once_the_transfer_ends():
    s = _scheduler()
    request = _request(params=_pull_params())
    s.update_state_after_alloc(request, _blocks([5, 6, 7]), 10)
    _step(s)
    request.status = RequestStatus.FINISHED_ABORTED
    assert s.request_finished(request, [5, 6, 7]) == (True, None)
    assert _step(s).release == ["req-1"]
    assert _step(s).release == []


def test_abort_before_the_worker_saw_it_still_runs_and_releases():
    """Prefill waits for decode's notice (and a layer-wise prefill may already write these blocks): the worker
    still gets the task, tells prefill, and reports the blocks free."""
    s = _scheduler()
    request = _request(params=_pull_params())
    s.update_state_after_alloc(request, _blocks([5, 6, 7]), 10)
    request.status = RequestStatus.FINISHED_ABORTED
    assert s.request_finished(request, [5, 6, 7]) == (True, None)
    meta = _step(s)
    assert [t.request_id for t in meta.recv] == ["req-1"] and meta.release == ["req-1"]


def test_update_connector_output_ends_loading():
    s = _scheduler()
    request = _request(params=_pull_params())
    s.update_state_after_alloc(request, _blocks([5, 6, 7]), 10)
    _step(s)
    s.update_connector_output({"req-1"}, None)
    request.status = RequestStatus.FINISHED_ABORTED
    assert s.request_finished(request, [5, 6, 7]) == (False, None)
    assert _step(s).release == []


# -- prefill (pull) ------------------------------------------------------------------------------
def test_prefill_keeps_blocks_of_a_finished_remote_decode_request():
    s = _scheduler(role="kv_producer", tp=2, dp_rank=1)
    request = _request("p-1", params={"do_remote_decode": True}, status=RequestStatus.FINISHED_LENGTH_CAPPED)
    assert s.get_num_new_matched_tokens(request, 0) == (0, False)
    delay, params = s.request_finished(request, [3, 4, 5])
    assert delay is True
    assert params == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "kv_producer-engine",
        "remote_host": "10.0.0.7",
        "remote_port": 20001 + 1 * 2,
        "remote_block_ids": [3, 4, 5],
        "remote_request_id": "p-1",
        "remote_tp_size": 2,
    }
    assert _step(s).send == {"p-1": 90.0}
    assert _step(s).send == {}


@pytest.mark.parametrize(
    "status,params,blocks",
    [
        (RequestStatus.FINISHED_ABORTED, {"do_remote_decode": True}, [1]),
        (RequestStatus.FINISHED_STOPPED, {"do_remote_decode": True}, [1]),
        (RequestStatus.FINISHED_LENGTH_CAPPED, {"do_remote_decode": True}, []),
        (RequestStatus.FINISHED_LENGTH_CAPPED, None, [1]),
        (RequestStatus.FINISHED_LENGTH_CAPPED, {"do_remote_decode": False}, [1]),
    ],
)
def test_prefill_frees_at_once_otherwise(status, params, blocks):
    s = _scheduler(role="kv_producer")
    assert s.request_finished(_request(params=params, status=status), blocks) == (False, None)
    assert _step(s).send == {}


def test_consumer_only_instance_does_not_hold_blocks():
    s = _scheduler(role="kv_consumer")
    request = _request(params={"do_remote_decode": True}, status=RequestStatus.FINISHED_LENGTH_CAPPED)
    assert s.request_finished(request, [1, 2]) == (False, None)


# -- layer-wise: decode posts to the metaserver ------------------------------------------------
class Metaserver:
    def __init__(self):
        self.bodies: list[dict] = []
        self.arrived = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers["Content-Length"])
                owner.bodies.append(
                    {
                        "path": self.path,
                        "type": self.headers["Content-Type"],
                        "body": json.loads(self.rfile.read(length)),
                    }
                )
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                owner.arrived.set()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metaserver"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metaserver():
    server = Metaserver()
    yield server
    server.close()


def test_layerwise_decode_posts_its_blocks_to_the_metaserver(metaserver):
    s = _scheduler(layerwise=True, tp=2, dp_rank=0)
    manager = Manager()
    s.bind_kv_cache_manager(manager)
    params = {"do_remote_prefill": True, "transfer_id": "xfer-9", "metaserver": metaserver.url}
    request = _request("d-1", prompt=14, params=params)
    assert s.get_num_new_matched_tokens(request, 4) == (10, True)
    manager.blocks["d-1"] = [40, 41, 42, 43]  # one block cached locally, three new
    s.update_state_after_alloc(request, _blocks([41, 42, 43]), 10)
    assert metaserver.arrived.wait(10)
    assert metaserver.bodies == [
        {
            "path": "/v1/metaserver",
            "type": "application/json",
            "body": {
                "transfer_id": "xfer-9",
                "remote_engine_id": "kv_consumer-engine",
                "remote_host": "10.0.0.7",
                "remote_port": 20001,
                "remote_block_ids": [41, 42, 43],
                "remote_first_block": 1,
                "remote_tp_size": 2,
                "remote_request_id": "d-1",
            },
        }
    ]
    (task,) = _step(s).recv
    assert task == RecvTask(
        "d-1", [41, 42, 43], [41, 42, 43], Peer("kv_consumer-engine", "10.0.0.7", 20001, 2), "d-1", "xfer-9"
    )


def test_layerwise_decode_without_transfer_id_computes_here():
    s = _scheduler(layerwise=True)
    params = {"do_remote_prefill": True, "metaserver": "http://127.0.0.1:1/"}
    assert s.get_num_new_matched_tokens(_request(params=params), 0) == (0, False)
    assert params["do_remote_prefill"] is False


def test_layerwise_unreachable_metaserver_is_logged_not_raised(caplog):
    s = _scheduler(layerwise=True, extra={"transfer_timeout": 2})
    manager = Manager()
    s.bind_kv_cache_manager(manager)
    manager.blocks["d-2"] = [1, 2]
    params = {"do_remote_prefill": True, "transfer_id": "x", "metaserver": "http://127.0.0.1:9/nothing"}
    with caplog.at_level(logging.WARNING):
        s.update_state_after_alloc(_request("d-2", prompt=8, params=params), _blocks([1, 2]), 8)
        for thread in threading.enumerate():
            if thread.name == "kvtransfer-metaserver":
                thread.join(timeout=10)
    assert "posting transfer x to the metaserver http://127.0.0.1:9/nothing failed" in caplog.text


# -- layer-wise: prefill plans a push per chunk ---------------------------------------------
def _push_params(**kw):
    params = {
        "do_remote_decode": True,
        "transfer_id": "xfer-1",
        "remote_engine_id": "decode-engine",
        "remote_host": "10.0.0.2",
        "remote_port": 40000,
        "remote_block_ids": [100, 101, 102, 103, 104],
        "remote_first_block": 0,
        "remote_tp_size": 1,
    }
    params.update(kw)
    return params


def _producer(prompt_blocks):
    s = _scheduler(role="kv_producer", layerwise=True)
    manager = Manager()
    s.bind_kv_cache_manager(manager)
    manager.blocks["p-1"] = prompt_blocks
    return s


def test_layerwise_prefill_pushes_each_chunk_and_marks_the_last():
    s = _producer([10, 11, 12, 13, 14])
    request = _request("p-1", prompt=18, params=_push_params())  # 5 blocks, the last one partial
    assert s.get_num_new_matched_tokens(request, 0) == (0, False)
    peer = Peer("decode-engine", "10.0.0.2", 40000, 1)
    # first chunk: tokens 0..5 -> blocks 0, 1 (block 1 partial)
    assert _step(s, {"p-1": 6}).push == [PushTask("p-1", "xfer-1", [10, 11], [100, 101], peer, False)]
    request.num_computed_tokens = 6
    # middle chunk: tokens 6..13 -> blocks 1..3 (block 1 completed now, block 3 partial)
    assert _step(s, {"p-1": 8}).push == [
        PushTask("p-1", "xfer-1", [11, 12, 13], [101, 102, 103], peer, False)
    ]
    request.num_computed_tokens = 14
    # last chunk: tokens 14..17 -> blocks 3, 4
    assert _step(s, {"p-1": 4}).push == [PushTask("p-1", "xfer-1", [13, 14], [103, 104], peer, True)]
    request.num_computed_tokens = 18
    assert _step(s, {"p-1": 1}).push == []


def test_layerwise_prefill_skips_blocks_decode_already_holds():
    s = _producer([10, 11, 12, 13])
    request = _request(
        "p-1", prompt=16, params=_push_params(remote_block_ids=[102, 103], remote_first_block=2)
    )
    s.get_num_new_matched_tokens(request, 0)
    peer = Peer("decode-engine", "10.0.0.2", 40000, 1)
    assert _step(s, {"p-1": 8}).push == [PushTask("p-1", "xfer-1", [], [], peer, False)]
    request.num_computed_tokens = 8
    assert _step(s, {"p-1": 8}).push == [PushTask("p-1", "xfer-1", [12, 13], [102, 103], peer, True)]


def test_layerwise_prefill_pushes_its_own_prefix_cache_hit():
    # prefill found the first two blocks in its own prefix cache: decode still needs them
    s = _producer([10, 11, 12, 13])
    request = _request("p-1", prompt=16, params=_push_params(remote_block_ids=[100, 101, 102, 103]))
    s.get_num_new_matched_tokens(request, 8)
    request.num_computed_tokens = 8
    peer = Peer("decode-engine", "10.0.0.2", 40000, 1)
    assert _step(s, {"p-1": 8}).push == [
        PushTask("p-1", "xfer-1", [10, 11, 12, 13], [100, 101, 102, 103], peer, True)
    ]


def test_layerwise_prefill_without_push_fields_pushes_nothing(caplog):
    s = _producer([10])
    params = _push_params()
    del params["transfer_id"]
    with caplog.at_level(logging.WARNING):
        s.get_num_new_matched_tokens(_request("p-1", prompt=4, params=params), 0)
    assert (
        "request p-1 asks for layer-wise remote decode without kv_transfer_params transfer_id" in caplog.text
    )
    assert _step(s, {"p-1": 4}).push == []


def test_layerwise_prefill_finished_request_stops_pushing():
    s = _producer([10, 11])
    request = _request("p-1", prompt=8, params=_push_params())
    s.get_num_new_matched_tokens(request, 0)
    request.status = RequestStatus.FINISHED_ABORTED
    assert s.request_finished(request, [10, 11]) == (False, None)
    assert _step(s, {"p-1": 8}).push == []


def test_layerwise_block_ids_need_the_kv_cache_manager():
    s = _scheduler(role="kv_producer", layerwise=True)
    s.get_num_new_matched_tokens(_request("p-1", prompt=8, params=_push_params()), 0)
    with pytest.raises(RuntimeError, match="the Mooncake connector was not bound to vLLM's KV cache manager"):
        _step(s, {"p-1": 8})
