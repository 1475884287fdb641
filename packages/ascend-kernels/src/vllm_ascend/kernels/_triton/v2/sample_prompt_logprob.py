"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_prompt_logprob`: one program per
vector core walks the requests grid-stride, copying each one's next prompt tokens in tiles."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


@triton.jit
def _prompt_logprobs_token_ids_kernel(
    out_ptr,
    query_start_loc_ptr,
    idx_mapping_ptr,
    num_computed_tokens_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    num_reqs,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for i in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + i).to(tl.int64)
        start = tl.load(query_start_loc_ptr + i)
        query_len = tl.load(query_start_loc_ptr + i + 1) - start
        # The logprob of position p scores the token at p + 1.
        source = (
            all_token_ids_ptr + state * all_token_ids_stride + tl.load(num_computed_tokens_ptr + state) + 1
        )
        for j in range(0, query_len, TILE):
            offs = j + tl.arange(0, TILE)
            mask = offs < query_len
            tokens = tl.load(source + offs, mask=mask, other=0)
            tl.store(out_ptr + start + offs, tokens.to(out_ptr.dtype.element_ty), mask=mask)


def prompt_logprobs_token_ids(
    grid: Grid,
    prompt_logprobs_token_ids_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = all_token_ids_ptr.device
    programs = _geometry.programs(device, num_reqs)
    _prompt_logprobs_token_ids_kernel[(programs,)](
        prompt_logprobs_token_ids_ptr,
        query_start_loc_ptr,
        idx_mapping_ptr,
        num_computed_tokens_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        num_reqs,
        TILE=min(next_power_of_2(BLOCK_SIZE), 1024),
    )
