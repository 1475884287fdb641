"""The Atlas 310P attention backend: the runner's backend with 310P's impl, builder and dtypes."""

from __future__ import annotations

from typing import ClassVar

import torch

from vllm_ascend.runner.attention.backend import AscendAttentionBackend


class AscendAttentionBackend310(AscendAttentionBackend):
    """Paged attention on 310P: float16 model and KV cache only (the 310P attention kernels' dtype)."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16"]

    @staticmethod
    def get_impl_cls():
        from vllm_ascend.ascend310p.attention.impl import AscendAttentionBackendImpl310

        return AscendAttentionBackendImpl310

    @staticmethod
    def get_builder_cls():
        from vllm_ascend.ascend310p.attention.metadata import AscendAttentionMetadataBuilder310

        return AscendAttentionMetadataBuilder310

    @classmethod
    def supports_sink(cls) -> bool:
        """310P's attention ops take no sink logits (the impl refuses them too)."""
        return False

    @classmethod
    def supports_sliding_window(cls) -> bool:
        """310P's prompt attention takes full masks only; sliding windows are not served there."""
        return False
