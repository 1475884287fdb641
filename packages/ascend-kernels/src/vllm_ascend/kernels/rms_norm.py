"""Weight-free RMS normalization of the last dimension (``triton_q_rms``: the per-head query/key
norm of attention variants such as DeepSeek sparse attention).

``y = x / sqrt(mean(x**2) + eps)`` over the last dimension, in float32, rounded once to ``x``'s
dtype. The Triton path runs a fixed number of programs over tiles of ``BLOCK_M`` rows, with
``BLOCK_M`` a power of two up to 16 taken from the rows per program, so a serving step with any
token count hits one of five compiled variants (:func:`rms_block_m_values`), all of which
:func:`vllm_ascend.kernels.warmup.triton_rms_warmup` compiles ahead.
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch


def _check(hidden_state: torch.Tensor, eps: float) -> None:
    if hidden_state.dim() < 1 or hidden_state.shape[-1] == 0:
        raise ValueError(
            f"hidden_state must have a non-empty last dimension, got shape {tuple(hidden_state.shape)}"
        )
    if not hidden_state.dtype.is_floating_point:
        raise ValueError(f"hidden_state must be a floating-point tensor, got {hidden_state.dtype}")
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def triton_q_rms_torch(hidden_state: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Reference of :func:`triton_q_rms`."""
    x = hidden_state.to(torch.float32)
    return (x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)).to(hidden_state.dtype)


def triton_q_rms(hidden_state: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMS-normalize the last dimension of ``hidden_state`` (``[..., D]``, any float dtype), no
    weight; returns a new tensor of the same shape and dtype."""
    _check(hidden_state, eps)
    return dispatch("rms_norm", "triton_q_rms", triton_q_rms_torch, hidden_state.device)(hidden_state, eps)
