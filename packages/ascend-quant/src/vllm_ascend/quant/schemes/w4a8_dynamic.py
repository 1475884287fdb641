"""W4A8_DYNAMIC: int4 per-channel symmetric weights (packed 8 per int32 in memory), int8 per-token activations.

The checkpoint holds the int4 values unpacked, one per int8 byte; they are packed along the output
dimension after the transpose, so a layer keeps 1/8 of the bytes of its fp32 weight. Per channel only:
a per-group export (``group_size > 0``) is refused. Linear and MoE.
"""

from __future__ import annotations

import torch

from vllm_ascend.quant.errors import QuantLoadError
from vllm_ascend.quant.schemes.base import INT4_RANGE, pack_int4_last, weight_format
from vllm_ascend.quant.schemes.registry import register_scheme
from vllm_ascend.quant.schemes.w8a8_dynamic import W8A8DynamicLinear, W8A8DynamicMoE


def _refuse_groups(prefix: str, group_size: int | None) -> None:
    if group_size:
        raise QuantLoadError(
            f"layer {prefix!r}: W4A8_DYNAMIC with group_size={group_size} (per-group int4 weights) is not "
            "supported; supported: per-channel W4A8_DYNAMIC (group_size 0 or absent)"
        )


@register_scheme("W4A8_DYNAMIC", "linear")
class W4A8DynamicLinear(W8A8DynamicLinear):
    """W8A8_DYNAMIC's math with symmetric int4 weights (``scale = max|w_row| / 7``)."""

    WEIGHT_RANGE = INT4_RANGE

    def __init__(self, *, prefix: str, group_size: int | None, params_dtype: torch.dtype) -> None:
        super().__init__(prefix=prefix, group_size=group_size, params_dtype=params_dtype)
        _refuse_groups(prefix, group_size)

    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """W8A8_DYNAMIC's checks with int4 values, and an output size that packs into int32."""
        super().validate(layer, tensors)
        self.check_packable("weight", tensors["weight"].shape[0])

    def runtime_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """``[out, in]`` int4-in-int8 → packed int32 ``[in, out/8]`` in the device's weight format."""
        return weight_format(pack_int4_last(weight.t()))


@register_scheme("W4A8_DYNAMIC", "moe")
class W4A8DynamicMoE(W8A8DynamicMoE):
    """W8A8_DYNAMIC experts with symmetric int4 weights, packed along each expert's output dimension."""

    WEIGHT_RANGE = INT4_RANGE

    def __init__(self, *, prefix: str, group_size: int | None, params_dtype: torch.dtype) -> None:
        super().__init__(prefix=prefix, group_size=group_size, params_dtype=params_dtype)
        _refuse_groups(prefix, group_size)

    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """W8A8_DYNAMIC's checks with int4 values, and output sizes (2I and H) that pack into int32."""
        super().validate(layer, tensors)
        for name in ("w13_weight", "w2_weight"):
            self.check_packable(name, tensors[name].shape[1])

    def runtime_weight(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        """``[E, out, in]`` int4-in-int8 → packed int32 ``[E, in, out/8]`` in the device's weight format."""
        return weight_format(pack_int4_last(weight.transpose(1, 2)))
