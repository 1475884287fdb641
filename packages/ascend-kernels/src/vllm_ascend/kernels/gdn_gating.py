"""Fused gating of Gated DeltaNet layers: decay ``g`` and write strength ``beta``."""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch


def fused_gdn_gating_torch(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`fused_gdn_gating`."""
    x = a.to(torch.float32) + dt_bias.to(torch.float32)
    bx = softplus_beta * x
    soft = torch.where(bx <= softplus_threshold, torch.log1p(torch.exp(bx)) / softplus_beta, x)
    g = -torch.exp(A_log.to(torch.float32)) * soft
    beta = torch.sigmoid(b.to(torch.float32)).to(b.dtype)
    return g.unsqueeze(0), beta.unsqueeze(0)


def fused_gdn_gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``; not in place.

    ``A_log``, ``dt_bias``: ``[H]``; ``a``, ``b``: ``[T, H]`` (any float dtype, row-contiguous).
    ``softplus(x) = log(1 + exp(beta * x)) / beta`` where ``beta * x <= threshold``, else ``x``.
    Returns ``(g [1, T, H] float32, beta [1, T, H] in b's dtype)``.
    """
    impl = dispatch("gdn_gating", "fused_gdn_gating", fused_gdn_gating_torch, a.device)
    return impl(A_log, a, b, dt_bias, softplus_beta, softplus_threshold)
