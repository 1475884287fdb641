"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_min_p`.

One program per vector core walks the rows grid-stride: a max pass and a masking pass over UB-sized
tiles of the row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


@triton.jit
def _min_p_kernel(
    logits_ptr, logits_stride, idx_mapping_ptr, min_p_ptr, num_tokens, vocab_size, TILE: tl.constexpr
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for token in range(pid, num_tokens, programs):
        min_p = tl.load(min_p_ptr + tl.load(idx_mapping_ptr + token)).to(tl.float32)
        if min_p != 0.0:
            row = logits_ptr + tl.cast(token, tl.int64) * logits_stride
            row_max = tl.full([], float("-inf"), tl.float32)
            for start in range(0, vocab_size, TILE):
                offs = start + tl.arange(0, TILE)
                x = tl.load(row + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
                x = tl.where(x != x, float("-inf"), x)  # NaN is no maximum
                row_max = tl.maximum(row_max, tl.max(x, axis=0))
            threshold = row_max + tl.log(min_p)
            for start in range(0, vocab_size, TILE):
                offs = start + tl.arange(0, TILE)
                mask = offs < vocab_size
                x = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
                x = tl.where(x < threshold, float("-inf"), x)
                tl.store(row + offs, x.to(logits_ptr.dtype.element_ty), mask=mask)


def min_p(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    min_p_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    num_tokens = grid_dim(grid, 0)
    if num_tokens == 0 or vocab_size <= 0:
        return
    device = logits_ptr.device
    programs = _geometry.programs(device, num_tokens)
    _min_p_kernel[(programs,)](
        logits_ptr,
        logits_stride,
        expanded_idx_mapping_ptr,
        min_p_ptr,
        num_tokens,
        vocab_size,
        TILE=min(next_power_of_2(vocab_size), ub_cap(device, 32 if IS_INTERPRETED else 8192, 3)),
    )
