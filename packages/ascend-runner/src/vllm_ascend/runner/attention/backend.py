"""The Ascend attention backend: what vLLM asks of a backend (name, classes, supported configs)."""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, MultipleOf
from vllm.v1.kv_cache_layout import KVCacheLayout

from vllm_ascend.core.platform import BLOCK_SIZE_MULTIPLE, NPUPlatform

#: Head sizes the fused-infer-attention op takes: multiples of 16 up to 512.
HEAD_SIZE_MULTIPLE = 16
MAX_HEAD_SIZE = 512
NPU_DTYPES = (torch.float16, torch.bfloat16)
REFERENCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16")


class AttentionConfigError(ValueError):
    """A model/config that the Ascend attention backend cannot serve."""


def supported_dtypes() -> tuple[torch.dtype, ...]:
    return REFERENCE_DTYPES if NPUPlatform.is_reference() else NPU_DTYPES


def check_supported(head_size: int, dtype: torch.dtype, kv_cache_dtype: str | None) -> None:
    """Raise :class:`AttentionConfigError` naming the field and the allowed values."""
    device = NPUPlatform.get_device_name()
    if head_size % HEAD_SIZE_MULTIPLE != 0 or not 0 < head_size <= MAX_HEAD_SIZE:
        raise AttentionConfigError(
            f"head_size={head_size} is not supported by the Ascend attention backend on {device}; "
            f"allowed: multiples of {HEAD_SIZE_MULTIPLE} from {HEAD_SIZE_MULTIPLE} to {MAX_HEAD_SIZE}"
        )
    allowed = supported_dtypes()
    if dtype not in allowed:
        raise AttentionConfigError(
            f"dtype={dtype} is not supported by the Ascend attention backend on {device}; "
            f"allowed: {', '.join(str(d).removeprefix('torch.') for d in allowed)}"
        )
    if kv_cache_dtype is not None and kv_cache_dtype not in KV_CACHE_DTYPES:
        raise AttentionConfigError(
            f"kv_cache_dtype={kv_cache_dtype!r} is not supported by the Ascend attention backend; "
            f"allowed: {', '.join(KV_CACHE_DTYPES)}"
        )


class AscendAttentionBackend(AttentionBackend):
    """Paged attention over ``[blocks, block_size, Hkv, D]`` K/V caches through the device adaptor."""

    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = list(REFERENCE_DTYPES)
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
        return [MultipleOf(BLOCK_SIZE_MULTIPLE)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(range(HEAD_SIZE_MULTIPLE, MAX_HEAD_SIZE + 1, HEAD_SIZE_MULTIPLE))

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # Token-major blocks: each layer's cache is [blocks, block_size, H, D] (the NPU's BSND paging).
        return (KVCacheLayout.LBNHC,)
