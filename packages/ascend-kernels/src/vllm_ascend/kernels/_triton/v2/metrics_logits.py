"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.metrics_logits`: one program per vector core
walks the rows grid-stride, counting NaNs over UB-sized tiles."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


@triton.jit
def _num_nans_kernel(logits_ptr, logits_stride, num_nans_ptr, num_reqs, vocab_size, TILE: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        row = logits_ptr + tl.cast(req, tl.int64) * logits_stride
        count = tl.full([], 0, tl.int32)
        for start in range(0, vocab_size, TILE):
            offs = start + tl.arange(0, TILE)
            x = tl.load(row + offs, mask=offs < vocab_size, other=0.0).to(tl.float32)
            count += tl.sum((x != x).to(tl.int32), axis=0)
        tl.store(num_nans_ptr + req, count)


def num_nans(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    num_nans_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = logits_ptr.device
    programs = _geometry.programs(device, num_reqs)
    _num_nans_kernel[(programs,)](
        logits_ptr,
        logits_stride,
        num_nans_ptr,
        num_reqs,
        max(vocab_size, 0),
        TILE=min(next_power_of_2(max(vocab_size, 1)), ub_cap(device, 32 if IS_INTERPRETED else 8192, 2)),
    )
