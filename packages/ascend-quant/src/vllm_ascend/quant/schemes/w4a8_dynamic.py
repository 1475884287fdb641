"""W4A8_DYNAMIC: int4 per-channel symmetric weights (packed 8 per int32 in memory), int8 per-token activations.

The checkpoint holds the int4 values unpacked, one per int8 byte; they are packed along the output
dimension after the transpose, so a layer keeps 1/8 of the bytes of its fp32 weight. Per channel only:
a per-group export (``group_size > 0``) is refused. Linear and MoE.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from vllm_ascend.quant.errors import QuantLoadError
from vllm_ascend.quant.schemes.base import INT4_RANGE, _Scheme, pack_int4_last, weight_format
from vllm_ascend.quant.schemes.registry import register_scheme
from vllm_ascend.quant.schemes.w8a8_dynamic import W8A8DynamicLinear, W8A8DynamicMoE


class _W4A8Dynamic(_Scheme):
    """What the linear and MoE schemes share: int4 values, per channel only, output sizes that pack into int32."""

    WEIGHT_RANGE = INT4_RANGE
    #: ``(tensor, dim)`` whose size is the output dimension packed 8 per int32.
    PACKED_OUTPUTS: ClassVar[tuple[tuple[str, int], ...]]

    def __init__(self, *, prefix: str, group_size: int | None, params_dtype: torch.dtype) -> None:
        super().__init__(prefix=prefix, group_size=group_size, params_dtype=params_dtype)
        if group_size:
            raise QuantLoadError(
                f"layer {prefix!r}: W4A8_DYNAMIC with group_size={group_size} (per-group int4 weights) is not "
                "supported; supported: per-channel W4A8_DYNAMIC (group_size 0 or absent)"
            )

    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """W8A8_DYNAMIC's checks with int4 values, and output sizes that pack into int32."""
        super().validate(layer, tensors)  # type: ignore[misc]  # W8A8_DYNAMIC's, next in the MRO
        for name, dim in self.PACKED_OUTPUTS:
            self.check_packable(name, tensors[name].shape[dim])


@register_scheme("W4A8_DYNAMIC", "linear")
class W4A8DynamicLinear(_W4A8Dynamic, W8A8DynamicLinear):
    """W8A8_DYNAMIC's math with symmetric int4 weights (``scale = max|w_row| / 7``)."""

    PACKED_OUTPUTS = (("weight", 0),)

    def runtime_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """``[out, in]`` int4-in-int8 → packed int32 ``[in, out/8]`` in the device's weight format."""
        return weight_format(pack_int4_last(weight.t()))


@register_scheme("W4A8_DYNAMIC", "moe")
class W4A8DynamicMoE(_W4A8Dynamic, W8A8DynamicMoE):
    """W8A8_DYNAMIC experts with symmetric int4 weights, packed along each expert's output dimension."""

    PACKED_OUTPUTS = (("w13_weight", 1), ("w2_weight", 1))

    def runtime_weight(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        """``[E, out, in]`` int4-in-int8 → packed int32 ``[E, in, out/8]`` in the device's weight format."""
        return weight_format(pack_int4_last(weight.transpose(1, 2)))
