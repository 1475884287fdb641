"""W4A16: weight-only int4 (asymmetric, per channel or per group), packed 8 per int32 in memory.

The checkpoint holds the int4 values unpacked (one per int8 byte) with W8A16's scale/offset layout;
they are packed along the output dimension after the transpose (1/8 of the fp32 bytes).
"""

from __future__ import annotations

import torch

from vllm_ascend.quant.schemes.base import INT4_RANGE, pack_int4_last, weight_format
from vllm_ascend.quant.schemes.registry import register_scheme
from vllm_ascend.quant.schemes.w8a16 import W8A16Linear


@register_scheme("W4A16", "linear")
class W4A16Linear(W8A16Linear):
    """W8A16's math with int4 weights and zero points in [-8, 7]."""

    WEIGHT_RANGE = INT4_RANGE

    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """W8A16's checks with int4 ranges, and an output size that packs into int32."""
        super().validate(layer, tensors)
        self.check_packable("weight", tensors["weight"].shape[0])

    def runtime_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """``[out, in]`` int4-in-int8 → packed int32 ``[in, out/8]`` in the device's weight format."""
        return weight_format(pack_int4_last(weight.t()))
