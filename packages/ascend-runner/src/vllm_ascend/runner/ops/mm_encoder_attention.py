"""vLLM's multimodal-encoder attention (vision towers) through the adaptor's ``packed_attention``."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.attention.mm_encoder_attention import MMEncoderAttention

from vllm_ascend.core.sdk import get_device_adaptor


def packed_bounds(cu_seqlens: torch.Tensor | None, batch: int, seq_len: int) -> torch.Tensor:
    """``cu_seqlens`` over the ``batch * seq_len`` flattened rows: vLLM's per-row sequences (the same split
    of every batch row) repeated per row, or one sequence per batch row where vLLM passes none."""
    if cu_seqlens is None:
        return torch.arange(batch + 1, dtype=torch.int32) * seq_len
    bounds = cu_seqlens.to(device="cpu", dtype=torch.int64)
    if batch == 1:
        return bounds
    rows = [bounds[:-1] + row * seq_len for row in range(batch)]
    return torch.cat([*rows, torch.tensor([batch * seq_len])])


class AscendMMEncoderAttention(MMEncoderAttention):
    """Cache-free attention of a vision tower: each of vLLM's packed sequences (an image, a frame, a window)
    attends to itself, by ``packed_attention``; ``max_seqlen`` / ``sequence_lengths`` are not needed."""

    def forward_oot(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: torch.Tensor | None = None,
        sequence_lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.fp8_enabled:
            raise NotImplementedError(
                "mm_encoder_attn_dtype='fp8' is not supported by vllm-ascend; allowed: the model dtype (unset)"
            )
        batch, q_len = query.shape[:2]
        if key.shape[1] != q_len:
            raise NotImplementedError(
                f"AscendMMEncoderAttention: key length {key.shape[1]} != query length {q_len} "
                "(cross-attention is not served)"
            )
        out_shape = query.shape
        rows = batch * q_len
        q = query.reshape(rows, self.num_heads, self.head_size)
        k = key.reshape(rows, self.num_kv_heads, self.head_size)
        v = value.reshape(rows, self.num_kv_heads, self.head_size)
        out = get_device_adaptor().packed_attention(
            q, k, v, packed_bounds(cu_seqlens, batch, q_len), self.scale
        )
        return out.reshape(out_shape)
