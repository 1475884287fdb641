"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.mamba_utils`.

The bookkeeping kernel walks the batch rows grid-stride in tiles. The copy kernels take work items
(batch row, state, part) grid-stride (a program per vector core on Ascend, per item on CUDA): a temporal state (the large one) is
split into ``parts`` byte ranges so that few requests still fill the cores (vLLM splits it over 16 CTAs);
a conv state is copied whole by part 0. Copies go through ``state_copy.copy_bytes`` (4-byte words where
aligned); a dim-first conv state is copied row by row as ``[ROWS, 16]``-byte tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED
from vllm_ascend.kernels._triton.state_copy import copy_bytes, copy_tile
from vllm_ascend.kernels.v2._launch import Grid, grid_dim

_ROW_TILE = 4 if IS_INTERPRETED else 256
#: Byte ranges a temporal state copy is split into at most (vLLM's ``_TEMPORAL_TILES``).
_MAX_PARTS = 16


@triton.jit
def _preprocess_kernel(
    idx_mapping_ptr,
    state_idx_ptr,
    num_computed_tokens_ptr,
    query_start_loc_ptr,
    num_accepted_tokens_ptr,
    src_col_ptr,
    src_off_ptr,
    num_reqs,
    MAMBA_BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
):
    for start in range(tl.program_id(0) * TILE, num_reqs, tl.num_programs(0) * TILE):
        rows = start + tl.arange(0, TILE)
        live = rows < num_reqs
        reqs = tl.load(idx_mapping_ptr + rows, mask=live, other=0)
        old = tl.load(state_idx_ptr + reqs, mask=live, other=-1)
        accepted = tl.load(num_accepted_tokens_ptr + reqs, mask=live, other=1)
        tl.store(src_col_ptr + reqs, old, mask=live)
        tl.store(src_off_ptr + reqs, tl.maximum(accepted - 1, 0).to(src_off_ptr.dtype.element_ty), mask=live)
        computed = tl.load(num_computed_tokens_ptr + reqs, mask=live, other=0).to(tl.int64)
        query = tl.load(query_start_loc_ptr + rows + 1, mask=live, other=0) - tl.load(
            query_start_loc_ptr + rows, mask=live, other=0
        )
        new = (computed + query + MAMBA_BLOCK_SIZE - 1) // MAMBA_BLOCK_SIZE - 1
        tl.store(state_idx_ptr + reqs, new.to(state_idx_ptr.dtype.element_ty), mask=live)
        crossed = live & (old >= 0) & (old.to(tl.int64) != new)
        tl.store(num_accepted_tokens_ptr + reqs, tl.full([TILE], 1, tl.int32), mask=crossed)


def preprocess_mamba_align_fused(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    state_idx_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_accepted_tokens_ptr: torch.Tensor,
    src_col_ptr: torch.Tensor,
    src_off_ptr: torch.Tensor,
    num_reqs: int,
    BLOCK_SIZE: int,
    MAMBA_BLOCK_SIZE: int,
) -> None:
    if num_reqs == 0:
        return
    device = state_idx_ptr.device
    tile = 4 if IS_INTERPRETED else 256
    _preprocess_kernel[(_geometry.programs(device, triton.cdiv(num_reqs, tile)),)](
        idx_mapping_ptr, state_idx_ptr, num_computed_tokens_ptr, query_start_loc_ptr, num_accepted_tokens_ptr,
        src_col_ptr, src_off_ptr, num_reqs, MAMBA_BLOCK_SIZE=MAMBA_BLOCK_SIZE, TILE=tile,
    )  # fmt: skip


@triton.jit
def _copy_dim_first_rows(src, dst, rows, row_stride, row_bytes, ROWS: tl.constexpr):
    """``row_bytes`` bytes of each of ``rows`` rows ``row_stride`` apart, as ``[ROWS, 16]``-byte tiles."""
    overlap = (dst < src) & (dst + row_bytes > src)
    for r0 in range(0, rows, ROWS):
        r = r0 + tl.arange(0, ROWS)
        for j0 in range(0, row_bytes, 16):
            j = j0 + tl.arange(0, 16)
            inside = (r < rows)[:, None] & (j < row_bytes)[None, :]
            offs = r[:, None].to(tl.int64) * row_stride + j[None, :]
            data = tl.load((src + offs).to(tl.pointer_type(tl.uint8)), mask=inside)
            if overlap:
                tl.debug_barrier()
            tl.store((dst + offs).to(tl.pointer_type(tl.uint8)), data, mask=inside)


@triton.jit
def _copy_state(
    state,
    row,
    src_col,
    dst_col,
    bias,
    part,
    parts,
    block_table_ptrs_ptr,
    block_table_stride_req,
    state_base_addrs_ptr,
    state_block_strides_ptr,
    state_elem_sizes_ptr,
    state_inner_sizes_ptr,
    state_conv_widths_ptr,
    state_group_indices_ptr,
    state_dim_row_count_ptr,
    state_dim_row_stride_ptr,
    DIM_FIRST: tl.constexpr,
    TILE: tl.constexpr,
    ROWS: tl.constexpr,
):
    """vLLM's ``_copy_mamba_state_block``: state ``state`` of request slot ``row`` from block column
    ``src_col`` to ``dst_col`` (a conv window shifted by ``bias`` tokens; a temporal state from column
    ``src_col + bias``, part ``part`` of ``parts`` of its bytes)."""
    base = tl.load(state_base_addrs_ptr + state).to(tl.int64)
    stride = tl.load(state_block_strides_ptr + state).to(tl.int64)
    elem = tl.load(state_elem_sizes_ptr + state).to(tl.int64)
    width = tl.load(state_conv_widths_ptr + state).to(tl.int64)
    group = tl.load(state_group_indices_ptr + state)
    table = tl.load(block_table_ptrs_ptr + group).to(tl.pointer_type(tl.int32))
    table += row.to(tl.int64) * block_table_stride_req
    dst = base + tl.load(table + dst_col).to(tl.int64) * stride
    if width == 0:
        src = base + tl.load(table + src_col + bias).to(tl.int64) * stride
        size = tl.load(state_inner_sizes_ptr + state).to(tl.int64) * elem
        copy_bytes(src, dst, size, part, parts, TILE)
    elif part == 0:
        src = base + tl.load(table + src_col).to(tl.int64) * stride
        if DIM_FIRST:
            rows = tl.load(state_dim_row_count_ptr + state)
            row_stride = tl.load(state_dim_row_stride_ptr + state).to(tl.int64)
            _copy_dim_first_rows(src + bias * elem, dst, rows, row_stride, (width - bias) * elem, ROWS)
        else:
            token = tl.load(state_inner_sizes_ptr + state).to(tl.int64) * elem
            copy_bytes(src + bias * token, dst, (width - bias) * token, 0, 1, TILE)


@triton.jit
def _precopy_kernel(
    mamba_state_idx_ptr,
    src_col_ptr,
    token_bias_ptr,
    block_table_ptrs_ptr,
    block_table_stride_req,
    state_base_addrs_ptr,
    state_block_strides_ptr,
    state_elem_sizes_ptr,
    state_inner_sizes_ptr,
    state_conv_widths_ptr,
    state_group_indices_ptr,
    state_dim_row_count_ptr,
    state_dim_row_stride_ptr,
    idx_mapping_ptr,
    num_reqs,
    num_states,
    parts,
    HAS_IDX_MAPPING: tl.constexpr,
    DIM_FIRST: tl.constexpr,
    TILE: tl.constexpr,
    ROWS: tl.constexpr,
):
    for item in range(tl.program_id(0), num_reqs * num_states * parts, tl.num_programs(0)):
        batch = item // (num_states * parts)
        state = item // parts % num_states
        part = item % parts
        if HAS_IDX_MAPPING:
            row = tl.load(idx_mapping_ptr + batch)
        else:
            row = batch
        if row >= 0:
            src_col = tl.load(src_col_ptr + row)
            dst_col = tl.load(mamba_state_idx_ptr + row)
            if (src_col >= 0) & (src_col != dst_col):
                _copy_state(
                    state, row, src_col, dst_col, tl.load(token_bias_ptr + row), part, parts,
                    block_table_ptrs_ptr, block_table_stride_req, state_base_addrs_ptr, state_block_strides_ptr,
                    state_elem_sizes_ptr, state_inner_sizes_ptr, state_conv_widths_ptr, state_group_indices_ptr,
                    state_dim_row_count_ptr, state_dim_row_stride_ptr, DIM_FIRST, TILE, ROWS,
                )  # fmt: skip


@triton.jit
def _postprocess_kernel(
    num_accepted_tokens_ptr,
    mamba_state_idx_ptr,
    num_scheduled_tokens_ptr,
    num_computed_tokens_ptr,
    num_draft_tokens_ptr,
    block_table_ptrs_ptr,
    block_table_stride_req,
    state_base_addrs_ptr,
    state_block_strides_ptr,
    state_elem_sizes_ptr,
    state_inner_sizes_ptr,
    state_conv_widths_ptr,
    state_group_indices_ptr,
    state_dim_row_count_ptr,
    state_dim_row_stride_ptr,
    num_accepted_tokens_out_ptr,
    idx_mapping_ptr,
    num_reqs,
    num_states,
    parts,
    block_size,
    HAS_IDX_MAPPING: tl.constexpr,
    PRECOMPUTED_NEW_COMPUTED: tl.constexpr,
    DIM_FIRST: tl.constexpr,
    TILE: tl.constexpr,
    ROWS: tl.constexpr,
):
    for item in range(tl.program_id(0), num_reqs * num_states * parts, tl.num_programs(0)):
        batch = item // (num_states * parts)
        state = item // parts % num_states
        part = item % parts
        if HAS_IDX_MAPPING:
            row = tl.load(idx_mapping_ptr + batch)
        else:
            row = batch
        if row >= 0:
            accepted = tl.load(num_accepted_tokens_ptr + row)
            src_col = tl.load(mamba_state_idx_ptr + row)
            if PRECOMPUTED_NEW_COMPUTED:
                new_computed = tl.load(num_computed_tokens_ptr + row)
                running = new_computed - accepted + 1
            else:
                running = (
                    tl.load(num_computed_tokens_ptr + row)
                    + tl.load(num_scheduled_tokens_ptr + row)
                    - tl.load(num_draft_tokens_ptr + row)
                )
                new_computed = running + accepted - 1
            aligned = new_computed // block_size * block_size
            if aligned >= running:
                bias = aligned - running
                dst_col = aligned // block_size - 1
                if (src_col == dst_col) & (state == 0) & (part == 0):
                    tl.store(num_accepted_tokens_out_ptr + row, 1)
                if (src_col != dst_col) | (bias != 0):
                    _copy_state(
                        state, row, src_col, dst_col, bias, part, parts,
                        block_table_ptrs_ptr, block_table_stride_req, state_base_addrs_ptr, state_block_strides_ptr,
                        state_elem_sizes_ptr, state_inner_sizes_ptr, state_conv_widths_ptr,
                        state_group_indices_ptr, state_dim_row_count_ptr, state_dim_row_stride_ptr,
                        DIM_FIRST, TILE, ROWS,
                    )  # fmt: skip


def _work(device: torch.device, num_reqs: int, num_states: int) -> tuple[int, int]:
    """``(programs, parts)``: temporal copies split until the items fill the device's cores."""
    items = num_reqs * num_states
    parts = max(1, min(_MAX_PARTS, triton.cdiv(_geometry.geometry(device).persistent_programs(), items)))
    return _geometry.programs(device, items * parts), parts


def precopy_mamba_align_fused(
    grid: Grid,
    mamba_state_idx_ptr: torch.Tensor,
    src_col_ptr: torch.Tensor,
    token_bias_ptr: torch.Tensor,
    block_table_ptrs_ptr: torch.Tensor,
    block_table_stride_req: int,
    state_base_addrs_ptr: torch.Tensor,
    state_block_strides_ptr: torch.Tensor,
    state_elem_sizes_ptr: torch.Tensor,
    state_inner_sizes_ptr: torch.Tensor,
    state_conv_widths_ptr: torch.Tensor,
    state_group_indices_ptr: torch.Tensor,
    state_dim_row_count_ptr: torch.Tensor,
    state_dim_row_stride_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor | None,
    num_reqs: int,
    COPY_BLOCK_SIZE: int,
    CONV_STATE_DIM_FIRST: bool,
    HAS_IDX_MAPPING: bool = True,
    TEMPORAL_TILES: int = 1,
) -> None:
    num_reqs, num_states = min(num_reqs, grid_dim(grid, 0)), grid_dim(grid, 1)
    if num_reqs == 0 or num_states == 0:
        return
    device = state_base_addrs_ptr.device
    programs, parts = _work(device, num_reqs, num_states)
    _precopy_kernel[(programs,)](
        mamba_state_idx_ptr, src_col_ptr, token_bias_ptr, block_table_ptrs_ptr, block_table_stride_req,
        state_base_addrs_ptr, state_block_strides_ptr, state_elem_sizes_ptr, state_inner_sizes_ptr,
        state_conv_widths_ptr, state_group_indices_ptr, state_dim_row_count_ptr, state_dim_row_stride_ptr,
        idx_mapping_ptr if HAS_IDX_MAPPING else src_col_ptr, num_reqs, num_states, parts,
        HAS_IDX_MAPPING=HAS_IDX_MAPPING, DIM_FIRST=CONV_STATE_DIM_FIRST, TILE=copy_tile(device), ROWS=_ROW_TILE,
    )  # fmt: skip


def postprocess_mamba_fused(
    grid: Grid,
    num_accepted_tokens_ptr: torch.Tensor,
    mamba_state_idx_ptr: torch.Tensor,
    num_scheduled_tokens_ptr: torch.Tensor | None,
    num_computed_tokens_ptr: torch.Tensor,
    num_draft_tokens_ptr: torch.Tensor | None,
    block_table_ptrs_ptr: torch.Tensor,
    block_table_stride_req: int,
    state_base_addrs_ptr: torch.Tensor,
    state_block_strides_ptr: torch.Tensor,
    state_elem_sizes_ptr: torch.Tensor,
    state_inner_sizes_ptr: torch.Tensor,
    state_conv_widths_ptr: torch.Tensor,
    state_group_indices_ptr: torch.Tensor,
    state_dim_row_count_ptr: torch.Tensor,
    state_dim_row_stride_ptr: torch.Tensor,
    num_accepted_tokens_out_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor | None,
    num_reqs: int,
    block_size: int,
    COPY_BLOCK_SIZE: int,
    CONV_STATE_DIM_FIRST: bool,
    HAS_IDX_MAPPING: bool = False,
    PRECOMPUTED_NEW_COMPUTED: bool = False,
    TEMPORAL_TILES: int = 1,
) -> None:
    num_reqs, num_states = min(num_reqs, grid_dim(grid, 0)), grid_dim(grid, 1)
    if num_reqs == 0 or num_states == 0:
        return
    device = state_base_addrs_ptr.device
    programs, parts = _work(device, num_reqs, num_states)
    # Unused pointers (absent under PRECOMPUTED_NEW_COMPUTED / without a mapping) stand in as any tensor.
    _postprocess_kernel[(programs,)](
        num_accepted_tokens_ptr, mamba_state_idx_ptr,
        num_computed_tokens_ptr if num_scheduled_tokens_ptr is None else num_scheduled_tokens_ptr,
        num_computed_tokens_ptr,
        num_computed_tokens_ptr if num_draft_tokens_ptr is None else num_draft_tokens_ptr,
        block_table_ptrs_ptr, block_table_stride_req, state_base_addrs_ptr, state_block_strides_ptr,
        state_elem_sizes_ptr, state_inner_sizes_ptr, state_conv_widths_ptr, state_group_indices_ptr,
        state_dim_row_count_ptr, state_dim_row_stride_ptr, num_accepted_tokens_out_ptr,
        mamba_state_idx_ptr if idx_mapping_ptr is None else idx_mapping_ptr, num_reqs, num_states, parts, block_size,
        HAS_IDX_MAPPING=HAS_IDX_MAPPING, PRECOMPUTED_NEW_COMPUTED=PRECOMPUTED_NEW_COMPUTED,
        DIM_FIRST=CONV_STATE_DIM_FIRST, TILE=copy_tile(device), ROWS=_ROW_TILE,
    )  # fmt: skip
