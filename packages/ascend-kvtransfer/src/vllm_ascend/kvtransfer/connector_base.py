"""What this sibling's vLLM KV connectors share: vLLM builds each connector twice, a scheduler half in the
engine-core process and a worker half in every worker, and each connector method forwards to its half."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class SchedulerHalf(Protocol):
    def bind_kv_cache_manager(self, manager: KVCacheManager) -> None: ...
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]: ...
    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None: ...
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata: ...
    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]: ...


class WorkerHalf(Protocol):
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None: ...
    def get_finished(self) -> tuple[set[str], set[str]]: ...
    def get_block_ids_with_load_errors(self) -> set[int]: ...
    def shutdown(self) -> None: ...


S = TypeVar("S", bound=SchedulerHalf)
W = TypeVar("W", bound=WorkerHalf)
M = TypeVar("M", bound=KVConnectorMetadata)


class SplitConnector(KVConnectorBase_V1, Generic[S, W, M]):
    """A connector whose scheduler half (``S``) and worker half (``W``) exchange metadata ``M`` each step."""

    #: the metadata class the scheduler half builds (checked on the worker side)
    METADATA: type[KVConnectorMetadata] = KVConnectorMetadata

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)  # type: ignore[arg-type]
        self._scheduler: S | None = None
        self._worker: W | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = self.make_scheduler(vllm_config)
        else:
            if kv_cache_config is None:
                raise ValueError(f"{type(self).__name__}'s worker half needs vLLM's KVCacheConfig")
            self._worker = self.make_worker(vllm_config, kv_cache_config)

    @abc.abstractmethod
    def make_scheduler(self, vllm_config: VllmConfig) -> S:
        """The scheduler half (engine-core process)."""

    @abc.abstractmethod
    def make_worker(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> W:
        """The worker half (one per rank)."""

    @property
    def scheduler(self) -> S:
        if self._scheduler is None:
            raise RuntimeError(f"scheduler-side method called on the worker half of {type(self).__name__}")
        return self._scheduler

    @property
    def worker(self) -> W:
        if self._worker is None:
            raise RuntimeError(f"worker-side method called on the scheduler half of {type(self).__name__}")
        return self._worker

    def _metadata(self) -> M:
        meta = self._get_connector_metadata()
        if not isinstance(meta, self.METADATA):
            raise TypeError(f"expected {self.METADATA.__name__}, got {type(meta).__name__}")
        return meta  # type: ignore[return-value]

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

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler.request_finished(request, block_ids)

    # -- worker side ---------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.worker.register_kv_caches(kv_caches)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        sending, recving = self.worker.get_finished()
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.get_block_ids_with_load_errors()

    def shutdown(self) -> None:
        for half in (self._scheduler, self._worker):
            close = getattr(half, "shutdown", None)
            if close is not None:
                close()
