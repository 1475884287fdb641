"""W8A16: weight-only int8 with an asymmetric per-channel or per-group scale and zero point.

``W = (Wq - weight_offset) * weight_scale`` (per group: column block ``j`` of the weight uses column ``j``
of scale/offset, blocks of the description's ``group_size``), ``y = x @ W^T`` in fp32, in ``x``'s dtype.
"""

from __future__ import annotations

import torch

from vllm_ascend.quant.schemes.base import INT8_RANGE, AscendLinearScheme, TensorSpec, adaptor, weight_format
from vllm_ascend.quant.schemes.registry import register_scheme


@register_scheme("W8A16", "linear")
class W8A16Linear(AscendLinearScheme):
    """Weight-only int8; activations stay float."""

    WEIGHT_RANGE: tuple[int, int] = INT8_RANGE

    @property
    def per_group(self) -> bool:
        return bool(self.group_size)

    def weight_specs(self, output_size: int, input_size: int) -> dict[str, TensorSpec]:
        """``weight`` int8 ``[out, in]``; scale/offset ``[out, 1]`` per channel or ``[out, in/group_size]``."""
        self.check_sizes(output_size=output_size, input_size=input_size)
        if self.per_group:
            g = int(self.group_size or 0)
            if input_size % g:
                raise self.error(
                    "weight",
                    f"input features divisible by group_size={g} (per-group scales)",
                    f"{input_size}",
                )
            param = TensorSpec((output_size, input_size // g), torch.float32, "group")
        else:
            param = TensorSpec((output_size, 1), torch.float32, "channel")
        return {
            "weight": TensorSpec((output_size, input_size), torch.int8, "weight"),
            "weight_scale": param,
            "weight_offset": param,
        }

    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """Weight values in range, finite scales, integer zero points in the weight's range."""
        self.check_range("weight", tensors["weight"], *self.WEIGHT_RANGE, "quantized values")
        self.check_finite("weight_scale", tensors["weight_scale"])
        self.check_integral("weight_offset", tensors["weight_offset"], *self.WEIGHT_RANGE)

    def runtime_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """``[out, in]`` int8 → ``[in, out]`` in the device's weight format."""
        return weight_format(weight.t())

    def runtime(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``weight [in, out]``; ``weight_scale`` and ``antiquant_offset`` (= -offset) fp32 ``[out]`` or ``[G, out]``."""

        def layout(t: torch.Tensor) -> torch.Tensor:
            t = t.float()
            return t.t().contiguous() if self.per_group else t.reshape(-1).contiguous()

        return {
            "weight": self.runtime_weight(tensors["weight"]),
            "weight_scale": layout(tensors["weight_scale"]),
            "antiquant_offset": layout(-tensors["weight_offset"]),
        }

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Dequantise-and-multiply in the adaptor's weight-only matmul."""
        out_features = layer.weight_scale.shape[-1]
        y = adaptor().weight_quant_matmul(
            x.reshape(-1, x.shape[-1]),
            layer.weight,
            layer.weight_scale,
            antiquant_offset=layer.antiquant_offset,
            bias=bias,
            group_size=int(self.group_size or 0),
        )
        return y.reshape(*x.shape[:-1], out_features)
