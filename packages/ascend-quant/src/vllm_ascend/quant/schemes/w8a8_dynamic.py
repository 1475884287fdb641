"""W8A8_DYNAMIC: int8 per-channel symmetric weights, int8 per-token dynamic activations (linear and MoE).

``y = int32(xq @ Wq^T) * weight_scale * x_scale`` with ``x_scale = max|x_row| / 127``. The MoE variant
runs the experts as: route → per-token int8 → gate/up grouped matmul + swiglu + int8 requant → down
grouped matmul → weighted sum over the top-k experts.
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels.device.graph_ops import device_ops
from vllm_ascend.quant.schemes.base import (
    INT8_RANGE,
    AscendLinearScheme,
    AscendMoEScheme,
    TensorSpec,
    adaptor,
    weight_format,
)
from vllm_ascend.quant.schemes.registry import register_scheme


@register_scheme("W8A8_DYNAMIC", "linear")
class W8A8DynamicLinear(AscendLinearScheme):
    """Per-channel symmetric int8 weight; activations quantized per token at run time."""

    WEIGHT_RANGE: tuple[int, int] = INT8_RANGE

    def weight_specs(self, output_size: int, input_size: int) -> dict[str, TensorSpec]:
        """``weight`` int8 ``[out, in]``, ``weight_scale`` / ``weight_offset`` (all 0) float ``[out, 1]``."""
        self.check_sizes(output_size=output_size, input_size=input_size)
        return {
            "weight": TensorSpec((output_size, input_size), torch.int8, "weight"),
            "weight_scale": TensorSpec((output_size, 1), torch.float32, "channel"),
            "weight_offset": TensorSpec((output_size, 1), torch.float32, "channel"),
        }

    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """Symmetric: offsets all 0; finite scales; weight values in the scheme's integer range."""
        self.check_range("weight", tensors["weight"], *self.WEIGHT_RANGE, "quantized values")
        self.check_zero("weight_offset", tensors["weight_offset"])
        self.check_finite("weight_scale", tensors["weight_scale"])

    def runtime_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """``[out, in]`` int8 → ``[in, out]`` in the device's weight format."""
        return weight_format(weight.t())

    def runtime(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``weight [in, out]`` and ``weight_scale`` fp32 ``[out]``."""
        return {
            "weight": self.runtime_weight(tensors["weight"]),
            "weight_scale": tensors["weight_scale"].reshape(-1).float().contiguous(),
        }

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-token int8 activations, int32 matmul, dequant by both scales, plus the float bias."""
        ops = device_ops()
        out_features = layer.weight_scale.numel()
        xq, x_scale = ops.dynamic_quant(x.reshape(-1, x.shape[-1]))
        y = ops.quant_matmul(
            xq, layer.weight, layer.weight_scale, pertoken_scale=x_scale, bias=bias, output_dtype=x.dtype
        )
        return y.reshape(*x.shape[:-1], out_features)


@register_scheme("W8A8_DYNAMIC", "moe")
class W8A8DynamicMoE(AscendMoEScheme):
    """Experts with per-channel symmetric int8 weights; per-token int8 activations before each matmul."""

    WEIGHT_RANGE: tuple[int, int] = INT8_RANGE

    def weight_specs(
        self, num_experts: int, hidden_size: int, intermediate_size: int
    ) -> dict[str, TensorSpec]:
        """``w13`` (gate rows then up rows) ``[E, 2I, H]``, ``w2`` ``[E, H, I]`` int8; scales/offsets ``[E, out, 1]``."""
        self.check_sizes(
            num_experts=num_experts, hidden_size=hidden_size, intermediate_size=intermediate_size
        )
        e, h, i2 = num_experts, hidden_size, 2 * intermediate_size
        return {
            "w13_weight": TensorSpec((e, i2, h), torch.int8, "expert_weight"),
            "w2_weight": TensorSpec((e, h, intermediate_size), torch.int8, "expert_weight"),
            "w13_weight_scale": TensorSpec((e, i2, 1), torch.float32, "expert_channel"),
            "w13_weight_offset": TensorSpec((e, i2, 1), torch.float32, "expert_channel"),
            "w2_weight_scale": TensorSpec((e, h, 1), torch.float32, "expert_channel"),
            "w2_weight_offset": TensorSpec((e, h, 1), torch.float32, "expert_channel"),
        }

    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """Symmetric: offsets all 0; finite scales; weight values in the scheme's integer range."""
        for w in ("w13", "w2"):
            self.check_range(f"{w}_weight", tensors[f"{w}_weight"], *self.WEIGHT_RANGE, "quantized values")
            self.check_zero(f"{w}_weight_offset", tensors[f"{w}_weight_offset"])
            self.check_finite(f"{w}_weight_scale", tensors[f"{w}_weight_scale"])

    def runtime_weight(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        """``[E, out, in]`` int8 → ``[E, in, out]`` in the device's weight format."""
        return weight_format(weight.transpose(1, 2))

    def runtime(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``w13_weight [E, H, 2I]``, ``w2_weight [E, I, H]``, scales fp32 ``[E, out]``."""
        return {
            "w13_weight": self.runtime_weight("w13_weight", tensors["w13_weight"]),
            "w13_weight_scale": tensors["w13_weight_scale"].squeeze(-1).float().contiguous(),
            "w2_weight": self.runtime_weight("w2_weight", tensors["w2_weight"]),
            "w2_weight_scale": tensors["w2_weight_scale"].squeeze(-1).float().contiguous(),
        }

    def apply_experts(self, layer: torch.nn.Module, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Quantize per row, gate/up + swiglu + requant, down (fp32)."""
        ad = adaptor()
        xq, x_scale = device_ops().dynamic_quant(rows)
        hq, h_scale = ad.grouped_matmul_swiglu_quant(
            xq, layer.w13_weight, counts, layer.w13_weight_scale, x_scale, group_list_type="count"
        )
        return ad.grouped_quant_matmul(
            hq,
            layer.w2_weight,
            counts,
            layer.w2_weight_scale,
            h_scale,
            group_list_type="count",
            output_dtype=torch.float32,
        )
