"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.model_states_prompt_embeds`.

One program per vector core walks the requests grid-stride; a request's rows are copied in
``[TOKENS, HIDDEN]`` tiles (token-id rows of the request's mask masked out), read through the raw
embedding address of its state row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


@triton.jit
def _overlay_kernel(
    inputs_embeds_ptr,
    inputs_embeds_stride,
    embeds_ptrs_ptr,
    mask_ptrs_ptr,
    embeds_lens_ptr,
    idx_mapping_ptr,
    query_start_loc_ptr,
    num_computed_tokens_ptr,
    num_reqs,
    covered,
    hidden_size,
    TOKENS: tl.constexpr,
    HIDDEN: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for b in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + b)
        length = tl.load(embeds_lens_ptr + state)
        computed = tl.load(num_computed_tokens_ptr + state)
        start = tl.load(query_start_loc_ptr + b)
        query_len = tl.load(query_start_loc_ptr + b + 1) - start
        # Non-positive (no loop) when the embeddings are consumed or absent.
        rows = tl.minimum(tl.minimum(query_len, length - computed), covered)
        src = tl.load(embeds_ptrs_ptr + state).to(tl.pointer_type(inputs_embeds_ptr.dtype.element_ty))
        mask_address = tl.load(mask_ptrs_ptr + state)
        flags = mask_address.to(tl.pointer_type(tl.int8))
        for t0 in range(0, rows, TOKENS):
            t = t0 + tl.arange(0, TOKENS)
            live = t < rows
            src_row = (computed + t).to(tl.int64)
            # The mask test as a block (a scalar & block mask comes out int32 in the interpreters).
            has_mask = (t.to(tl.uint64) * 0 + mask_address) != 0
            flag = tl.load(flags + src_row, mask=live & has_mask, other=0)
            write = live & (flag == 0)
            dst_row = (start + t).to(tl.int64)
            for h0 in range(0, hidden_size, HIDDEN):
                h = h0 + tl.arange(0, HIDDEN)
                m = write[:, None] & (h < hidden_size)[None, :]
                x = tl.load(src + src_row[:, None] * hidden_size + h[None, :], mask=m)
                tl.store(inputs_embeds_ptr + dst_row[:, None] * inputs_embeds_stride + h[None, :], x, mask=m)


def apply_prompt_embeds(
    grid: Grid,
    inputs_embeds_ptr: torch.Tensor,
    inputs_embeds_stride: int,
    embeds_ptrs_ptr: torch.Tensor,
    mask_ptrs_ptr: torch.Tensor,
    embeds_lens_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    hidden_size: int,
    TOKEN_BLOCK: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    covered = grid_dim(grid, 1) * TOKEN_BLOCK
    if num_reqs == 0 or covered == 0:
        return
    device = inputs_embeds_ptr.device
    programs = _geometry.programs(device, num_reqs)
    tile = ub_cap(device, 64 if IS_INTERPRETED else 8192, 2)
    hidden_tile = min(next_power_of_2(hidden_size), tile)
    _overlay_kernel[(programs,)](
        inputs_embeds_ptr,
        inputs_embeds_stride,
        embeds_ptrs_ptr,
        mask_ptrs_ptr,
        embeds_lens_ptr,
        idx_mapping_ptr,
        query_start_loc_ptr,
        num_computed_tokens_ptr,
        num_reqs,
        covered,
        hidden_size,
        TOKENS=1 << (max(1, min(TOKEN_BLOCK, tile // hidden_tile)).bit_length() - 1),
        HIDDEN=hidden_tile,
    )
