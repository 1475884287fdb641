"""Per-request temperature scaling of logits."""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch


def apply_temperature_torch(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Reference of :func:`apply_temperature`."""
    t = temperature.to(torch.float32).unsqueeze(1)
    scaled = logits.to(torch.float32) / torch.where(t > 0, t, torch.ones_like(t))
    logits.copy_(scaled.to(logits.dtype))
    return logits


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Divide each row of ``logits`` by its temperature, in place.

    ``logits``: ``[B, V]`` float32/bfloat16/float16, row-contiguous (last-dim stride 1).
    ``temperature``: ``[B]`` float32. Rows with ``temperature <= 0`` (greedy) are left unchanged.
    The division is done in float32 and rounded once to ``logits.dtype``. Returns ``logits``.
    """
    return dispatch("temperature", "apply_temperature", apply_temperature_torch, logits.device)(
        logits, temperature
    )
