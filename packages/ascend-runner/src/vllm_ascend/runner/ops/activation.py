"""SiluAndMul (SwiGLU) through the device adaptor."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.activation import SiluAndMul

from vllm_ascend.core.device.config import get_device_adaptor


class AscendSiluAndMul(SiluAndMul):
    """``silu(x[..., :d]) * x[..., d:]`` by the adaptor's ``swiglu`` (``npu_swiglu``)."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        return get_device_adaptor().swiglu(x)
