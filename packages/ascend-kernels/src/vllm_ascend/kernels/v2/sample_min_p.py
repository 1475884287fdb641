"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/min_p.py`` (min-p filtering)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.min_p"


def min_p_torch(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    min_p_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`min_p`."""
    num_tokens = grid_dim(grid, 0)
    if num_tokens == 0 or vocab_size <= 0:
        return
    min_p = min_p_ptr[expanded_idx_mapping_ptr[:num_tokens].long()].float()
    active = (min_p != 0.0).nonzero().flatten()
    if active.numel() == 0:
        return
    logits = logits_ptr.as_strided((num_tokens, vocab_size), (logits_stride, 1), logits_ptr.storage_offset())
    rows = logits[active]
    # NaN is no maximum (Triton's max ignores it); a NaN logit itself is kept (NaN < t is false).
    row_max = rows.float().masked_fill(rows.isnan(), float("-inf")).amax(dim=-1, keepdim=True)
    threshold = row_max + torch.log(min_p[active, None])
    logits[active] = rows.masked_fill(rows.float() < threshold, float("-inf"))


def min_p(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    min_p_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Min-p filtering in place: for each token ``t < grid[0]`` whose request has ``min_p != 0``, the
    logits below ``max(logits[t]) + log(min_p)`` (float32) become ``-inf``."""
    impl = dispatch_v2("sample_min_p", "min_p", min_p_torch, logits_ptr.device)
    impl(grid, logits_ptr, logits_stride, expanded_idx_mapping_ptr, min_p_ptr, vocab_size, BLOCK_SIZE)


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._min_p_kernel": min_p,
}
