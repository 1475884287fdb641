"""Rotary position embedding through the device op ``torch.ops.vllm_ascend.rotary_embedding``."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.model_executor.layers.rotary_embedding.common import ApplyRotaryEmb
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


class AscendApplyRotaryEmb(ApplyRotaryEmb):
    """vLLM's rotation by given angles (the vision towers' 2-D rope) by the adaptor's ``rotary_embedding``.

    ``x [B, S, H, D]`` or ``[S, H, D]`` rotated in full by ``cos``/``sin [S, D/2]`` (row ``s`` for sequence
    position ``s`` of every batch row): the angles become a ``[S, D]`` cos/sin cache read at positions
    ``0..S-1`` of each row. Computed in fp32, returned in ``x``'s dtype.
    """

    def forward_oot(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        seq_len, head_size = x.shape[-3], x.shape[-1]
        if cos.shape != (seq_len, head_size // 2) or sin.shape != cos.shape:
            raise ValueError(
                f"AscendApplyRotaryEmb: cos/sin must be [seq_len={seq_len}, head_size/2={head_size // 2}], "
                f"got {tuple(cos.shape)} and {tuple(sin.shape)}"
            )
        rows = x.numel() // (seq_len * x.shape[-2] * head_size)
        positions = torch.arange(seq_len, device=x.device).repeat(rows)
        cache = torch.cat((cos, sin), dim=-1)
        flat = x.reshape(rows * seq_len, -1)
        rotated, _ = device_ops().rotary_embedding(
            positions, flat, None, head_size, cache, self.is_neox_style
        )
        return rotated.view(x.shape)
