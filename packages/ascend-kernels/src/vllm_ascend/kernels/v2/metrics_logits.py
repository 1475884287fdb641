"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/metrics/logits.py`` (NaN counts of the logits)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.metrics.logits"


def num_nans_torch(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    num_nans_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`num_nans`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    width = max(vocab_size, 0)
    logits = logits_ptr.as_strided((num_reqs, width), (logits_stride, 1), logits_ptr.storage_offset())
    num_nans_ptr[:num_reqs] = torch.isnan(logits).sum(dim=-1).to(num_nans_ptr.dtype)


def num_nans(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    num_nans_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """``num_nans_ptr[r]`` = the number of NaNs among ``logits[r, :vocab_size]``, for ``r < grid[0]``."""
    impl = dispatch_v2("metrics_logits", "num_nans", num_nans_torch, logits_ptr.device)
    impl(grid, logits_ptr, logits_stride, num_nans_ptr, vocab_size, BLOCK_SIZE)


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._num_nans_kernel": num_nans,
}
