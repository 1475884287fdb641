"""KV offload to host memory for vLLM's ``OffloadingConnector``: the Ascend offloading spec and its worker.

vLLM's connector keeps the scheduler half (which block hashes live in host memory, LRU/ARC eviction, when to
store and load) and asks a spec for a worker that moves blocks. Its ``CPUOffloadingSpec`` moves them with CUDA
kernels; :class:`NPUOffloadingSpec` (upstream vllm-ascend's name) keeps that spec's scheduler half and host
sizing (``cpu_bytes_to_use``, ``block_size`` / ``blocks_per_chunk``, ``eviction_policy``) and gives the
:class:`NPUOffloadingWorker`, which copies device blocks to host pages and back with the device adaptor's
``swap_blocks`` — batched per cache tensor, on a side stream and into pinned host buffers where the device has
them (NPUs), as plain host copies on the reference device. The platform names this spec for an
``OffloadingConnector`` whose ``spec_name`` is left at vLLM's default.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from vllm_ascend.core.sdk import ConfigError, get_device_adaptor, init_logger

logger = init_logger(__name__)

#: ``spec_name`` values served by :class:`NPUOffloadingSpec` (vLLM's default name is mapped onto it).
SPEC_NAME = "NPUOffloadingSpec"
EVICTION_POLICIES = ("lru", "arc")


def check_offloading_extra_config(extra: Mapping[str, Any], where: str = "kv_connector_extra_config") -> None:
    """Refuse, by field, an ``OffloadingConnector`` configuration this spec cannot serve (``where``: the
    config path shown in the message)."""
    size = extra.get("cpu_bytes_to_use")
    if size is None or isinstance(size, bool) or not isinstance(size, int | float) or size <= 0:
        raise ConfigError(
            f"{where}.cpu_bytes_to_use must be a positive number of host bytes for the "
            f"offloaded KV cache (or pass --kv-offloading-size GiB), got {size!r}"
        )
    policy = extra.get("eviction_policy", "lru")
    if policy not in EVICTION_POLICIES and extra.get("cache_policy_module_path") is None:
        raise ConfigError(
            f"{where}.eviction_policy = {policy!r} is not supported; "
            f"supported: {', '.join(EVICTION_POLICIES)} (or cache_policy_module_path)"
        )
    if extra.get("canonical_layout"):
        raise ConfigError(
            f"{where}.canonical_layout is not supported by vllm-ascend's offloading "
            "(host pages are per worker); supported: false"
        )


class NPUOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading scheduler half with host pages private to each worker, moved by the adaptor."""

    #: called by the platform at config time with the connector's extra config
    check_kv_transfer_config = staticmethod(check_offloading_extra_config)

    def __init__(self, config: OffloadingConfig):
        check_offloading_extra_config(config.extra_config)
        super().__init__(config)

    def _uses_shared_region(self) -> bool:
        """Each worker owns its host pages (no shared mmap region across ranks)."""
        return False

    def get_worker(self, kv_caches: CanonicalKVCaches) -> NPUOffloadingWorker:
        if self._worker is None:
            self._worker = NPUOffloadingWorker(
                kv_caches,
                self.blocks_per_chunk,
                self.num_chunks,
                latent_split=_latent_split(self.tokens_per_block),
            )
        return self._worker


def _latent_split(tokens_per_block: tuple[int, ...]) -> tuple[int, int, int] | None:
    """``(block_size, kv_lora_rank, qk_rope_head_dim)`` when the model's caches are MLA latent allocations (the
    worker is built inside vLLM's config context): the platform's latent cache stores every block's ``c_kv``
    first, then every block's ``k_pe`` (``latent_cache_parts``), so a block is two ranges, not one page."""
    from vllm.config import get_current_vllm_config_or_none

    vllm_config = get_current_vllm_config_or_none()
    if vllm_config is None:
        raise RuntimeError(
            "the offloading worker must be built inside vLLM's config context (its worker does so)"
        )
    if not vllm_config.model_config.use_mla:
        return None
    text = vllm_config.model_config.hf_text_config
    rank, rope = int(getattr(text, "kv_lora_rank", 0) or 0), int(getattr(text, "qk_rope_head_dim", 0) or 0)
    return (tokens_per_block[0], rank, rope)


def latent_planes(
    tensor: torch.Tensor, block_size: int, kv_lora_rank: int, rope_dim: int
) -> list[torch.Tensor]:
    """A latent allocation's ``[blocks, page]`` byte view as its ``c_kv`` and ``k_pe`` planes, each
    ``[blocks, bytes of one block]`` (the allocation holds every block's ``c_kv``, then every block's ``k_pe``)."""
    num_blocks, page = tensor.shape
    element, rest = divmod(page, block_size * (kv_lora_rank + rope_dim))
    if rest or tensor.stride() != (page, 1):
        raise ValueError(
            f"MLA latent cache view {tuple(tensor.shape)} (strides {tensor.stride()}) is not one allocation of "
            f"{block_size} tokens x ({kv_lora_rank} + {rope_dim}) elements per block"
        )
    flat = tensor.reshape(-1)
    c_kv_bytes = block_size * kv_lora_rank * element
    split = num_blocks * c_kv_bytes
    return [flat[:split].view(num_blocks, c_kv_bytes), flat[split:].view(num_blocks, page - c_kv_bytes)]


@dataclass
class _Transfer:
    job_id: int
    end_event: Any
    num_bytes: int
    started: float
    duration: float | None  # known at issue when the copies ran synchronously


class NPUOffloadingWorker(OffloadingWorker):
    """Moves blocks between the device KV cache and host pages of ``blocks_per_chunk`` blocks each.

    Host tensor ``i`` mirrors device cache tensor ``i`` as ``[num_chunks * blocks_per_chunk, page]`` rows,
    so chunk ``c`` holds rows ``c * blocks_per_chunk ...``. Transfers of one direction run in submission
    order on one side stream that first waits for the compute stream (stores read what the model wrote,
    loads must land after pending writes to their blocks)."""

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        num_chunks: int,
        latent_split: tuple[int, int, int] | None = None,
    ) -> None:
        self._adaptor = get_device_adaptor()
        self._streams = self._adaptor.stream_api()
        self.blocks_per_chunk = blocks_per_chunk
        pin = self._adaptor.pin_memory_available()
        self.device_tensors: list[torch.Tensor] = []
        self.host_tensors: list[torch.Tensor] = []
        parts_of: list[list[int]] = []  # canonical tensor -> the device tensors its blocks are made of
        for index, cache in enumerate(kv_caches.tensors):
            tensor = cache.tensor
            if tensor.dim() != 2 or tensor.dtype != torch.int8:
                tensor = tensor.view(torch.int8).view(-1, cache.page_size_bytes)
            if tensor.shape[1] != cache.page_size_bytes:
                raise ValueError(
                    f"KV cache tensor {index}: {tensor.shape[1]}-byte rows but a {cache.page_size_bytes}-byte page"
                )
            parts = latent_planes(tensor, *latent_split) if latent_split else [tensor]
            parts_of.append(list(range(len(self.device_tensors), len(self.device_tensors) + len(parts))))
            for part in parts:
                self.device_tensors.append(part)
                self.host_tensors.append(
                    torch.zeros(
                        (num_chunks * blocks_per_chunk, part.shape[1]), dtype=torch.int8, pin_memory=pin
                    )
                )
        # per group: the distinct tensors its layers live in (aliased layers share one)
        self._group_tensors = [
            sorted({part for ref in refs for part in parts_of[ref.tensor_idx]})
            for refs in kv_caches.group_data_refs
        ]
        self._stores: deque[_Transfer] = deque()
        self._loads: deque[_Transfer] = deque()
        self._store_stream = self._streams["Stream"]()
        self._load_stream = self._streams["Stream"]()
        logger.info(
            "KV offload: %d host tensors, %d chunks of %d blocks, %.1f MiB (pinned: %s)",
            len(self.host_tensors),
            num_chunks,
            blocks_per_chunk,
            sum(t.numel() for t in self.host_tensors) / 2**20,
            pin,
        )

    def _rows(
        self, device_spec: GPULoadStoreSpec, host_spec: LoadStoreSpec
    ) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Per group ``(group, device rows, host rows)``: host chunks expanded to block rows, the first chunk's
        leading blocks skipped where the group starts mid-chunk (``block_indices``)."""
        if not isinstance(host_spec, BlockIDsLoadStoreSpec):
            raise TypeError(f"host spec must carry chunk ids, got {type(host_spec).__name__}")
        per_chunk = self.blocks_per_chunk
        device_ids, chunk_ids = device_spec.block_ids, host_spec.block_ids
        out = []
        device_at = chunk_at = 0
        for group, (count, first) in enumerate(
            zip(device_spec.group_sizes, device_spec.block_indices, strict=True)
        ):
            if count == 0:
                continue
            skip = first % per_chunk
            chunks = -(-(count + skip) // per_chunk)
            group_chunks = chunk_ids[chunk_at : chunk_at + chunks].astype(np.int64)
            host_rows = (group_chunks[:, None] * per_chunk + np.arange(per_chunk)).ravel()[
                skip : skip + count
            ]
            out.append((group, device_ids[device_at : device_at + count].astype(np.int64), host_rows))
            device_at += count
            chunk_at += chunks
        if device_at != len(device_ids) or chunk_at != len(chunk_ids):
            raise ValueError(
                f"transfer spec mismatch: {len(device_ids)} device blocks / {len(chunk_ids)} host chunks, "
                f"groups cover {device_at} / {chunk_at}"
            )
        return out

    def _submit(
        self, job_id: int, device_spec: GPULoadStoreSpec, host_spec: LoadStoreSpec, store: bool
    ) -> bool:
        plan = self._rows(device_spec, host_spec)
        queue, stream = (self._stores, self._store_stream) if store else (self._loads, self._load_stream)
        started = time.perf_counter()
        stream.wait_stream(self._streams["current_stream"]())
        num_bytes = 0
        with self._streams["stream"](stream):
            for group, device_rows, host_rows in plan:
                device_ids, host_ids = torch.from_numpy(device_rows), torch.from_numpy(host_rows)
                for index in self._group_tensors[group]:
                    device, host = self.device_tensors[index], self.host_tensors[index]
                    if store:
                        num_bytes += self._adaptor.swap_blocks(device, host, device_ids, host_ids)
                    else:
                        num_bytes += self._adaptor.swap_blocks(host, device, host_ids, device_ids)
            event = self._streams["Event"]()
            event.record(stream)
        finished = event.query()
        duration = time.perf_counter() - started if finished else None
        queue.append(_Transfer(job_id, event, num_bytes, started, duration))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._submit(job_id, src_spec, dst_spec, store=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._submit(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list[TransferResult]:
        results = []
        for queue in (self._stores, self._loads):
            while queue and queue[0].end_event.query():
                done = queue.popleft()
                took = done.duration if done.duration is not None else time.perf_counter() - done.started
                results.append(TransferResult(done.job_id, True, done.num_bytes, took))
        return results

    def wait(self, job_ids: set[int]) -> None:
        for queue in (self._stores, self._loads):
            for transfer in queue:
                if transfer.job_id in job_ids:
                    transfer.end_event.synchronize()

    def shutdown(self) -> None:
        for queue in (self._stores, self._loads):
            while queue:
                queue.popleft().end_event.synchronize()
        self.host_tensors.clear()
        self.device_tensors.clear()
