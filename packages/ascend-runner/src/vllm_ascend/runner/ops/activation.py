"""SiluAndMul (SwiGLU) through the device op ``torch.ops.vllm_ascend.swiglu``."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.activation import SiluAndMul

from vllm_ascend.kernels.device.graph_ops import device_ops


class AscendSiluAndMul(SiluAndMul):
    """``silu(x[..., :d]) * x[..., d:]`` by the adaptor's ``swiglu`` (one ``vllm_ascend::swiglu`` node)."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        return device_ops().swiglu(x)
