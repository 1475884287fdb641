"""The Ascend 950 (A5) adaptor: the A2/A3 mapping with A5's own attention and W8A8 MoE paths."""

from __future__ import annotations

import torch

from vllm_ascend.core.device.adaptor.npu import (
    A2A3DeviceAdaptor,
    require_contiguous,
    torch_npu_module,
    valid_rows,
)


class A5DeviceAdaptor(A2A3DeviceAdaptor):
    """Ascend 950: fused infer attention v2; W8A8 grouped matmul + swiglu + quant composed from single ops."""

    family = "A5"

    def fused_infer_attention(
        self,
        query,
        key_cache,
        value_cache,
        block_table,
        query_start_loc,
        seq_lens,
        scale,
        *,
        causal=True,
        output=None,
    ):
        torch_npu = torch_npu_module()
        require_contiguous(key_cache=key_cache, value_cache=value_cache)
        num_blocks, block_size, num_kv_heads, _ = key_cache.shape
        ends = [int(v) for v in query_start_loc[1:].tolist()]
        num_tokens, num_heads = query.shape[0], query.shape[1]
        used = ends[-1] if ends else 0
        out, _ = torch_npu.npu_fused_infer_attention_score_v2(
            query[:used],
            key_cache.view(num_blocks, block_size, -1),
            value_cache.view(num_blocks, block_size, -1),
            atten_mask=self._causal_mask(query.device) if causal else None,
            actual_seq_qlen=ends,
            actual_seq_kvlen=[int(v) for v in seq_lens.tolist()],
            block_table=block_table,
            num_query_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            softmax_scale=scale,
            input_layout="TND",
            sparse_mode=3 if causal else 0,
            block_size=block_size,
        )
        if output is None:
            output = query.new_zeros(num_tokens, num_heads, value_cache.shape[3])
        output[:used] = out.view(used, num_heads, -1)
        return output[:num_tokens]

    def grouped_matmul_swiglu_quant(
        self, x, weight, group_list, weight_scale, x_scale, *, group_list_type="cumsum"
    ):
        hidden = self.grouped_quant_matmul(
            x,
            weight,
            group_list,
            weight_scale,
            x_scale,
            group_list_type=group_list_type,
            output_dtype=torch.float32,
        )
        torch_npu = torch_npu_module()
        q, scale = torch_npu.npu_dynamic_quant(torch_npu.npu_swiglu(hidden, dim=-1))
        valid = valid_rows(group_list, group_list_type, x.shape[0], x.device)
        return q.masked_fill(~valid, 0), scale.masked_fill(~valid.squeeze(1), 0)
