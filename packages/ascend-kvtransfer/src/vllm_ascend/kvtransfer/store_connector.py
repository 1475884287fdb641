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
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from vllm_ascend.kvtransfer.connector_base import SplitConnector
from vllm_ascend.kvtransfer.store_config import StoreConnectorConfig
from vllm_ascend.kvtransfer.store_metadata import StoreConnectorMetadata
from vllm_ascend.kvtransfer.store_scheduler import AscendStoreScheduler
from vllm_ascend.kvtransfer.store_worker import AscendStoreWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput


class AscendStoreConnector(SplitConnector[AscendStoreScheduler, AscendStoreWorker, StoreConnectorMetadata]):
    """Prefix blocks shared by instances through a Mooncake Store pool."""

    METADATA = StoreConnectorMetadata

    @classmethod
    def check_kv_transfer_config(cls, vllm_config: VllmConfig) -> None:
        """Refuse, at config time, what the connector would not honour (called by the platform)."""
        StoreConnectorConfig.from_vllm_config(vllm_config)

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        self.store_config = StoreConnectorConfig.from_vllm_config(vllm_config)
        super().__init__(vllm_config, role, kv_cache_config)

    def make_scheduler(self, vllm_config: VllmConfig) -> AscendStoreScheduler:
        return AscendStoreScheduler(vllm_config, self.store_config)

    def make_worker(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> AscendStoreWorker:
        return AscendStoreWorker(vllm_config, self.store_config, kv_cache_config)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.scheduler.update_connector_output(connector_output.finished_recving)

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
