"""Rotary position embedding through the device adaptor."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

from vllm_ascend.core.device.config import get_device_adaptor


class AscendRotaryEmbedding(RotaryEmbedding):
    """Neox / GPT-J rotary embedding by the adaptor's ``rotary_embedding``; returns new q, k."""

    def forward_oot(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        cos_sin_cache = self._match_cos_sin_cache_dtype(query)
        return get_device_adaptor().rotary_embedding(
            positions.flatten(), query, key, self.head_size, cos_sin_cache, self.is_neox_style
        )
