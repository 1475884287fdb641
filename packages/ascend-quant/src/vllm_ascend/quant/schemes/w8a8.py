"""W8A8 (static): int8 per-channel symmetric weights, int8 activations with a calibrated per-tensor scale/offset.

``xq = clamp(round(x / input_scale) + input_offset, -128, 127)``; ``acc = int32(xq @ Wq^T) + quant_bias``;
``y = acc * deq_scale`` (+ the layer's float bias). ModelSlim folds the activation zero point into
``quant_bias`` and ``input_scale * weight_scale`` into ``deq_scale``. In a fused layer (qkv, gate_up)
every shard must carry the same ``input_scale`` / ``input_offset``: the shards share one quantized input.
"""

from __future__ import annotations

import torch

from vllm_ascend.core.sdk import get_current_hardware_profile
from vllm_ascend.kernels.device.graph_ops import device_ops
from vllm_ascend.quant.schemes.base import INT8_RANGE, AscendLinearScheme, TensorSpec, weight_format
from vllm_ascend.quant.schemes.registry import register_scheme

_LOW32 = 0xFFFFFFFF


def deq_scale_fp32(deq_scale: torch.Tensor) -> torch.Tensor:
    """``deq_scale`` as float32: int64 values carry the float32 bits in their low 32 bits (ModelSlim's int64 form)."""
    if deq_scale.dtype != torch.int64:
        return deq_scale.float()
    low = deq_scale & _LOW32
    signed = torch.where(low > 0x7FFFFFFF, low - (1 << 32), low)
    return signed.to(torch.int32).view(torch.float32)


@register_scheme("W8A8", "linear")
class W8A8Linear(AscendLinearScheme):
    """Static activation quantization (calibrated), per-channel symmetric int8 weights."""

    ROW_PARALLEL_UNSUPPORTED = (
        "its int32 quant_bias folds the activation offset over all input channels, so each rank would add it"
    )

    def weight_specs(self, output_size: int, input_size: int) -> dict[str, TensorSpec]:
        """ModelSlim's W8A8 tensors: weight, input scale/offset ([1] each), weight scale/offset, deq_scale, quant_bias."""
        self.check_sizes(output_size=output_size, input_size=input_size)
        out = output_size
        return {
            "weight": TensorSpec((out, input_size), torch.int8, "weight"),
            "input_scale": TensorSpec((1,), torch.float32, "tensor"),
            "input_offset": TensorSpec((1,), torch.float32, "tensor"),
            "weight_scale": TensorSpec((out, 1), torch.float32, "channel"),
            "weight_offset": TensorSpec((out, 1), torch.float32, "channel"),
            "deq_scale": TensorSpec((out,), torch.float32, "channel"),
            "quant_bias": TensorSpec((out,), torch.int32, "channel"),
        }

    def dtype_ok(self, name: str, t: torch.Tensor, spec: TensorSpec) -> bool:
        """``deq_scale`` may also be int64 (float32 bits in the low 32 bits)."""
        return (name == "deq_scale" and t.dtype == torch.int64) or super().dtype_ok(name, t, spec)

    def validate(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """The activation checks of :meth:`validate_activation`, and symmetric weights (offsets all 0)."""
        self.validate_activation(layer, tensors)
        self.check_zero("weight_offset", tensors["weight_offset"])

    def validate_activation(self, layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """Shared, positive input scale; shared integer input offset in int8 range; finite deq_scale.

        Leaves ``tensors`` normalised: input scale/offset as one fp32 value, ``deq_scale`` as fp32.
        """
        scale = self.check_shared(layer, "input_scale", tensors["input_scale"])
        self.check_finite("input_scale", scale)
        if float(scale) <= 0:
            raise self.error("input_scale", "a positive scale", f"{float(scale)}")
        offset = self.check_shared(layer, "input_offset", tensors["input_offset"])
        self.check_integral("input_offset", offset, *INT8_RANGE)
        tensors["input_scale"], tensors["input_offset"] = scale, offset
        tensors["deq_scale"] = deq_scale_fp32(tensors["deq_scale"])
        self.check_finite("deq_scale", tensors["deq_scale"])

    def runtime(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``weight [in, out]``, ``input_scale``/``input_offset`` fp32 ``[1]``, ``deq_scale`` fp32 and ``quant_bias`` int32 ``[out]``."""
        return {
            "weight": weight_format(tensors["weight"].t()),
            "input_scale": tensors["input_scale"],
            "input_offset": tensors["input_offset"],
            "deq_scale": tensors["deq_scale"].reshape(-1).contiguous(),
            "quant_bias": tensors["quant_bias"].reshape(-1).contiguous(),
        }

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Static int8 activations, int32 matmul with ``quant_bias`` in the accumulator, then ``deq_scale``.

        A float ``bias`` is added in fp32 where the device computes in fp32, else (310P: fp16 only, its
        quant matmul writes fp16) after the matmul in ``x``'s dtype.
        """
        ops = device_ops()
        out_features = layer.deq_scale.numel()
        xq = ops.quantize(x.reshape(-1, x.shape[-1]), layer.input_scale, layer.input_offset)
        fp32 = "float32" in get_current_hardware_profile().supported_dtypes
        out_dtype = torch.float32 if bias is not None and fp32 else x.dtype
        y = ops.quant_matmul(xq, layer.weight, layer.deq_scale, bias=layer.quant_bias, output_dtype=out_dtype)
        if bias is not None:
            y = (y + bias.to(y.dtype)).to(x.dtype)
        return y.reshape(*x.shape[:-1], out_features)
