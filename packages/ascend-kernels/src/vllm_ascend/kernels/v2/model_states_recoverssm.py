"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/model_states/recoverssm.py`` (the RecoverSSM
align-mode postprocess: running state column and accepted-count reset)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.model_states.recoverssm"


def postprocess_recoverssm_align_torch(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    request_indices_ptr: torch.Tensor | None,
    num_computed_ptr: torch.Tensor,
    state_idx_ptr: torch.Tensor,
    num_accepted_ptr: torch.Tensor,
    *,
    HAS_REQUEST_INDICES: bool | None = None,
    MAMBA_BLOCK_SIZE: int,
    BLOCK_TABLE_WIDTH: int,
) -> None:
    """Reference of :func:`postprocess_recoverssm_align`."""
    num_spec = grid_dim(grid, 0)
    if num_spec == 0:
        return
    if HAS_REQUEST_INDICES is None:
        HAS_REQUEST_INDICES = request_indices_ptr is not None
    device = state_idx_ptr.device
    if HAS_REQUEST_INDICES:
        assert request_indices_ptr is not None
        batch = request_indices_ptr[:num_spec].long()
    else:
        batch = torch.arange(num_spec, device=device)
    states = idx_mapping_ptr[batch].long()
    live = states >= 0
    batch, states = batch[live], states[live]
    last = (num_computed_ptr[batch].long() + num_sampled_ptr[batch].long() - 1).clamp_min(0)
    column = torch.clamp_max(last // MAMBA_BLOCK_SIZE, BLOCK_TABLE_WIDTH - 1)
    state_idx_ptr[states] = column.to(state_idx_ptr.dtype)
    num_accepted_ptr[states] = 1


def postprocess_recoverssm_align(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    request_indices_ptr: torch.Tensor | None,
    num_computed_ptr: torch.Tensor,
    state_idx_ptr: torch.Tensor,
    num_accepted_ptr: torch.Tensor,
    *,
    HAS_REQUEST_INDICES: bool | None = None,
    MAMBA_BLOCK_SIZE: int,
    BLOCK_TABLE_WIDTH: int,
) -> None:
    """For spec-decode row ``i < grid[0]`` (batch row ``b = request_indices[i]``, or ``i`` without
    request indices; state ``s = idx_mapping[b]``, skipped when negative):
    ``state_idx[s] = min(max(num_computed[b] + num_sampled[b] - 1, 0) // MAMBA_BLOCK_SIZE,
    BLOCK_TABLE_WIDTH - 1)`` and ``num_accepted[s] = 1``, in place. ``HAS_REQUEST_INDICES`` is vLLM's
    heuristic (``request_indices_ptr is not None``) when the launch does not pass it."""
    impl = dispatch_v2(
        "model_states_recoverssm",
        "postprocess_recoverssm_align",
        postprocess_recoverssm_align_torch,
        state_idx_ptr.device,
    )
    impl(
        grid,
        idx_mapping_ptr,
        num_sampled_ptr,
        request_indices_ptr,
        num_computed_ptr,
        state_idx_ptr,
        num_accepted_ptr,
        HAS_REQUEST_INDICES=HAS_REQUEST_INDICES,
        MAMBA_BLOCK_SIZE=MAMBA_BLOCK_SIZE,
        BLOCK_TABLE_WIDTH=BLOCK_TABLE_WIDTH,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._postprocess_recoverssm_align_kernel": postprocess_recoverssm_align,
}
