"""The Atlas 310P overlay: core's 310P profile refined, and the 310P device adaptor.

310P cards compute in float16 only and lack the fused MoE and KV-scatter ops of A2/A3
(``torch_npu``'s docs list those ops for A2/A3 only), and their quantized matmuls take no per-token
scales: those ops run the reference torch code on the NPU tensors instead. The profile claims only
what is served: no graph capture (so the platform turns it off) and no sparse int8 weights.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.core.device.adaptor.npu import A2A3DeviceAdaptor, torch_npu_module
from vllm_ascend.core.device.adaptor.reference import (
    ReferenceDeviceAdaptor,
    int8_weight,
    quant_matmul_int32,
)
from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.device.overlay import DeviceOverlay
from vllm_ascend.core.device.profile import BUILTIN_PROFILES

_INT_MAX = 2147483647

PROFILE_310P = BUILTIN_PROFILES[AscendDeviceType._310P].with_changes(
    name="Atlas 310P",
    capabilities=frozenset(),
    supported_dtypes=("float16", "float32"),
)


class Ascend310PDeviceAdaptor(A2A3DeviceAdaptor):
    """310P: prompt flash attention per request (fp16, MHA-expanded KV); no fused MoE/KV-scatter ops."""

    family = "310P"
    TORCH_OPS: ClassVar[frozenset[str]] = frozenset(
        {
            "kv_load",
            "reshape_and_cache",
            "rotary_embedding",
            "swiglu",
            "moe_gating_top_k",
            "moe_init_routing",
            "moe_finalize_routing",
            "moe_distribute_dispatch",
            "moe_distribute_combine",
            "grouped_matmul_swiglu_quant",
            "grouped_quant_matmul",
            "dynamic_quant",
        }
    )

    reshape_and_cache = ReferenceDeviceAdaptor.reshape_and_cache
    rotary_embedding = ReferenceDeviceAdaptor.rotary_embedding
    swiglu = ReferenceDeviceAdaptor.swiglu
    moe_gating_top_k = ReferenceDeviceAdaptor.moe_gating_top_k
    moe_init_routing = ReferenceDeviceAdaptor.moe_init_routing
    moe_finalize_routing = ReferenceDeviceAdaptor.moe_finalize_routing
    # No MC2 on 310P (the MoE runner never selects it there): the fixed-window all-to-all in torch.
    moe_distribute_dispatch = ReferenceDeviceAdaptor.moe_distribute_dispatch
    moe_distribute_combine = ReferenceDeviceAdaptor.moe_distribute_combine
    grouped_matmul_swiglu_quant = ReferenceDeviceAdaptor.grouped_matmul_swiglu_quant
    grouped_quant_matmul = ReferenceDeviceAdaptor.grouped_quant_matmul
    dynamic_quant = ReferenceDeviceAdaptor.dynamic_quant

    def quant_matmul(
        self, x, weight, weight_scale, *, pertoken_scale=None, bias=None, output_dtype=torch.bfloat16
    ):
        """310P's npu_quant_matmul takes no per-token scale (that case runs the reference code) and an int64 scale."""
        if pertoken_scale is not None:
            return quant_matmul_int32(x, weight, weight_scale, pertoken_scale, bias, output_dtype)
        torch_npu = torch_npu_module()
        int_bias = bias if bias is not None and bias.dtype == torch.int32 else None
        out = torch_npu.npu_quant_matmul(
            x,
            int8_weight(weight, "weight", "[K, N]"),
            torch_npu.npu_trans_quant_param(weight_scale.reshape(-1).float()),
            bias=int_bias,
            output_dtype=output_dtype,
        )
        if bias is not None and int_bias is None:  # 310P takes int32 biases only: a float one is added after
            out = out + bias.reshape(-1).to(out.dtype)
        return out

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
        if query.dtype != torch.float16:
            raise DeviceOpError(f"Atlas 310P attention runs in float16 only, got query dtype {query.dtype}")
        torch_npu = torch_npu_module()
        num_tokens, num_heads, _ = query.shape
        group = num_heads // key_cache.shape[2]
        starts = [int(v) for v in query_start_loc.tolist()]
        lens = [int(v) for v in seq_lens.tolist()]
        if output is None:
            output = query.new_zeros(num_tokens, num_heads, value_cache.shape[3])
        for b, seq_len in enumerate(lens):
            q_start, q_end = starts[b], starts[b + 1]
            q_len = q_end - q_start
            if q_len == 0:
                continue
            # 310P's prompt flash attention takes no num_key_value_heads: expand KV heads (MHA).
            key, value = self.kv_load(key_cache, value_cache, block_table[b : b + 1], seq_lens[b : b + 1])
            key = key.repeat_interleave(group, dim=1).unsqueeze(0).contiguous()
            value = value.repeat_interleave(group, dim=1).unsqueeze(0).contiguous()
            mask = None
            if causal:
                rows = torch.arange(q_len, device=query.device).unsqueeze(1) + (seq_len - q_len)
                mask = (torch.arange(seq_len, device=query.device).unsqueeze(0) > rows).view(
                    1, 1, q_len, seq_len
                )
            out = torch_npu.npu_prompt_flash_attention(
                query[q_start:q_end].unsqueeze(0).contiguous(),
                key,
                value,
                atten_mask=mask,
                num_heads=num_heads,
                scale_value=scale,
                pre_tokens=_INT_MAX,
                next_tokens=_INT_MAX,
                input_layout="BSND",
                sparse_mode=0,
            )
            output[q_start:q_end] = out.view(q_len, num_heads, -1)
        return output[:num_tokens]


OVERLAY = DeviceOverlay(
    family=AscendDeviceType._310P,
    profile=PROFILE_310P,
    adaptor=Ascend310PDeviceAdaptor,
    description="Atlas 310P: float16 only, per-request prompt flash attention, no fused MoE ops",
)
