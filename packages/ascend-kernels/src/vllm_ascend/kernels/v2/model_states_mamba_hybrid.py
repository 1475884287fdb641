"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/model_states/mamba_hybrid.py`` (the per-request
accepted-token counts of hybrid Mamba models)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.model_states.mamba_hybrid"


def scatter_num_accepted_torch(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_accepted_ptr: torch.Tensor,
) -> None:
    """Reference of :func:`scatter_num_accepted`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    states = idx_mapping_ptr[:num_reqs].long()
    live = states >= 0
    values = num_sampled_ptr[:num_reqs].clamp_min(1)
    num_accepted_ptr[states[live]] = values[live].to(num_accepted_ptr.dtype)


def scatter_num_accepted(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_accepted_ptr: torch.Tensor,
) -> None:
    """``num_accepted[idx_mapping[b]] = max(num_sampled[b], 1)`` for ``b < grid[0]``, in place; rows
    whose ``idx_mapping`` is negative are skipped."""
    impl = dispatch_v2(
        "model_states_mamba_hybrid",
        "scatter_num_accepted",
        scatter_num_accepted_torch,
        num_accepted_ptr.device,
    )
    impl(grid, idx_mapping_ptr, num_sampled_ptr, num_accepted_ptr)


def fill_num_accepted_torch(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_accepted_ptr: torch.Tensor,
    num_sampled: int,
) -> None:
    """Reference of :func:`fill_num_accepted`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    states = idx_mapping_ptr[:num_reqs].long()
    num_accepted_ptr[states[states >= 0]] = num_sampled


def fill_num_accepted(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_accepted_ptr: torch.Tensor,
    num_sampled: int,
) -> None:
    """``num_accepted[idx_mapping[b]] = num_sampled`` (a scalar) for ``b < grid[0]``, in place; rows
    whose ``idx_mapping`` is negative are skipped."""
    impl = dispatch_v2(
        "model_states_mamba_hybrid", "fill_num_accepted", fill_num_accepted_torch, num_accepted_ptr.device
    )
    impl(grid, idx_mapping_ptr, num_accepted_ptr, num_sampled)


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._scatter_num_accepted_kernel": scatter_num_accepted,
    f"{_VLLM}._fill_num_accepted_kernel": fill_num_accepted,
}
