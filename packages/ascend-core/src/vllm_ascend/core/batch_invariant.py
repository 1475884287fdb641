"""Batch-invariant mode: the same row gives bitwise the same result whatever the batch size.

Library reductions may split a row differently depending on how many rows there are (thread
partitioning on CPU, tiling on NPU), which changes float rounding. In batch-invariant mode the
reference reductions below are used instead: a row is reduced with a fixed sequence of
element-wise adds (fixed-width chunks, then a fixed pairwise tree), which depends only on the row
length. RL rollouts and numerical alignment need this.
"""

from __future__ import annotations

import os

import torch

from vllm_ascend.core import envs

CHUNK = 64
# Variables that make the NPU collectives and vLLM itself deterministic.
INVARIANCE_ENV = {"HCCL_DETERMINISTIC": "true", "LCCL_DETERMINISTIC": "1", "VLLM_BATCH_INVARIANT": "1"}

_enabled: bool | None = None


def enable_batch_invariant_mode() -> None:
    global _enabled
    _enabled = True


def disable_batch_invariant_mode() -> None:
    global _enabled
    _enabled = False


def is_batch_invariant() -> bool:
    """Explicitly enabled/disabled in this process, else ``VLLM_ASCEND_BATCH_INVARIANT``."""
    return envs.VLLM_ASCEND_BATCH_INVARIANT if _enabled is None else _enabled


def override_envs_for_invariance(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set the determinism variables (in ``os.environ`` by default); returns the previous values."""
    target = os.environ if environ is None else environ
    previous = {k: target[k] for k in INVARIANCE_ENV if k in target}
    target.update(INVARIANCE_ENV)
    return previous


def init_batch_invariance(enabled: bool | None = None) -> bool:
    """Resolve the mode (argument, else the environment) and, when on, set the determinism variables."""
    if enabled is not None:
        (enable_batch_invariant_mode if enabled else disable_batch_invariant_mode)()
    active = is_batch_invariant()
    if active:
        override_envs_for_invariance()
    return active


def reduce_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Sum along ``dim`` with a summation order that depends only on ``x.shape[dim]``.

    Accumulates in float32 for half types; the result has ``x``'s dtype.
    """
    acc_dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    moved = x.movedim(dim, -1).to(acc_dtype)
    n = moved.shape[-1]
    padded_len = -(-max(n, 1) // CHUNK) * CHUNK
    if padded_len != n:
        moved = torch.nn.functional.pad(moved, (0, padded_len - n))
    chunks = moved.reshape(*moved.shape[:-1], padded_len // CHUNK, CHUNK)
    acc = chunks[..., 0, :].clone()
    for i in range(1, chunks.shape[-2]):
        acc = acc + chunks[..., i, :]
    width = CHUNK
    while width > 1:
        width //= 2
        acc = acc[..., :width] + acc[..., width : 2 * width]
    out = acc[..., 0].to(x.dtype)
    return out.unsqueeze(dim if dim >= 0 else x.dim() + dim) if keepdim else out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x², -1) + eps) * weight`` with the batch-invariant reduction."""
    xf = x.float()
    mean_sq = reduce_sum(xf * xf, dim=-1, keepdim=True) / x.shape[-1]
    return (xf * torch.rsqrt(mean_sq + eps)).to(x.dtype) * weight


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``: the fused AddRmsNorm, composed so it stays invariant."""
    summed = x + residual
    return rms_norm(summed, weight, eps), summed
