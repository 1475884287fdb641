"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.buffer_utils`.

One program per vector core walks the staged writes grid-stride (vLLM: one program per write), copying
each write's contents in UB-bounded tiles; with ``MULTI_GROUP`` the target buffer of a write is its
group's entry of the pointer array (cast to an int32 pointer) and its row stride the group's stride.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim

_TILE = 4 if IS_INTERPRETED else 1024


@triton.jit
def _apply_write_kernel(
    output_ptr,
    output_stride,
    write_indices_ptr,
    write_starts_ptr,
    write_contents_ptr,
    write_cu_lens_ptr,
    write_group_ids_ptr,
    num_writes,
    MULTI_GROUP: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for write in range(pid, num_writes, programs):
        row = tl.load(write_indices_ptr + write).to(tl.int64)
        start = tl.load(write_starts_ptr + write)
        # Contents of write w: cu_lens[w - 1] (0 for the first) .. cu_lens[w]; the earlier end is read
        # unmasked (clamped index) and dropped for the first write.
        previous = tl.load(write_cu_lens_ptr + tl.maximum(write - 1, 0))
        begin = tl.where(write > 0, previous, 0)
        length = tl.load(write_cu_lens_ptr + write) - begin
        if MULTI_GROUP:
            group = tl.load(write_group_ids_ptr + write)
            base = tl.load(output_ptr + group).to(tl.pointer_type(tl.int32))
            stride = tl.load(output_stride + group)
        else:
            base = output_ptr
            stride = output_stride
        target = base + row * stride + start
        for i in range(0, length, TILE):
            offs = i + tl.arange(0, TILE)
            inside = offs < length
            tl.store(target + offs, tl.load(write_contents_ptr + begin + offs, mask=inside), mask=inside)


def apply_write(
    grid: Grid,
    output_ptr: torch.Tensor,
    output_stride: torch.Tensor | int,
    write_indices_ptr: torch.Tensor,
    write_starts_ptr: torch.Tensor,
    write_contents_ptr: torch.Tensor,
    write_cu_lens_ptr: torch.Tensor,
    write_group_ids_ptr: torch.Tensor | None,
    BLOCK_SIZE: int,
    MULTI_GROUP: bool,
) -> None:
    num_writes = grid_dim(grid, 0)
    if num_writes == 0:
        return
    device = write_contents_ptr.device
    programs = _geometry.programs(device, num_writes)
    _apply_write_kernel[(programs,)](
        output_ptr,
        output_stride,
        write_indices_ptr,
        write_starts_ptr,
        write_contents_ptr,
        write_cu_lens_ptr,
        write_indices_ptr if write_group_ids_ptr is None else write_group_ids_ptr,
        num_writes,
        MULTI_GROUP=bool(MULTI_GROUP),
        TILE=ub_cap(device, min(BLOCK_SIZE, _TILE), live_tiles=2),
    )
