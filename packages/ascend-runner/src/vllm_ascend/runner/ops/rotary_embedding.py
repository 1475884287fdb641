"""Rotary position embedding through the device op ``torch.ops.vllm_ascend.rotary_embedding``."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

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


class AscendMRotaryEmbedding(MRotaryEmbedding):
    """Multimodal rotary embedding (Qwen2-VL family, chunked or interleaved sections) by the adaptor's ``mrope``.

    ``positions`` is vLLM's ``[T]`` (text only) or ``[3, T]`` (T/H/W) vector; returns new q, k.
    """

    def forward_oot(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if key is None or offsets is not None:
            raise NotImplementedError(
                "AscendMRotaryEmbedding needs a key and no position offsets "
                f"(key={'None' if key is None else 'given'}, offsets={'None' if offsets is None else 'given'})"
            )
        cos_sin_cache = self._match_cos_sin_cache_dtype(query)
        section = list(self.mrope_section or [])
        if positions.dim() == 2 and not section:
            raise ValueError(
                "AscendMRotaryEmbedding: [3, T] positions need an mrope_section, the model has none"
            )
        return device_ops().mrope(
            positions,
            query,
            key,
            self.head_size,
            cos_sin_cache,
            section or [cos_sin_cache.shape[-1] // 2, 0, 0],
            self.is_neox_style,
            bool(self.mrope_interleaved),
        )
