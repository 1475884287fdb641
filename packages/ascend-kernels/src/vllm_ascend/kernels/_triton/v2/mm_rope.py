"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.mm_rope`.

One program per vector core walks the requests grid-stride, each request's tokens in tiles, all
position rows per tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


@triton.jit
def _rope_positions_kernel(
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
    num_reqs,
    NUM_DIMS: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for b in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + b).to(tl.int64)
        computed = tl.load(num_computed_tokens_ptr + state)
        is_prefill = computed < tl.load(prefill_lens_ptr + state)
        delta = tl.load(prefill_delta_ptr + state)
        start = tl.load(query_start_loc_ptr + b)
        query_len = tl.load(query_start_loc_ptr + b + 1) - start
        staged = prefill_positions_ptr + state * prefill_positions_stride0
        for i in range(0, query_len, TILE):
            offs = i + tl.arange(0, TILE)
            mask = offs < query_len
            orig = computed + offs
            for j in tl.static_range(NUM_DIMS):
                if is_prefill:
                    pos = tl.load(staged + j * prefill_positions_stride1 + orig, mask=mask).to(tl.int64)
                else:
                    pos = (orig + delta).to(tl.int64)
                tl.store(positions_ptr + j * positions_stride + start + offs, pos, mask=mask)


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
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = positions_ptr.device
    programs = _geometry.programs(device, num_reqs)
    _rope_positions_kernel[(programs,)](
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
        num_reqs,
        NUM_DIMS=NUM_DIMS,
        TILE=min(next_power_of_2(BLOCK_SIZE), ub_cap(device, 4 if IS_INTERPRETED else 4096, 2)),
    )
