"""The scheduler half of ``AscendStoreConnector`` (vLLM's engine-core process).

A new request's prompt is looked up in the pool block by block, past what the device's prefix cache already
holds: the leading run of blocks present becomes an external hit, loaded by the workers into the blocks vLLM
allocates (asynchronously by default: the request waits while others run). Each step, prompt blocks that the
step completes are planned as saves; a finished request that had saves keeps its blocks until every worker
has put them. With the pool unreachable the lookup answers no hit (the prompt is computed here).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_ascend.core.sdk import init_logger
from vllm_ascend.kvtransfer.block_keys import RequestKeys, block_key, pool_namespace
from vllm_ascend.kvtransfer.pool import PoolConnection, PoolUnavailable
from vllm_ascend.kvtransfer.store_config import StoreConnectorConfig
from vllm_ascend.kvtransfer.store_metadata import BlockTask, StoreConnectorMetadata, lookup_shard

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

logger = init_logger(__name__)


@dataclass
class _Tracked:
    request: Request
    keys: RequestKeys
    saved: int = 0  # prompt blocks planned for saving (or known present) so far
    had_saves: bool = False
    hit: tuple[int, int] = (0, 0)  # blocks [first, end) found in the pool at the last lookup
    load: list[bytes] = field(default_factory=list)


class AscendStoreScheduler:
    """Pool lookups, load and save plans, and delayed frees."""

    def __init__(self, vllm_config: VllmConfig, config: StoreConnectorConfig) -> None:
        self.config = config
        self.block_size = vllm_config.cache_config.block_size
        self.namespace = pool_namespace(vllm_config, config.namespace)
        self.shard = lookup_shard(vllm_config)
        self._manager: KVCacheManager | None = None
        # the scheduler only asks which keys exist: it lends the pool no memory
        self._pool = PoolConnection(dataclasses.replace(config.pool, global_segment_size=0))
        if config.loads:
            self._pool.get()  # at start-up, not on the first request's lookup
        self._tracked: dict[str, _Tracked] = {}
        self._loads: list[BlockTask] = []
        self._loading: set[str] = set()  # loads planned and not yet reported received
        self._release: list[str] = []

    def bind_kv_cache_manager(self, manager: KVCacheManager) -> None:
        self._manager = manager

    def _track(self, request: Request) -> _Tracked:
        tracked = self._tracked.get(request.request_id)
        if tracked is None:
            tracked = _Tracked(request, RequestKeys(self.namespace, request, self.block_size))
            self._tracked[request.request_id] = tracked
        return tracked

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        tracked = self._track(request)
        first = num_computed_tokens // self.block_size
        tracked.saved = max(tracked.saved, first)  # the device's prefix hits were saved when computed
        if not self.config.loads:
            return 0, False
        # at least one token is computed here, so the last full block of an aligned prompt is never a hit
        limit = (request.num_tokens - 1) // self.block_size
        if first >= limit:
            return 0, False
        pool = self._pool.get()
        if pool is None:
            return 0, False
        hashes = tracked.keys.extend(request.all_token_ids)[first:limit]
        try:
            present = pool.exists([block_key(self.namespace, h, self.shard) for h in hashes])
        except PoolUnavailable as error:
            logger.warning("KV pool lookup failed (%s); computing request %s here", error, request.request_id)
            return 0, False
        hits = 0
        while hits < len(present) and present[hits]:
            hits += 1
        tracked.hit = (first, first + hits)
        tracked.load = hashes[:hits]
        if hits == 0:
            return 0, False
        return (first + hits) * self.block_size - num_computed_tokens, self.config.load_async

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        tracked = self._tracked.get(request.request_id)
        if tracked is None or num_external_tokens <= 0 or not tracked.load:
            return
        first = tracked.hit[0]
        block_ids = blocks.get_block_ids()[0]
        count = min(len(tracked.load), -(-num_external_tokens // self.block_size), len(block_ids) - first)
        if count <= 0:
            return
        self._loads.append(
            BlockTask(request.request_id, tracked.load[:count], list(block_ids[first : first + count]))
        )
        self._loading.add(request.request_id)
        tracked.saved = max(tracked.saved, first + count)
        tracked.load = []

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> StoreConnectorMetadata:
        meta = StoreConnectorMetadata(
            loads=self._loads, saves=[], release=self._release, sync_load=not self.config.load_async
        )
        self._loads, self._release = [], []
        if not self.config.saves or self._manager is None:
            return meta
        spec = scheduler_output.scheduled_spec_decode_tokens
        for req_id, scheduled in scheduler_output.num_scheduled_tokens.items():
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            request = tracked.request
            done = request.num_computed_tokens + scheduled - len(spec.get(req_id, ()))
            target = min(done, request.num_prompt_tokens) // self.block_size
            if target <= tracked.saved:
                continue
            hashes = tracked.keys.extend(request.prompt_token_ids or ())
            block_ids = self._manager.get_block_ids(req_id)[0]
            target = min(target, len(block_ids), len(hashes))
            meta.saves.append(
                BlockTask(req_id, hashes[tracked.saved : target], list(block_ids[tracked.saved : target]))
            )
            tracked.saved, tracked.had_saves = target, True
        return meta

    def update_connector_output(self, finished_recving: set[str] | None) -> None:
        self._loading.difference_update(finished_recving or ())

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Keep a request's blocks while a worker may still put them or load into them (the workers answer
        with ``finished_sending`` once nothing of theirs is outstanding)."""
        tracked = self._tracked.pop(request.request_id, None)
        loading = request.request_id in self._loading
        self._loading.discard(request.request_id)
        if loading or (tracked is not None and tracked.had_saves):
            self._release.append(request.request_id)
            return True, None
        return False, None

    def shutdown(self) -> None:
        self._pool.close()
