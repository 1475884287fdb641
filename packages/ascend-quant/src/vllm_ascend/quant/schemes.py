"""Quantization schemes in plain PyTorch, keyed by the scheme names of :mod:`.description`.

``W8A8DynamicLinear`` is ModelSlim's W8A8_DYNAMIC for linear layers: int8 weights with a
per-output-channel scale (and integer offset), activations quantized per token at run time,
an int32 accumulation, then dequantization with both scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT8_MAX = 127


@dataclass(frozen=True)
class ParamSpec:
    """Shape and dtype of one checkpoint tensor that a scheme expects."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization of each row of ``x``: returns (int8 values, float32 scale [rows, 1])."""
    if not x.is_floating_point():
        raise TypeError(f"activations must be floating point, got {x.dtype}")
    x32 = x.to(torch.float32)
    scale = x32.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / INT8_MAX
    q = torch.round(x32 / scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


class W8A8DynamicLinear:
    """W8A8_DYNAMIC linear scheme: ``y = dequant(int32(q(x) @ (q(W) - offset)^T)) + bias``."""

    name = "linear:W8A8_DYNAMIC"

    @staticmethod
    def weight_specs(output_size: int, input_size: int) -> dict[str, ParamSpec]:
        """Checkpoint tensors of one layer as ModelSlim writes them."""
        if output_size <= 0 or input_size <= 0:
            raise ValueError(f"output_size and input_size must be positive, got {output_size}, {input_size}")
        return {
            "weight": ParamSpec((output_size, input_size), torch.int8),
            "weight_scale": ParamSpec((output_size, 1), torch.float32),
            "weight_offset": ParamSpec((output_size, 1), torch.float32),
        }

    @staticmethod
    def quantize_weight(weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-output-channel symmetric int8 quantization of a float ``[out, in]`` weight."""
        if weight.dim() != 2 or not weight.is_floating_point():
            raise ValueError(
                f"weight must be a 2-D floating-point tensor, got {tuple(weight.shape)} {weight.dtype}"
            )
        q, scale = quantize_per_token(weight)
        return {"weight": q, "weight_scale": scale, "weight_offset": torch.zeros_like(scale)}

    @staticmethod
    def check_weights(weight: torch.Tensor, weight_scale: torch.Tensor, weight_offset: torch.Tensor) -> None:
        """Raise a clear error when the loaded tensors do not form a W8A8_DYNAMIC layer."""
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise ValueError(f"weight must be a 2-D int8 tensor, got {tuple(weight.shape)} {weight.dtype}")
        rows = weight.shape[0]
        for name, t in (("weight_scale", weight_scale), ("weight_offset", weight_offset)):
            if t.numel() != rows:
                raise ValueError(
                    f"{name} must hold one value per output channel ({rows}), got shape {tuple(t.shape)}"
                )
        if not torch.equal(weight_offset, torch.round(weight_offset)):
            raise ValueError("weight_offset must hold integer values (ModelSlim stores them as floats)")

    @classmethod
    def apply(
        cls,
        x: torch.Tensor,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_offset: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x [..., in]`` (float) → ``[..., out]`` in ``x.dtype``."""
        cls.check_weights(weight, weight_scale, weight_offset)
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(f"input has {x.shape[-1]} features, weight expects {weight.shape[1]}")
        lead = x.shape[:-1]
        xq, x_scale = quantize_per_token(x.reshape(-1, x.shape[-1]))
        xq32 = xq.to(torch.int32)
        acc = xq32 @ weight.to(torch.int32).t()
        offset = weight_offset.reshape(1, -1).to(torch.int32)
        acc -= xq32.sum(dim=-1, keepdim=True) * offset
        out = acc.to(torch.float32) * x_scale * weight_scale.reshape(1, -1).to(torch.float32)
        if bias is not None:
            out += bias.to(torch.float32)
        return out.to(x.dtype).reshape(*lead, weight.shape[0])


SCHEMES: dict[str, type[W8A8DynamicLinear]] = {W8A8DynamicLinear.name: W8A8DynamicLinear}


def get_scheme(name: str) -> type[W8A8DynamicLinear]:
    """The implementation of scheme ``name`` (as returned by ``QuantDescription.scheme_for``)."""
    try:
        return SCHEMES[name]
    except KeyError:
        raise KeyError(
            f"scheme {name!r} has no implementation in vllm-ascend-quant; implemented: {', '.join(SCHEMES)}"
        ) from None
