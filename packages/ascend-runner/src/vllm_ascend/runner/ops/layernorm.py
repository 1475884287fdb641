"""RMSNorm (with the fused residual add) through the device adaptor."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.layernorm import RMSNorm

from vllm_ascend.core.device.config import get_device_adaptor


class AscendRMSNorm(RMSNorm):
    """``rms_norm`` / ``add_rms_norm`` of the device adaptor (``npu_rms_norm`` / ``npu_add_rms_norm``)."""

    def forward_oot(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.variance_size_override is not None:
            # Variance over a prefix of the hidden dim has no device op: use vLLM's native path.
            return self.forward_native(x, residual)
        # Without a learned weight RMSNorm keeps a plain ones tensor (not moved with the module).
        weight = self.weight.data if self.has_weight else self.weight.to(device=x.device, dtype=x.dtype)
        adaptor = get_device_adaptor()
        if residual is None:
            return adaptor.rms_norm(x, weight, self.variance_epsilon)
        return adaptor.add_rms_norm(x, residual, weight, self.variance_epsilon)
