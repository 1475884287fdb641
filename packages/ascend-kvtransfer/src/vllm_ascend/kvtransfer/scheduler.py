"""The scheduler half of the Mooncake connectors (runs in vLLM's engine-core process).

Decode: a request whose ``kv_transfer_params`` ask for remote prefill reports its uncomputed prompt as
loadable asynchronously; once blocks are allocated the worker receives into them (pull: it reads them from
prefill; push: prefill writes them, after this half posted their ids to the proxy's metaserver).
Prefill (pull): a request finished for remote decode keeps its blocks until decode says it has read them
or ``abort_request_timeout`` passes. Prefill (push): each step's prompt blocks are written layer by layer.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import TYPE_CHECKING, Any

from vllm_ascend.core.sdk import init_logger
from vllm_ascend.kvtransfer.config import MooncakeTransferConfig
from vllm_ascend.kvtransfer.metadata import (
    PULL_FIELDS,
    PUSH_FIELDS,
    MooncakeConnectorMetadata,
    Peer,
    PushTask,
    RecvTask,
    missing_fields,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

logger = init_logger(__name__)


class MooncakeScheduler:
    """Remote-prefix accounting, delayed block frees and the per-step worker plan."""

    def __init__(self, vllm_config: VllmConfig, config: MooncakeTransferConfig, *, layerwise: bool) -> None:
        self.config, self.layerwise = config, layerwise
        parallel = vllm_config.parallel_config
        self.block_size = vllm_config.cache_config.block_size
        self.tp_size = parallel.tensor_parallel_size
        self.port = config.side_channel_port(parallel.data_parallel_rank, 0, self.tp_size)
        self._kv_cache_manager: KVCacheManager | None = None
        self._recv: dict[str, RecvTask] = {}
        self._send: dict[str, float] = {}
        self._release: list[str] = []
        self._loading: set[str] = set()
        self._pushing: dict[str, tuple[Request, dict[str, Any]]] = {}
        self._pushed: dict[str, int] = {}  # layer-wise prefill: prompt blocks pushed complete so far

    def bind_kv_cache_manager(self, manager: KVCacheManager) -> None:
        self._kv_cache_manager = manager

    # -- decode --------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if not params:
            return 0, False
        if self.layerwise and params.get("do_remote_decode") and self.config.is_producer:
            self._track_push(request, params)
        if not params.get("do_remote_prefill") or not self.config.is_consumer:
            return 0, False
        wanted = ("transfer_id", "metaserver") if self.layerwise else PULL_FIELDS
        missing = missing_fields(params, wanted)
        if missing:
            logger.warning(
                "request %s asks for remote prefill without kv_transfer_params %s; computing its prompt here",
                request.request_id,
                ", ".join(missing),
            )
            params["do_remote_prefill"] = False
            return 0, False
        count = len(request.prompt_token_ids or ()) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill") or not self.config.is_consumer:
            return
        params["do_remote_prefill"] = False  # once: a second call (after the load) must not start another
        local = blocks.get_unhashed_block_ids() if num_external_tokens > 0 else []
        if self.layerwise:
            self._await_push(request, params, local)
        else:
            self._pull(request, params, local)

    def _pull(self, request: Request, params: dict[str, Any], local: list[int]) -> None:
        remote = list(params["remote_block_ids"])
        peer = Peer(
            str(params["remote_engine_id"]),
            str(params["remote_host"]),
            int(params["remote_port"]),
            int(params.get("remote_tp_size") or self.config.prefill.tp_size or self.tp_size),
        )
        # local new blocks follow the locally cached prefix: they take the remote blocks at the same positions
        taken = remote[len(remote) - len(local) :] if local else []
        self._recv[request.request_id] = RecvTask(
            request.request_id, local, taken, peer, str(params["remote_request_id"])
        )

    def _await_push(self, request: Request, params: dict[str, Any], local: list[int]) -> None:
        transfer_id = str(params["transfer_id"])
        all_blocks = self._block_ids(request.request_id)
        first = len(all_blocks) - len(local)
        announcement = {
            "transfer_id": transfer_id,
            "remote_engine_id": self.config.engine_id,
            "remote_host": self.config.side_channel_host,
            "remote_port": self.port,
            "remote_block_ids": local,
            "remote_first_block": first,
            "remote_tp_size": self.tp_size,
            "remote_request_id": request.request_id,
        }
        peer = Peer(self.config.engine_id, self.config.side_channel_host, self.port, self.tp_size)
        self._recv[request.request_id] = RecvTask(
            request.request_id, local, local, peer, request.request_id, transfer_id
        )
        threading.Thread(
            target=_post_json,
            args=(str(params["metaserver"]), announcement, self.config.transfer_timeout),
            name="kvtransfer-metaserver",
            daemon=True,
        ).start()

    # -- prefill (layer-wise push) -------------------------------------------------------------
    def _track_push(self, request: Request, params: dict[str, Any]) -> None:
        if request.request_id in self._pushing:
            return
        missing = missing_fields(params, PUSH_FIELDS)
        if missing:
            logger.warning(
                "request %s asks for layer-wise remote decode without kv_transfer_params %s; nothing is pushed",
                request.request_id,
                ", ".join(missing),
            )
            return
        self._pushing[request.request_id] = (request, params)

    def _plan_pushes(self, scheduler_output: SchedulerOutput) -> list[PushTask]:
        tasks = []
        for req_id, scheduled in scheduler_output.num_scheduled_tokens.items():
            entry = self._pushing.get(req_id)
            if entry is None:
                continue
            request, params = entry
            prompt = len(request.prompt_token_ids or ())
            start, end = request.num_computed_tokens, min(request.num_computed_tokens + scheduled, prompt)
            if start >= prompt:
                self._pushing.pop(req_id)
                self._pushed.pop(req_id, None)
                continue
            first_remote = int(params.get("remote_first_block") or 0)
            remote = list(params["remote_block_ids"])
            # from the first block not pushed complete yet: prompt blocks this instance had cached go in the
            # first step too; a block the chunk ends inside goes again with the next chunk
            lo, hi = max(self._pushed.get(req_id, 0), first_remote), -(-end // self.block_size)
            self._pushed[req_id] = end // self.block_size
            hi = min(hi, first_remote + len(remote))
            blocks = self._block_ids(req_id)
            peer = Peer(
                str(params["remote_engine_id"]),
                str(params["remote_host"]),
                int(params["remote_port"]),
                int(params.get("remote_tp_size") or self.config.decode.tp_size or self.tp_size),
            )
            last = end >= prompt
            tasks.append(
                PushTask(
                    req_id,
                    str(params["transfer_id"]),
                    blocks[lo:hi] if hi > lo else [],
                    remote[lo - first_remote : hi - first_remote] if hi > lo else [],
                    peer,
                    last,
                )
            )
            if last:
                self._pushing.pop(req_id)
                self._pushed.pop(req_id, None)
        return tasks

    def _block_ids(self, request_id: str) -> list[int]:
        if self._kv_cache_manager is None:
            raise RuntimeError("the Mooncake connector was not bound to vLLM's KV cache manager")
        return list(self._kv_cache_manager.get_block_ids(request_id)[0])

    # -- every step ----------------------------------------------------------------------------
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> MooncakeConnectorMetadata:
        meta = MooncakeConnectorMetadata(
            recv=list(self._recv.values()),
            send=dict(self._send),
            push=self._plan_pushes(scheduler_output) if self.layerwise else [],
            release=list(self._release),
        )
        self._loading.update(self._recv)
        self._recv.clear()
        self._send.clear()
        self._release.clear()
        return meta

    def update_connector_output(
        self, finished_recving: set[str] | None, finished_sending: set[str] | None
    ) -> None:
        for req_id in (finished_recving or set()) | (finished_sending or set()):
            self._loading.discard(req_id)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        from vllm.v1.request import RequestStatus

        req_id = request.request_id
        self._pushing.pop(req_id, None)
        self._pushed.pop(req_id, None)
        # decode: a transfer writes (or, not yet handed to the worker, will write) these blocks and prefill waits
        # for its notice: the worker still runs it, tells prefill, then reports the blocks free
        if req_id in self._recv or req_id in self._loading:
            self._release.append(req_id)
            return True, None
        params = request.kv_transfer_params
        if self.layerwise or not params or not params.get("do_remote_decode") or not self.config.is_producer:
            return False, None
        if request.status != RequestStatus.FINISHED_LENGTH_CAPPED or not block_ids:
            return False, None  # aborted or nothing to read: free now
        self._send[req_id] = self.config.abort_request_timeout
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.config.engine_id,
            "remote_host": self.config.side_channel_host,
            "remote_port": self.port,
            "remote_block_ids": list(block_ids),
            "remote_request_id": req_id,
            "remote_tp_size": self.tp_size,
        }


def _post_json(url: str, body: dict[str, Any], timeout: float) -> None:
    """POST ``body`` to the proxy's metaserver (failures are logged: decode then times out and recomputes)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except Exception as exc:
        logger.warning("posting transfer %s to the metaserver %s failed: %s", body["transfer_id"], url, exc)
