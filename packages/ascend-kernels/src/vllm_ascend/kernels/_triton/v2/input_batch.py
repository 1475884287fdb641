"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.input_batch`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import geometry
from vllm_ascend.kernels.v2._launch import Grid, grid_dim


@triton.jit
def _pos_seq_lens_kernel(
    pos_ptr,
    seq_lens_ptr,
    idx_mapping_ptr,
    query_start_loc_ptr,
    num_computed_tokens_ptr,
    num_reqs,
    max_num_reqs,
    BLOCK: tl.constexpr,
):
    # One program per vector core, each walking the requests ``pid, pid + programs, ...``; the last
    # program also zeroes the padded sequence lengths.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + req)
        computed = tl.load(num_computed_tokens_ptr + state)
        start = tl.load(query_start_loc_ptr + req)
        query_len = tl.load(query_start_loc_ptr + req + 1) - start
        tl.store(seq_lens_ptr + req, computed + query_len)
        for i in range(0, query_len, BLOCK):
            offs = i + tl.arange(0, BLOCK)
            tl.store(pos_ptr + start + offs, computed + offs, mask=offs < query_len)
    if pid == programs - 1:
        for i in range(num_reqs, max_num_reqs, BLOCK):
            offs = i + tl.arange(0, BLOCK)
            tl.store(seq_lens_ptr + offs, tl.zeros([BLOCK], dtype=tl.int32), mask=offs < max_num_reqs)


def prepare_pos_seq_lens(
    grid: Grid,
    pos_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0) - 1
    programs = max(1, min(num_reqs, geometry(pos_ptr.device).persistent_programs()))
    _pos_seq_lens_kernel[(programs,)](
        pos_ptr,
        seq_lens_ptr,
        idx_mapping_ptr,
        query_start_loc_ptr,
        num_computed_tokens_ptr,
        num_reqs,
        max_num_reqs,
        BLOCK=min(BLOCK_SIZE, 256),
    )
