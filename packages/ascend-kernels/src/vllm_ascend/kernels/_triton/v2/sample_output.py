"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_output`.

One program per vector core walks the output rows grid-stride over UB-sized tiles: a prefix sum of
the finite mask places the kept ids, and a ``[TILE / 8, 8]`` view of the same tile (loaded as such,
no reshape) gives the bitmask bytes."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


@triton.jit
def _compact_sampling_mask_kernel(
    logits_ptr,
    logits_row_stride,
    logits_col_stride,
    cu_num_logits_ptr,
    num_sampled_ptr,
    token_ids_ptr,
    token_ids_row_stride,
    packed_mask_ptr,
    packed_mask_row_stride,
    counts_ptr,
    num_rows,
    vocab_size,
    max_num_kept,
    ROWS_PER_REQUEST: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    num_bytes = (vocab_size + 7) // 8
    for out_row in range(pid, num_rows, programs):
        req = out_row // ROWS_PER_REQUEST
        slot = out_row - req * ROWS_PER_REQUEST
        count = tl.full([], 0, tl.int32)
        if slot < tl.load(num_sampled_ptr + req):
            source = tl.load(cu_num_logits_ptr + req).to(tl.int64) + slot
            row = logits_ptr + source * logits_row_stride
            ids_row = token_ids_ptr + tl.cast(out_row, tl.int64) * token_ids_row_stride
            mask_row = packed_mask_ptr + tl.cast(out_row, tl.int64) * packed_mask_row_stride
            for start in range(0, vocab_size, TILE):
                offs = start + tl.arange(0, TILE)
                x = tl.load(row + offs * logits_col_stride, mask=offs < vocab_size, other=float("-inf"))
                x = x.to(tl.float32)
                keep = ((x > float("-inf")) & (x < float("inf"))).to(tl.int32)
                dest = count + tl.cumsum(keep, axis=0) - keep
                tl.store(ids_row + dest, offs, mask=(keep != 0) & (dest < max_num_kept))
                count += tl.sum(keep, axis=0)

                byte = start // 8 + tl.arange(0, TILE // 8)
                cols = byte[:, None] * 8 + tl.arange(0, 8)[None, :]
                y = tl.load(row + cols * logits_col_stride, mask=cols < vocab_size, other=float("-inf"))
                y = y.to(tl.float32)
                bits = ((y > float("-inf")) & (y < float("inf"))).to(tl.int32) << tl.arange(0, 8)[None, :]
                tl.store(mask_row + byte, tl.sum(bits, axis=1).to(tl.uint8), mask=byte < num_bytes)
        tl.store(counts_ptr + out_row, count)


def compact_sampling_mask(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_row_stride: int,
    logits_col_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    num_sampled_tokens_ptr: torch.Tensor,
    token_ids_ptr: torch.Tensor,
    token_ids_row_stride: int,
    packed_mask_ptr: torch.Tensor,
    packed_mask_row_stride: int,
    counts_ptr: torch.Tensor,
    vocab_size: int,
    max_num_kept: int,
    ROWS_PER_REQUEST: int,
    BLOCK_SIZE: int,
) -> None:
    num_rows = grid_dim(grid, 0)
    if num_rows == 0:
        return
    device = logits_ptr.device
    programs = _geometry.programs(device, num_rows)
    tile = min(next_power_of_2(max(vocab_size, 8)), ub_cap(device, 32 if IS_INTERPRETED else 4096, 6))
    _compact_sampling_mask_kernel[(programs,)](
        logits_ptr,
        logits_row_stride,
        logits_col_stride,
        cu_num_logits_ptr,
        num_sampled_tokens_ptr,
        token_ids_ptr,
        token_ids_row_stride,
        packed_mask_ptr,
        packed_mask_row_stride,
        counts_ptr,
        num_rows,
        vocab_size,
        max_num_kept,
        ROWS_PER_REQUEST=ROWS_PER_REQUEST,
        TILE=max(tile, 8),
    )
