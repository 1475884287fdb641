"""Quantization schemes keyed by (quant type, layer type); importing the package registers them all.

Linear: W8A8, W8A8_DYNAMIC, W8A16, W4A16, W4A8_DYNAMIC, and the 310P-only W8A8S / W8A8SC. MoE: W8A8_DYNAMIC,
W4A8_DYNAMIC.
"""

from __future__ import annotations

from vllm_ascend.quant.schemes.base import AscendLinearScheme, AscendMoEScheme, TensorSpec
from vllm_ascend.quant.schemes.registry import (
    UnsupportedQuantType,
    get_scheme_class,
    implemented,
    register_scheme,
)
from vllm_ascend.quant.schemes.w4a8_dynamic import W4A8DynamicLinear, W4A8DynamicMoE
from vllm_ascend.quant.schemes.w4a16 import W4A16Linear
from vllm_ascend.quant.schemes.w8a8 import W8A8Linear
from vllm_ascend.quant.schemes.w8a8_dynamic import W8A8DynamicLinear, W8A8DynamicMoE
from vllm_ascend.quant.schemes.w8a8_sparse import W8A8SCLinear, W8A8SLinear
from vllm_ascend.quant.schemes.w8a16 import W8A16Linear

__all__ = [
    "AscendLinearScheme",
    "AscendMoEScheme",
    "TensorSpec",
    "UnsupportedQuantType",
    "W4A8DynamicLinear",
    "W4A8DynamicMoE",
    "W4A16Linear",
    "W8A8DynamicLinear",
    "W8A8DynamicMoE",
    "W8A8Linear",
    "W8A8SCLinear",
    "W8A8SLinear",
    "W8A16Linear",
    "get_scheme_class",
    "implemented",
    "register_scheme",
]
