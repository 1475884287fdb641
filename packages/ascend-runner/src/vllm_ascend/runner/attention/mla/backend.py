"""The Ascend MLA backend: what vLLM's ``MLAAttention`` layer asks of an MLA backend.

The layer itself projects q and the latent kv, normalises ``c_kv``, applies the rotary embedding and absorbs
``W_UK``/``W_UV`` (``process_weights_after_loading``); the backend owns the latent cache
``[blocks, block_size, kv_lora_rank + rope_dim]``, the decompressed prefill and the latent decode.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, MultipleOf
from vllm.v1.kv_cache_layout import KVCacheLayout

from vllm_ascend.core.sdk import get_current_hardware_profile
from vllm_ascend.runner.attention.mla import MLA_KV_CACHE_DTYPES
from vllm_ascend.runner.attention.support import ALL_DTYPES


class AscendMLABackend(AttentionBackend):
    """MLA over a paged latent cache through the device adaptor's MLA ops."""

    accept_output_buffer: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = list(ALL_DTYPES)
    supported_kv_cache_dtypes: ClassVar[list] = list(MLA_KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        from vllm_ascend.runner.attention.mla.impl import AscendMLAImpl

        return AscendMLAImpl

    @staticmethod
    def get_builder_cls():
        from vllm_ascend.runner.attention.mla.metadata import AscendMLAMetadataBuilder

        return AscendMLAMetadataBuilder

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(get_current_hardware_profile().block_size_multiple)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        # Any kv_lora_rank + rope_dim: the reference ops take every latent width (the NPU op checks its own).
        return []

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # One latent head: [blocks, block_size, 1, L + R] whichever of B/N/H comes first within a block.
        return (KVCacheLayout.LBNHC,)
