"""``AscendStoreConnector`` (upstream vllm-ascend's name): a KV pool in Mooncake Store shared by instances.

Any number of instances pointing at one pool master share prompt blocks by content: what one computed,
another loads instead of computing (counted by vLLM as external prefix-cache hits). It composes with the
P/D connectors through vLLM's ``MultiConnector``. Scheduler half:
:class:`~vllm_ascend.kvtransfer.store_scheduler.AscendStoreScheduler`; worker half:
:class:`~vllm_ascend.kvtransfer.store_worker.AscendStoreWorker`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from vllm_ascend.kvtransfer.store_config import StoreConnectorConfig
from vllm_ascend.kvtransfer.store_metadata import StoreConnectorMetadata
from vllm_ascend.kvtransfer.store_scheduler import AscendStoreScheduler
from vllm_ascend.kvtransfer.store_worker import AscendStoreWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


class AscendStoreConnector(KVConnectorBase_V1):
    """Prefix blocks shared by instances through a Mooncake Store pool."""

    @classmethod
    def check_kv_transfer_config(cls, vllm_config: VllmConfig) -> None:
        """Refuse, at config time, what the connector would not honour (called by the platform)."""
        StoreConnectorConfig.from_vllm_config(vllm_config)

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)  # type: ignore[arg-type]
        self.store_config = StoreConnectorConfig.from_vllm_config(vllm_config)
        self._scheduler: AscendStoreScheduler | None = None
        self._worker: AscendStoreWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = AscendStoreScheduler(vllm_config, self.store_config)
        else:
            if kv_cache_config is None:
                raise ValueError("AscendStoreConnector's worker half needs vLLM's KVCacheConfig")
            self._worker = AscendStoreWorker(vllm_config, self.store_config, kv_cache_config)

    @property
    def scheduler(self) -> AscendStoreScheduler:
        if self._scheduler is None:
            raise RuntimeError("scheduler-side method called on the worker half of AscendStoreConnector")
        return self._scheduler

    @property
    def worker(self) -> AscendStoreWorker:
        if self._worker is None:
            raise RuntimeError("worker-side method called on the scheduler half of AscendStoreConnector")
        return self._worker

    # -- scheduler side ------------------------------------------------------------------------
    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self.scheduler.bind_kv_cache_manager(kv_cache_manager)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self.scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.scheduler.update_connector_output(connector_output.finished_recving)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler.request_finished(request, block_ids)

    # -- worker side ---------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.worker.register_kv_caches(kv_caches)

    def _metadata(self) -> StoreConnectorMetadata:
        meta = self._get_connector_metadata()
        if not isinstance(meta, StoreConnectorMetadata):
            raise TypeError(f"expected StoreConnectorMetadata, got {type(meta).__name__}")
        return meta

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self.worker.start_load_kv(self._metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads complete before their request runs (asynchronous) or before the step (``load_async`` false)."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        """Blocks are put whole after the step (:meth:`wait_for_save`)."""

    def wait_for_save(self) -> None:
        if self.has_connector_metadata():
            self.worker.wait_for_save(self._metadata())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        sending, recving = self.worker.get_finished()
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.get_block_ids_with_load_errors()

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self._worker is not None:
            self._worker.shutdown()
