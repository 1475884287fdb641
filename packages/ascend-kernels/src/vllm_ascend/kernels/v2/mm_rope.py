"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/mm/rope.py`` (multi-dimensional M-RoPE
positions of the scheduled tokens)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.mm.rope"


def prepare_rope_positions_torch(
    grid: Grid,
    positions_ptr: torch.Tensor,
    positions_stride: int,
    prefill_positions_ptr: torch.Tensor,
    prefill_positions_stride0: int,
    prefill_positions_stride1: int,
    prefill_delta_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    prefill_lens_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    BLOCK_SIZE: int,
    NUM_DIMS: int,
) -> None:
    """Reference of :func:`prepare_rope_positions`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = positions_ptr.device
    states = idx_mapping_ptr[:num_reqs].long()
    qsl = query_start_loc_ptr[: num_reqs + 1].long()
    query_lens = (qsl[1:] - qsl[:-1]).clamp_min(0)
    total = int(query_lens.sum())
    if total == 0:
        return
    owner = torch.repeat_interleave(torch.arange(num_reqs, device=device), query_lens)
    offset = torch.arange(total, device=device) - (torch.cumsum(query_lens, 0) - query_lens)[owner]
    state = states[owner]
    computed = num_computed_tokens_ptr[states].long()[owner]
    orig_pos = computed + offset
    is_prefill = (num_computed_tokens_ptr[states] < prefill_lens_ptr[states])[owner]
    delta = prefill_delta_ptr[states].long()[owner]
    dst = qsl[:-1][owner] + offset
    flat_positions = positions_ptr.as_strided((positions_ptr.numel(),), (1,), positions_ptr.storage_offset())
    flat_prefill = prefill_positions_ptr.as_strided(
        (prefill_positions_ptr.numel(),), (1,), prefill_positions_ptr.storage_offset()
    )
    prefill_rows = state * prefill_positions_stride0
    for j in range(NUM_DIMS):
        pos = orig_pos + delta
        if bool(is_prefill.any()):
            index = (prefill_rows + j * prefill_positions_stride1 + orig_pos)[is_prefill]
            pos[is_prefill] = flat_prefill[index].long()
        flat_positions[j * positions_stride + dst] = pos.to(positions_ptr.dtype)


def prepare_rope_positions(
    grid: Grid,
    positions_ptr: torch.Tensor,
    positions_stride: int,
    prefill_positions_ptr: torch.Tensor,
    prefill_positions_stride0: int,
    prefill_positions_stride1: int,
    prefill_delta_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    prefill_lens_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    BLOCK_SIZE: int,
    NUM_DIMS: int,
) -> None:
    """M-RoPE positions of the scheduled tokens, in place: token ``k`` of request ``b < grid[0]``
    (state ``s``, at ``query_start_loc[b] + k``) gets, in each of the ``NUM_DIMS`` rows of
    ``positions``, the staged prefill position ``prefill_positions[s, dim, num_computed + k]`` while the
    request is prefilling (``num_computed < prefill_len``; the whole query reads the staged row), else
    ``num_computed + k + prefill_delta[s]``."""
    impl = dispatch_v2(
        "mm_rope", "prepare_rope_positions", prepare_rope_positions_torch, positions_ptr.device
    )
    impl(
        grid,
        positions_ptr,
        positions_stride,
        prefill_positions_ptr,
        prefill_positions_stride0,
        prefill_positions_stride1,
        prefill_delta_ptr,
        idx_mapping_ptr,
        query_start_loc_ptr,
        prefill_lens_ptr,
        num_computed_tokens_ptr,
        BLOCK_SIZE,
        NUM_DIMS,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._prepare_rope_positions_kernel": prepare_rope_positions,
}
