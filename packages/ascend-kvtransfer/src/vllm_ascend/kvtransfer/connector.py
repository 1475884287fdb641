"""vLLM KV connectors over Mooncake, under upstream vllm-ascend's names (configs carry over).

``MooncakeConnectorV1``: decode pulls a finished prompt's blocks from prefill.
``MooncakeLayerwiseConnector``: prefill pushes each layer's blocks into decode's as soon as the layer ran.
Scheduler half: :class:`~vllm_ascend.kvtransfer.scheduler.MooncakeScheduler`; worker half:
:class:`~vllm_ascend.kvtransfer.worker.MooncakeWorker` (see :class:`~vllm_ascend.kvtransfer.connector_base.SplitConnector`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from vllm_ascend.core.sdk import ConfigError
from vllm_ascend.kvtransfer.config import MooncakeTransferConfig
from vllm_ascend.kvtransfer.connector_base import SplitConnector
from vllm_ascend.kvtransfer.metadata import MooncakeConnectorMetadata
from vllm_ascend.kvtransfer.scheduler import MooncakeScheduler
from vllm_ascend.kvtransfer.worker import MooncakeWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput


#: speculative methods that draft from token ids alone: they need nothing the transfer leaves out
HOST_DRAFTERS = ("ngram", "ngram_gpu", "suffix")


class MooncakeConnectorV1(SplitConnector[MooncakeScheduler, MooncakeWorker, MooncakeConnectorMetadata]):
    """Prefill/decode disaggregation where decode reads the prompt's KV blocks from prefill."""

    LAYERWISE = False
    METADATA = MooncakeConnectorMetadata

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
        self.transfer_config = MooncakeTransferConfig.from_vllm_config(vllm_config)
        super().__init__(vllm_config, role, kv_cache_config)

    def make_scheduler(self, vllm_config: VllmConfig) -> MooncakeScheduler:
        return MooncakeScheduler(vllm_config, self.transfer_config, layerwise=self.LAYERWISE)

    def make_worker(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> MooncakeWorker:
        return MooncakeWorker(vllm_config, self.transfer_config, kv_cache_config, layerwise=self.LAYERWISE)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.scheduler.update_connector_output(
            connector_output.finished_recving, connector_output.finished_sending
        )

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


class MooncakeLayerwiseConnector(MooncakeConnectorV1):
    """Prefill/decode disaggregation where prefill writes each layer's blocks into decode's blocks."""

    LAYERWISE = True
