"""Rotary position embedding through the device op ``torch.ops.vllm_ascend.rotary_embedding``."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

from vllm_ascend.kernels.device.graph_ops import device_ops


class AscendRotaryEmbedding(RotaryEmbedding):
    """Neox / GPT-J rotary embedding by the adaptor's ``rotary_embedding``; returns new q, k."""

    def forward_oot(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        cos_sin_cache = self._match_cos_sin_cache_dtype(query)
        return device_ops().rotary_embedding(
            positions.flatten(), query, key, self.head_size, cos_sin_cache, self.is_neox_style
        )
