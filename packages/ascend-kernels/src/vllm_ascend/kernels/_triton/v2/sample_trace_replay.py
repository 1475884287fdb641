"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_trace_replay`.

One program per vector core replays a grid-stride share of the requests, a tile at a time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED
from vllm_ascend.kernels.v2._launch import Grid, cdiv, grid_dim


@triton.jit
def _replay_kernel(
    sampled_ptr,
    idx_mapping_ptr,
    trace_token_ids_ptr,
    trace_token_ids_stride,
    trace_len_ptr,
    total_len_ptr,
    prompt_len_ptr,
    num_reqs,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for start in range(pid * TILE, num_reqs, programs * TILE):
        rows = start + tl.arange(0, TILE)
        state = tl.load(idx_mapping_ptr + rows, mask=rows < num_reqs, other=-1).to(tl.int64)
        live = state >= 0
        safe = tl.where(live, state, 0)
        trace_len = tl.load(trace_len_ptr + safe, mask=live, other=0)
        step = tl.load(total_len_ptr + safe, mask=live, other=0) - tl.load(
            prompt_len_ptr + safe, mask=live, other=0
        )
        replay = live & (trace_len > 0) & (step >= 0) & (step < trace_len)
        token = tl.load(trace_token_ids_ptr + safe * trace_token_ids_stride + step, mask=replay, other=0)
        tl.store(sampled_ptr + rows, token.to(sampled_ptr.dtype.element_ty), mask=replay)


def trace_replay(
    grid: Grid,
    sampled_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    trace_token_ids_ptr: torch.Tensor,
    trace_token_ids_stride: int,
    trace_len_ptr: torch.Tensor,
    total_len_ptr: torch.Tensor,
    prompt_len_ptr: torch.Tensor,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    tile = 4 if IS_INTERPRETED else 256
    programs = _geometry.programs(sampled_ptr.device, cdiv(num_reqs, tile))
    _replay_kernel[(programs,)](
        sampled_ptr,
        idx_mapping_ptr,
        trace_token_ids_ptr,
        trace_token_ids_stride,
        trace_len_ptr,
        total_len_ptr,
        prompt_len_ptr,
        num_reqs,
        TILE=tile,
    )
