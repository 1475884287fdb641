"""The Ascend attention backend: what vLLM asks of a backend (name, classes, supported configs)."""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, MultipleOf
from vllm.v1.kv_cache_layout import KVCacheLayout

from vllm_ascend.core.sdk import get_current_hardware_profile
from vllm_ascend.runner.attention.support import (
    ALL_DTYPES,
    HEAD_SIZE_MULTIPLE,
    KV_CACHE_DTYPES,
    MAX_HEAD_SIZE,
)


class AscendAttentionBackend(AttentionBackend):
    """Paged attention over ``[blocks, block_size, Hkv, D]`` K/V caches through the device adaptor."""

    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = list(ALL_DTYPES)
    supported_kv_cache_dtypes: ClassVar[list] = list(KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        from vllm_ascend.runner.attention.impl import AscendAttentionImpl

        return AscendAttentionImpl

    @staticmethod
    def get_builder_cls():
        from vllm_ascend.runner.attention.metadata import AscendAttentionMetadataBuilder

        return AscendAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(get_current_hardware_profile().block_size_multiple)]

    @classmethod
    def supports_sink(cls) -> bool:
        """Per-head sink logits are applied by the impl (``fused_infer_attention``'s ``sinks``)."""
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        """Sliding-window layers are served (``fused_infer_attention``'s ``sliding_window``)."""
        return True

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(range(HEAD_SIZE_MULTIPLE, MAX_HEAD_SIZE + 1, HEAD_SIZE_MULTIPLE))

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # Token-major blocks: each layer's cache is [blocks, block_size, H, D] (the NPU's BSND paging).
        return (KVCacheLayout.LBNHC,)
