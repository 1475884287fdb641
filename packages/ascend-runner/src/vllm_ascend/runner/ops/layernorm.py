"""RMSNorm (with the fused residual add) through the device ops ``torch.ops.vllm_ascend.*``."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.layernorm import RMSNorm

from vllm_ascend.kernels.device.graph_ops import device_ops


class AscendRMSNorm(RMSNorm):
    """The adaptor's ``rms_norm`` / ``add_rms_norm``, called as the custom ops ``torch.ops.vllm_ascend.*``."""

    def forward_oot(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.variance_size_override is not None:
            # Variance over a prefix of the hidden dim has no device op: use vLLM's native path.
            return self.forward_native(x, residual)
        # Without a learned weight RMSNorm keeps a plain ones tensor (not moved with the module).
        weight = self.weight.data if self.has_weight else self.weight.to(device=x.device, dtype=x.dtype)
        ops = device_ops()
        if residual is None:
            return ops.rms_norm(x, weight, self.variance_epsilon)
        return ops.add_rms_norm(x, residual, weight, self.variance_epsilon)
