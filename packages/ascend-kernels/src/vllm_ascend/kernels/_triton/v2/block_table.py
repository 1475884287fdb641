"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.block_table`.

One program per vector core walks the ``(KV-cache group, batch row)`` pairs grid-stride (vLLM: a 2-D grid
of one program per pair), copying block ids / computing slots in UB-bounded tiles. Each group's block
table is reached through the pointer array: the loaded address cast to an int32 pointer.
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
def _gather_row(
    group,
    row,
    batch_idx_to_req_idx,
    src_block_table_ptrs,
    dst_block_table_ptrs,
    block_table_strides,
    num_blocks_ptr,
    num_blocks_stride,
    num_reqs,
    TILE: tl.constexpr,
):
    stride = tl.load(block_table_strides + group)
    dst = tl.load(dst_block_table_ptrs + group).to(tl.pointer_type(tl.int32)) + row * stride
    # Names local to each branch differ: Triton merges a name bound in both branches, and the two loops'
    # bounds have different types (the stride is int64, the block count int32).
    if row >= num_reqs:
        # Graph padding: the whole row zeroed.
        for pad_start in range(0, stride, TILE):
            pad = pad_start + tl.arange(0, TILE)
            tl.store(dst + pad, tl.zeros([TILE], dtype=tl.int32), mask=pad < stride)
    else:
        req = tl.load(batch_idx_to_req_idx + row)
        count = tl.load(num_blocks_ptr + group * num_blocks_stride + req)
        src = tl.load(src_block_table_ptrs + group).to(tl.pointer_type(tl.int32)) + req * stride
        for start in range(0, count, TILE):
            offs = start + tl.arange(0, TILE)
            inside = offs < count
            tl.store(dst + offs, tl.load(src + offs, mask=inside, other=0), mask=inside)


@triton.jit
def _gather_block_tables_kernel(
    batch_idx_to_req_idx,
    src_block_table_ptrs,
    dst_block_table_ptrs,
    block_table_strides,
    num_blocks_ptr,
    num_blocks_stride,
    num_reqs,
    num_rows,
    num_groups,
    TILE: tl.constexpr,
    PER_ITEM: tl.constexpr,
):
    if PER_ITEM:  # a program per (group, row) (CUDA, vLLM's 2-D grid)
        _gather_row(
            tl.program_id(0),
            tl.program_id(1),
            batch_idx_to_req_idx,
            src_block_table_ptrs,
            dst_block_table_ptrs,
            block_table_strides,
            num_blocks_ptr,
            num_blocks_stride,
            num_reqs,
            TILE,
        )
    else:  # the (group, row) pairs grid-stride (Ascend: a program per vector core)
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        for work in range(pid, num_groups * num_rows, programs):
            _gather_row(
                work // num_rows,
                work % num_rows,
                batch_idx_to_req_idx,
                src_block_table_ptrs,
                dst_block_table_ptrs,
                block_table_strides,
                num_blocks_ptr,
                num_blocks_stride,
                num_reqs,
                TILE,
            )


def gather_block_tables(
    grid: Grid,
    batch_idx_to_req_idx: torch.Tensor,
    src_block_table_ptrs: torch.Tensor,
    dst_block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    num_blocks_ptr: torch.Tensor,
    num_blocks_stride: int,
    num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    groups, rows = grid_dim(grid, 0), grid_dim(grid, 1)
    if groups * rows == 0:
        return
    device = batch_idx_to_req_idx.device
    per_item = _geometry.geometry(device).grid == "work"
    _gather_block_tables_kernel[(groups, rows) if per_item else (_geometry.programs(device, groups * rows),)](
        batch_idx_to_req_idx,
        src_block_table_ptrs,
        dst_block_table_ptrs,
        block_table_strides,
        num_blocks_ptr,
        num_blocks_stride,
        num_reqs,
        rows,
        groups,
        TILE=ub_cap(device, min(BLOCK_SIZE, _TILE), live_tiles=2),
        PER_ITEM=per_item,
    )


@triton.jit
def _slot_mapping_item(
    group,
    b,
    max_num_tokens,
    idx_mapping,
    query_start_loc,
    pos,
    block_table_ptrs,
    block_table_strides,
    block_sizes,
    slot_mapping_enabled,
    dcp_sharded,
    slot_mappings_ptr,
    slot_mappings_stride,
    cp_rank,
    num_reqs,
    CP_SIZE: tl.constexpr,
    CP_INTERLEAVE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TILE: tl.constexpr,
    PER_ITEM: tl.constexpr,
):
    # Work item (group, b): b < num_reqs computes request b's slots; b == num_reqs pads the group's row
    # from the batch's token count to max_num_tokens.
    out = slot_mappings_ptr + group * slot_mappings_stride
    if b == num_reqs:
        first = tl.load(query_start_loc + num_reqs)
        for i in range(first, max_num_tokens, TILE):
            offs = i + tl.arange(0, TILE)
            tl.store(out + offs, tl.full([TILE], PAD_ID, tl.int64), mask=offs < max_num_tokens)
    else:
        table = tl.load(block_table_ptrs + group).to(tl.pointer_type(tl.int32))
        stride = tl.load(block_table_strides + group)
        block_size = tl.load(block_sizes + group).to(tl.int64)
        enabled = tl.load(slot_mapping_enabled + group).to(tl.int32) != 0
        state = tl.load(idx_mapping + b)
        row = table + state.to(tl.int64) * stride
        begin = tl.load(query_start_loc + b)
        end = tl.load(query_start_loc + b + 1)
        for i in range(begin, end, TILE):
            offs = i + tl.arange(0, TILE)
            inside = offs < end
            positions = tl.load(pos + offs, mask=inside, other=0).to(tl.int64)
            # A dummy request (state -1) owns no blocks: its row is never read. On CUDA (PER_ITEM) tokens
            # past ``end`` read block 0 of the row (their positions load as 0) and are not stored: the load
            # mask is the request's alone, as vLLM's; on Ascend they read nothing (a gather may be a load
            # per lane there). (Scalar conditions are widened to tiles before they meet a tile mask: the
            # upstream interpreter turns a tile mask combined with a scalar one into int32 data, which it
            # refuses as a load mask.)
            if PER_ITEM:
                read = (tl.zeros([TILE], dtype=tl.int32) + state) >= 0
            else:
                read = inside & ((tl.zeros([TILE], dtype=tl.int32) + state) >= 0)
            if CP_SIZE == 1:
                local = positions
            else:
                sharded = (tl.zeros([TILE], dtype=tl.int32) + tl.load(dcp_sharded + group).to(tl.int32)) != 0
                virtual = block_size * CP_SIZE
                within = positions % virtual
                spread = (within // CP_INTERLEAVE) % CP_SIZE == cp_rank
                packed = (
                    (positions // virtual) * block_size
                    + (within // (CP_INTERLEAVE * CP_SIZE)) * CP_INTERLEAVE
                    + within % CP_INTERLEAVE
                )
                local = tl.where(sharded, packed, positions)
                mine = spread | (sharded == 0)
                read = read & mine
            index = tl.where(enabled, local // block_size, 0)
            numbers = tl.load(row + index, mask=read, other=0).to(tl.int64)
            slots = numbers * block_size + local % block_size
            if CP_SIZE != 1:
                slots = tl.where(mine, slots, PAD_ID)
            slots = tl.where(enabled & (state >= 0), slots, PAD_ID)
            tl.store(out + offs, slots, mask=inside)


@triton.jit
def _compute_slot_mappings_kernel(
    max_num_tokens,
    idx_mapping,
    query_start_loc,
    pos,
    block_table_ptrs,
    block_table_strides,
    block_sizes,
    slot_mapping_enabled,
    dcp_sharded,
    slot_mappings_ptr,
    slot_mappings_stride,
    cp_rank,
    num_reqs,
    num_groups,
    CP_SIZE: tl.constexpr,
    CP_INTERLEAVE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TILE: tl.constexpr,
    PER_ITEM: tl.constexpr,
):
    if PER_ITEM:  # a program per (group, b) (CUDA, vLLM's 2-D grid)
        _slot_mapping_item(
            tl.program_id(0),
            tl.program_id(1),
            max_num_tokens,
            idx_mapping,
            query_start_loc,
            pos,
            block_table_ptrs,
            block_table_strides,
            block_sizes,
            slot_mapping_enabled,
            dcp_sharded,
            slot_mappings_ptr,
            slot_mappings_stride,
            cp_rank,
            num_reqs,
            CP_SIZE,
            CP_INTERLEAVE,
            PAD_ID,
            TILE,
            True,
        )
    else:  # the (group, b) pairs grid-stride (Ascend: a program per vector core)
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        items = num_reqs + 1
        for work in range(pid, num_groups * items, programs):
            _slot_mapping_item(
                work // items,
                work % items,
                max_num_tokens,
                idx_mapping,
                query_start_loc,
                pos,
                block_table_ptrs,
                block_table_strides,
                block_sizes,
                slot_mapping_enabled,
                dcp_sharded,
                slot_mappings_ptr,
                slot_mappings_stride,
                cp_rank,
                num_reqs,
                CP_SIZE,
                CP_INTERLEAVE,
                PAD_ID,
                TILE,
                False,
            )


def compute_slot_mappings(
    grid: Grid,
    max_num_tokens: int,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    pos: torch.Tensor,
    block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    block_sizes: torch.Tensor,
    slot_mapping_enabled: torch.Tensor,
    dcp_sharded: torch.Tensor,
    slot_mappings_ptr: torch.Tensor,
    slot_mappings_stride: int,
    cp_rank: int,
    CP_SIZE: int,
    CP_INTERLEAVE: int,
    PAD_ID: int,
    TRITON_BLOCK_SIZE: int,
) -> None:
    groups, num_reqs = grid_dim(grid, 0), grid_dim(grid, 1) - 1
    if groups == 0 or num_reqs < 0:
        return
    device = pos.device
    per_item = _geometry.geometry(device).grid == "work"
    programs = (groups, num_reqs + 1) if per_item else (_geometry.programs(device, groups * (num_reqs + 1)),)
    _compute_slot_mappings_kernel[programs](
        max_num_tokens,
        idx_mapping,
        query_start_loc,
        pos,
        block_table_ptrs,
        block_table_strides,
        block_sizes,
        slot_mapping_enabled,
        dcp_sharded,
        slot_mappings_ptr,
        slot_mappings_stride,
        cp_rank,
        num_reqs,
        groups,
        CP_SIZE=CP_SIZE,
        CP_INTERLEAVE=CP_INTERLEAVE,
        PAD_ID=PAD_ID,
        TILE=ub_cap(device, min(TRITON_BLOCK_SIZE, _TILE), live_tiles=6),
        PER_ITEM=per_item,
    )
