"""The Ascend 950 (A5) adaptor: the A2/A3 mapping with A5's own attention and W8A8 MoE paths."""

from __future__ import annotations

import torch

from vllm_ascend.kernels.device.npu import (
    A2A3DeviceAdaptor,
    torch_npu_module,
    valid_rows,
)


class A5DeviceAdaptor(A2A3DeviceAdaptor):
    """Ascend 950: fused infer attention v2; W8A8 grouped matmul + swiglu + quant composed from single ops."""

    family = "A5"

    def _fia_plain(
        self,
        query,
        key,
        value,
        *,
        atten_mask,
        q_ends,
        kv_lens,
        block_table,
        num_kv_heads,
        scale,
        sparse_mode,
        block_size,
    ):
        """A5's TND ``npu_fused_infer_attention_score_v2`` without window or sinks."""
        out, _ = torch_npu_module().npu_fused_infer_attention_score_v2(
            query,
            key,
            value,
            atten_mask=atten_mask,
            actual_seq_qlen=q_ends,
            actual_seq_kvlen=kv_lens,
            block_table=block_table,
            num_query_heads=query.shape[1],
            num_key_value_heads=num_kv_heads,
            softmax_scale=scale,
            input_layout="TND",
            sparse_mode=sparse_mode,
            block_size=block_size,
        )
        return out

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
