"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.model_states_recoverssm`.

One program per vector core handles a grid-stride share of the spec-decode rows, a tile at a time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED
from vllm_ascend.kernels.v2._launch import Grid, cdiv, grid_dim


@triton.jit
def _align_kernel(
    idx_mapping_ptr,
    num_sampled_ptr,
    request_indices_ptr,
    num_computed_ptr,
    state_idx_ptr,
    num_accepted_ptr,
    num_spec,
    HAS_REQUEST_INDICES: tl.constexpr,
    MAMBA_BLOCK_SIZE: tl.constexpr,
    BLOCK_TABLE_WIDTH: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for start in range(pid * TILE, num_spec, programs * TILE):
        rows = start + tl.arange(0, TILE)
        in_batch = rows < num_spec
        if HAS_REQUEST_INDICES:
            batch = tl.load(request_indices_ptr + rows, mask=in_batch, other=0)
        else:
            batch = rows
        state = tl.load(idx_mapping_ptr + batch, mask=in_batch, other=-1)
        live = in_batch & (state >= 0)
        sampled = tl.load(num_sampled_ptr + batch, mask=live, other=0)
        computed = tl.load(num_computed_ptr + batch, mask=live, other=0)
        column = tl.minimum(tl.maximum(computed + sampled - 1, 0) // MAMBA_BLOCK_SIZE, BLOCK_TABLE_WIDTH - 1)
        target = tl.where(live, state, 0)
        tl.store(state_idx_ptr + target, column.to(state_idx_ptr.dtype.element_ty), mask=live)
        one = tl.full([TILE], 1, num_accepted_ptr.dtype.element_ty)
        tl.store(num_accepted_ptr + target, one, mask=live)


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
    num_spec = grid_dim(grid, 0)
    if num_spec == 0:
        return
    if HAS_REQUEST_INDICES is None:
        HAS_REQUEST_INDICES = request_indices_ptr is not None
    device = state_idx_ptr.device
    tile = 4 if IS_INTERPRETED else 256
    programs = _geometry.programs(device, cdiv(num_spec, tile))
    _align_kernel[(programs,)](
        idx_mapping_ptr,
        num_sampled_ptr,
        request_indices_ptr if HAS_REQUEST_INDICES else idx_mapping_ptr,
        num_computed_ptr,
        state_idx_ptr,
        num_accepted_ptr,
        num_spec,
        HAS_REQUEST_INDICES=bool(HAS_REQUEST_INDICES),
        MAMBA_BLOCK_SIZE=MAMBA_BLOCK_SIZE,
        BLOCK_TABLE_WIDTH=BLOCK_TABLE_WIDTH,
        TILE=tile,
    )
