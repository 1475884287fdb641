"""vLLM KV connectors over Mooncake, under upstream vllm-ascend's names (configs carry over).

``MooncakeConnectorV1``: decode pulls a finished prompt's blocks from prefill.
``MooncakeLayerwiseConnector``: prefill pushes each layer's blocks into decode's as soon as the layer ran.
vLLM builds each connector twice: in the engine-core process for the scheduler
(:class:`~vllm_ascend.kvtransfer.scheduler.MooncakeScheduler`) and in every worker
(:class:`~vllm_ascend.kvtransfer.worker.MooncakeWorker`); each method forwards to the half it belongs to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from vllm_ascend.core.sdk import ConfigError
from vllm_ascend.kvtransfer.config import MooncakeTransferConfig
from vllm_ascend.kvtransfer.metadata import MooncakeConnectorMetadata
from vllm_ascend.kvtransfer.scheduler import MooncakeScheduler
from vllm_ascend.kvtransfer.worker import MooncakeWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


#: speculative methods that draft from token ids alone: they need nothing the transfer leaves out
HOST_DRAFTERS = ("ngram", "ngram_gpu", "suffix")


class MooncakeConnectorV1(KVConnectorBase_V1):
    """Prefill/decode disaggregation where decode reads the prompt's KV blocks from prefill."""

    LAYERWISE = False

    @classmethod
    def check_kv_transfer_config(cls, vllm_config: VllmConfig) -> None:
        """Refuse, at config time, what the connector would not honour (called by the platform)."""
        config = MooncakeTransferConfig.from_vllm_config(vllm_config)
        spec = vllm_config.speculative_config
        if config.is_consumer and spec is not None and spec.method not in HOST_DRAFTERS:
            raise ConfigError(
                f"speculative_config.method = {spec.method!r} on a KV consumer is not supported yet by "
                f"vllm-ascend's {cls.__name__}: a drafter model's first step after a transferred prompt has none of "
                f"the prompt's hidden states; allowed with kv_role {config.role!r}: {', '.join(HOST_DRAFTERS)} "
                "(or no speculation)"
            )

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)  # type: ignore[arg-type]
        self.transfer_config = MooncakeTransferConfig.from_vllm_config(vllm_config)
        self._scheduler: MooncakeScheduler | None = None
        self._worker: MooncakeWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = MooncakeScheduler(vllm_config, self.transfer_config, layerwise=self.LAYERWISE)
        else:
            if kv_cache_config is None:
                raise ValueError("the Mooncake connector's worker half needs vLLM's KVCacheConfig")
            self._worker = MooncakeWorker(
                vllm_config, self.transfer_config, kv_cache_config, layerwise=self.LAYERWISE
            )

    @property
    def scheduler(self) -> MooncakeScheduler:
        if self._scheduler is None:
            raise RuntimeError("scheduler-side method called on the worker half of the Mooncake connector")
        return self._scheduler

    @property
    def worker(self) -> MooncakeWorker:
        if self._worker is None:
            raise RuntimeError("worker-side method called on the scheduler half of the Mooncake connector")
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
        self.scheduler.update_connector_output(
            connector_output.finished_recving, connector_output.finished_sending
        )

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler.request_finished(request, block_ids)

    # -- worker side ---------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.worker.register_kv_caches(kv_caches)

    def _metadata(self) -> MooncakeConnectorMetadata:
        meta = self._get_connector_metadata()
        if not isinstance(meta, MooncakeConnectorMetadata):
            raise TypeError(f"expected MooncakeConnectorMetadata, got {type(meta).__name__}")
        return meta

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self.worker.bind(self._metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks are complete before a request is scheduled (the load is asynchronous): nothing to wait for."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        if self.LAYERWISE:
            self.worker.save_kv_layer(layer_name, self._metadata())

    def wait_for_save(self) -> None:
        if self.LAYERWISE and self.has_connector_metadata():
            self.worker.wait_for_save(self._metadata())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        sending, recving = self.worker.get_finished()
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.get_block_ids_with_load_errors()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()


class MooncakeLayerwiseConnector(MooncakeConnectorV1):
    """Prefill/decode disaggregation where prefill writes each layer's blocks into decode's blocks."""

    LAYERWISE = True
