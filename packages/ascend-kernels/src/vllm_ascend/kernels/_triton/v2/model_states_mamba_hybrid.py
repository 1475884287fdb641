"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.model_states_mamba_hybrid`.

One program per vector core scatters a grid-stride share of the requests, a tile at a time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED
from vllm_ascend.kernels.v2._launch import Grid, grid_dim


@triton.jit
def _scatter_kernel(
    idx_mapping_ptr,
    num_sampled_ptr,
    num_accepted_ptr,
    fill_value,
    num_reqs,
    FILL: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for start in range(pid * TILE, num_reqs, programs * TILE):
        rows = start + tl.arange(0, TILE)
        in_batch = rows < num_reqs
        state = tl.load(idx_mapping_ptr + rows, mask=in_batch, other=-1)
        live = in_batch & (state >= 0)
        if FILL:
            value = tl.zeros([TILE], dtype=tl.int32) + fill_value
        else:
            value = tl.maximum(tl.load(num_sampled_ptr + rows, mask=live, other=1), 1)
        tl.store(
            num_accepted_ptr + tl.where(live, state, 0),
            value.to(num_accepted_ptr.dtype.element_ty),
            mask=live,
        )


def _launch(
    idx_mapping_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_accepted_ptr: torch.Tensor,
    fill_value: int,
    num_reqs: int,
    fill: bool,
) -> None:
    device = num_accepted_ptr.device
    tile = 4 if IS_INTERPRETED else 256
    programs = _geometry.programs(device, -(-num_reqs // tile))
    _scatter_kernel[(programs,)](
        idx_mapping_ptr, num_sampled_ptr, num_accepted_ptr, fill_value, num_reqs, FILL=fill, TILE=tile
    )


def scatter_num_accepted(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_accepted_ptr: torch.Tensor,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs:
        _launch(idx_mapping_ptr, num_sampled_ptr, num_accepted_ptr, 0, num_reqs, False)


def fill_num_accepted(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_accepted_ptr: torch.Tensor,
    num_sampled: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs:
        _launch(idx_mapping_ptr, idx_mapping_ptr, num_accepted_ptr, num_sampled, num_reqs, True)
