"""The worker half of ``AscendStoreConnector`` (one per rank): puts and gets KV blocks in the pool.

The runner's cache tensors are registered with the pool's client, so a block moves straight between the
KV cache and the pool (no staging copy): one pool key per block holds that block's bytes of every layer of
this rank's slice (``shard``), as several buffers. Gets and puts run on a small thread pool, bounded by the
pool's ``op_timeout_s``; a failed get marks its blocks invalid, so vLLM recomputes them
(``kv_load_failure_policy``); a failed put is dropped. With the pool gone, loads fail at once and saves are
skipped until its master answers again.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from vllm_ascend.core.sdk import init_logger, latent_cache_parts
from vllm_ascend.kvtransfer.block_keys import block_key, pool_namespace
from vllm_ascend.kvtransfer.layout import Region, describe_cache
from vllm_ascend.kvtransfer.pool import KVPool, PoolConnection, PoolUnavailable
from vllm_ascend.kvtransfer.store_config import StoreConnectorConfig
from vllm_ascend.kvtransfer.store_metadata import BlockTask, StoreConnectorMetadata, shard_name

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = init_logger(__name__)


class AscendStoreWorker:
    """Registration and block moves of one worker rank."""

    def __init__(
        self, vllm_config: VllmConfig, config: StoreConnectorConfig, kv_cache_config: KVCacheConfig
    ) -> None:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError(
                f"AscendStoreConnector moves one KV cache group; this model has "
                f"{len(kv_cache_config.kv_cache_groups)} (hybrid models are not supported yet by the pool)"
            )
        self.config = config
        spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        self.latent = isinstance(spec, MLAAttentionSpec)
        tp, pp = get_tp_group(), get_pp_group()
        self.shard = shard_name(self.latent, tp.rank_in_group, tp.world_size, pp.rank_in_group, pp.world_size)
        # MLA: every TP rank holds the same latent blocks; rank 0 puts them, every rank gets them
        self.puts = config.saves and (not self.latent or tp.rank_in_group == 0)
        self.namespace = pool_namespace(vllm_config, config.namespace)
        self.block_size = vllm_config.cache_config.block_size
        self._kv_lora_rank = int(getattr(vllm_config.model_config.hf_text_config, "kv_lora_rank", 0) or 0)
        self._num_blocks = kv_cache_config.num_blocks
        self._regions: list[Region] = []
        self._storages: list[tuple[int, int]] = []
        self._pool = PoolConnection(config.pool, on_connect=self._register)
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(2, thread_name_prefix="kvpool")
        self._outstanding: dict[str, list[Future[None]]] = defaultdict(list)
        self._loads: dict[str, Future[None]] = {}
        self._released: set[str] = set()
        self._failed_blocks: set[int] = set()
        self.stats = {"put_blocks": 0, "got_blocks": 0, "failed_get_blocks": 0, "dropped_put_blocks": 0}

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Every layer's block regions (sorted by layer name: the same order on every instance)."""
        for name in sorted(kv_caches):
            cache = kv_caches[name]
            for index, tensor in enumerate(cache if isinstance(cache, list | tuple) else [cache]):
                parts = (
                    latent_cache_parts(tensor.view(tensor.shape[0], self.block_size, -1), self._kv_lora_rank)
                    if self.latent
                    else (tensor,)
                )
                for part in parts:
                    layout = describe_cache(
                        f"{name}[{index}]",
                        part,
                        self._num_blocks,
                        block_size=self.block_size,
                        num_heads=0,
                        replicated=True,
                    )
                    self._regions += layout.regions
                storage = tensor.untyped_storage()
                self._storages.append((storage.data_ptr(), storage.nbytes()))
        self._storages = sorted(set(self._storages))
        logger.info(
            "KV pool: %d regions per block (%d bytes), shard %s, namespace %s, master %s",
            len(self._regions),
            sum(r.block_len for r in self._regions),
            self.shard,
            self.namespace,
            self.config.pool.master,
        )
        self._pool.get()

    def _register(self, pool: KVPool) -> None:
        for base, size in self._storages:
            pool.register(base, size)

    def _buffers(self, block_ids: list[int]) -> tuple[list[list[int]], list[list[int]]]:
        ptrs = [[r.base + b * r.block_stride for r in self._regions] for b in block_ids]
        sizes = [[r.block_len for r in self._regions] for _ in block_ids]
        return ptrs, sizes

    def _keys(self, task: BlockTask) -> list[str]:
        return [block_key(self.namespace, h, self.shard) for h in task.hashes]

    # -- loads ---------------------------------------------------------------------------------
    def _get(self, task: BlockTask) -> None:
        pool = self._pool.get()
        ok: list[bool] = [False] * len(task.block_ids)
        if pool is not None:
            ptrs, sizes = self._buffers(task.block_ids)
            try:
                ok = pool.get(self._keys(task), ptrs, sizes)
            except PoolUnavailable as error:
                logger.warning("KV pool get for request %s failed (%s): recomputing", task.request_id, error)
        good = next((i for i, done in enumerate(ok) if not done), len(ok))
        with self._lock:
            self.stats["got_blocks"] += good
            if good < len(task.block_ids):
                # vLLM recomputes from the first invalid block: everything after it is reported too
                self._failed_blocks.update(task.block_ids[good:])
                self.stats["failed_get_blocks"] += len(task.block_ids) - good

    def start_load_kv(self, meta: StoreConnectorMetadata) -> None:
        for task in meta.loads:
            if meta.sync_load:
                self._get(task)
            else:
                future = self._threads.submit(self._get, task)
                self._loads[task.request_id] = future
                self._outstanding[task.request_id].append(future)
        self._released.update(meta.release)

    # -- saves ---------------------------------------------------------------------------------
    def _put(self, task: BlockTask) -> None:
        pool = self._pool.get()
        if pool is None:
            with self._lock:
                self.stats["dropped_put_blocks"] += len(task.block_ids)
            return
        keys = self._keys(task)
        ptrs, sizes = self._buffers(task.block_ids)
        try:
            ok = pool.put(keys, ptrs, sizes)
        except PoolUnavailable as error:
            logger.warning(
                "KV pool put for request %s failed (%s): blocks not shared", task.request_id, error
            )
            ok = [False] * len(keys)
        with self._lock:
            self.stats["put_blocks"] += sum(ok)
            self.stats["dropped_put_blocks"] += len(ok) - sum(ok)

    def wait_for_save(self, meta: StoreConnectorMetadata) -> None:
        """Issue this step's puts (the blocks stay allocated until they are done: see ``release``)."""
        for task in meta.saves:
            future: Future[None] = self._threads.submit(self._put, task) if self.puts else _done()
            self._outstanding[task.request_id].append(future)

    # -- every step ----------------------------------------------------------------------------
    def get_finished(self) -> tuple[set[str], set[str]]:
        """``(finished_sending, finished_recving)``: released requests with nothing outstanding, and loads done."""
        recving: set[str] = set()
        for req_id, future in list(self._loads.items()):
            if future.done():
                del self._loads[req_id]
                if req_id not in self._released:
                    recving.add(req_id)
        sending: set[str] = set()
        for req_id in list(self._released):
            futures = self._outstanding.get(req_id, [])
            if all(f.done() for f in futures):
                self._outstanding.pop(req_id, None)
                self._released.discard(req_id)
                sending.add(req_id)
        for req_id in [
            r for r, fs in self._outstanding.items() if r not in self._released and all(f.done() for f in fs)
        ]:
            del self._outstanding[req_id]
        return sending, recving

    def get_block_ids_with_load_errors(self) -> set[int]:
        with self._lock:
            failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def shutdown(self) -> None:
        logger.info(
            "KV pool (shard %s): %s", self.shard, ", ".join(f"{k} {v}" for k, v in self.stats.items())
        )
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._pool.close()


def _done() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future
