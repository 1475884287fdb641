"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.spec_decode_multi_module_mtp`.

One program per vector core walks the work items grid-stride instead of vLLM's one program per request
(per request and tile for the hidden-state kernels): requests for the token kernels, ``(request, row
tile)`` pairs for the first-module hidden states, ``(group, request)`` pairs for the slot padding. Rows of
hidden states move as ``[rows, columns]`` tiles bounded by the UB; the in-place shifts move a request's
rows tile by tile front to back, each tile loaded before it is stored one row lower, as vLLM's kernels do.
Float rows are only moved, never computed on (no float constants), so every dtype copies bit-exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import ub_cap
from vllm_ascend.kernels.v2._launch import Grid, cdiv, grid_dim, next_power_of_2


def _row_tiles(device: torch.device, width: int, rows: int) -> tuple[int, int]:
    """``(ROWS, COLS)`` of a row-copy tile: the columns first (up to ``width``), then as many of ``rows``
    rows as the UB holds beside them."""
    budget = ub_cap(device, 16384)
    cols = min(next_power_of_2(max(width, 1)), budget)
    return max(1, min(next_power_of_2(max(rows, 1)), budget // cols)), cols


@triton.jit
def _copy_row(dst_ptr, src_ptr, width, COLS: tl.constexpr):
    """``dst[:width] = src[:width]`` (one row, in ``COLS`` tiles)."""
    for c in range(0, width, COLS):
        cols = c + tl.arange(0, COLS)
        mask = cols < width
        tl.store(dst_ptr + cols, tl.load(src_ptr + cols, mask=mask).to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _input_buffers_kernel(
    last_token_indices_ptr,
    draft_input_ids_ptr,
    draft_positions_ptr,
    draft_seq_lens_ptr,
    target_input_ids_ptr,
    target_positions_ptr,
    cached_draft_input_ids_ptr,
    cached_draft_input_ids_stride0,
    draft_input_id_overrides_ptr,
    draft_input_id_overrides_stride0,
    idx_mapping_ptr,
    last_sampled_ptr,
    next_prefill_tokens_ptr,
    next_prefill_tokens_stride0,
    num_sampled_ptr,
    num_rejected_ptr,
    target_seq_lens_ptr,
    query_start_loc_ptr,
    num_reqs,
    max_num_reqs,
    num_speculative_steps,
    HAS_CACHE: tl.constexpr,
    TILE: tl.constexpr,
    STEP_TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + req)
        start = tl.load(query_start_loc_ptr + req)
        query_len = tl.load(query_start_loc_ptr + req + 1) - start
        rejected = tl.load(num_rejected_ptr + req)
        gap = tl.maximum(rejected - 1, 0)
        kept = query_len - rejected
        seq_len = tl.load(target_seq_lens_ptr + req) - gap
        tl.store(draft_seq_lens_ptr + req, seq_len.to(draft_seq_lens_ptr.dtype.element_ty))

        sampled = tl.load(num_sampled_ptr + req)
        last = tl.load(last_sampled_ptr + state).to(tl.int32)
        chunk = tl.load(next_prefill_tokens_ptr + state).to(tl.int32)
        next_token = tl.where(sampled > 0, last, chunk)

        # Future prompt tokens overriding the later draft steps' inputs (-1: none, the request sampled).
        overrides = draft_input_id_overrides_ptr + tl.cast(req, tl.int64) * draft_input_id_overrides_stride0
        for s in range(1, num_speculative_steps, STEP_TILE):
            step = s + tl.arange(0, STEP_TILE)
            in_steps = step < num_speculative_steps
            future = tl.load(
                next_prefill_tokens_ptr + step.to(tl.int64) * next_prefill_tokens_stride0 + state,
                mask=in_steps,
                other=0,
            ).to(tl.int64)
            value = tl.where(sampled > 0, tl.full([STEP_TILE], -1, tl.int64), future)
            tl.store(
                overrides + step - 1, value.to(draft_input_id_overrides_ptr.dtype.element_ty), mask=in_steps
            )

        # Target ids shifted left by one, after the re-prefill gap; positions likewise.
        for i in range(0, kept, TILE):
            offs = i + tl.arange(0, TILE)
            in_query = offs < kept
            shifted = in_query & (offs > 0)
            ids = tl.load(target_input_ids_ptr + start + offs, mask=shifted, other=0)
            tl.store(
                draft_input_ids_ptr + start + gap - 1 + offs,
                ids.to(draft_input_ids_ptr.dtype.element_ty),
                mask=shifted,
            )
            pos = tl.load(target_positions_ptr + start + offs, mask=in_query, other=0)
            tl.store(
                draft_positions_ptr + start + gap + offs,
                pos.to(draft_positions_ptr.dtype.element_ty),
                mask=in_query,
            )
        last_index = start + gap + kept - 1
        tl.store(last_token_indices_ptr + req, last_index.to(last_token_indices_ptr.dtype.element_ty))
        tl.store(draft_input_ids_ptr + last_index, next_token.to(draft_input_ids_ptr.dtype.element_ty))

        if HAS_CACHE:
            # The gap: the cached ids of the previous decode step, at the positions just before the query.
            first_position = tl.load(target_positions_ptr + start)
            cached = cached_draft_input_ids_ptr + tl.cast(state, tl.int64) * cached_draft_input_ids_stride0
            for i in range(0, gap, STEP_TILE):
                offs = i + tl.arange(0, STEP_TILE)
                in_gap = offs < gap
                token = tl.load(cached + num_speculative_steps - 1 - gap + offs, mask=in_gap, other=0)
                tl.store(
                    draft_input_ids_ptr + start + offs,
                    token.to(draft_input_ids_ptr.dtype.element_ty),
                    mask=in_gap,
                )
                pos = first_position - gap + offs
                tl.store(
                    draft_positions_ptr + start + offs,
                    pos.to(draft_positions_ptr.dtype.element_ty),
                    mask=in_gap,
                )
    if pid == programs - 1:
        query_end = tl.load(query_start_loc_ptr + num_reqs)
        for i in range(num_reqs, max_num_reqs + 1, TILE):
            offs = i + tl.arange(0, TILE)
            loc = tl.zeros([TILE], dtype=tl.int32) + query_end
            tl.store(
                query_start_loc_ptr + offs,
                loc.to(query_start_loc_ptr.dtype.element_ty),
                mask=offs <= max_num_reqs,
            )
        for i in range(num_reqs, max_num_reqs, TILE):
            offs = i + tl.arange(0, TILE)
            pad = offs < max_num_reqs
            tl.store(
                draft_seq_lens_ptr + offs, tl.zeros([TILE], draft_seq_lens_ptr.dtype.element_ty), mask=pad
            )
            tl.store(
                last_token_indices_ptr + offs,
                tl.zeros([TILE], last_token_indices_ptr.dtype.element_ty),
                mask=pad,
            )


def prepare_input_buffers(
    grid: Grid,
    last_token_indices_ptr: torch.Tensor,
    draft_input_ids_ptr: torch.Tensor,
    draft_positions_ptr: torch.Tensor,
    draft_seq_lens_ptr: torch.Tensor,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    cached_draft_input_ids_ptr: torch.Tensor | None,
    cached_draft_input_ids_stride0: int,
    draft_input_id_overrides_ptr: torch.Tensor,
    draft_input_id_overrides_stride0: int,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    next_prefill_tokens_stride0: int,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    target_seq_lens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    max_num_reqs: int,
    num_speculative_steps: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = draft_input_ids_ptr.device
    has_cache = cached_draft_input_ids_ptr is not None
    _input_buffers_kernel[(_geometry.programs(device, num_reqs),)](
        last_token_indices_ptr,
        draft_input_ids_ptr,
        draft_positions_ptr,
        draft_seq_lens_ptr,
        target_input_ids_ptr,
        target_positions_ptr,
        cached_draft_input_ids_ptr if has_cache else draft_input_ids_ptr,
        cached_draft_input_ids_stride0,
        draft_input_id_overrides_ptr,
        draft_input_id_overrides_stride0,
        idx_mapping_ptr,
        last_sampled_ptr,
        next_prefill_tokens_ptr,
        next_prefill_tokens_stride0,
        num_sampled_ptr,
        num_rejected_ptr,
        target_seq_lens_ptr,
        query_start_loc_ptr,
        num_reqs,
        max_num_reqs,
        num_speculative_steps,
        HAS_CACHE=has_cache,
        TILE=ub_cap(device, next_power_of_2(BLOCK_SIZE)),
        STEP_TILE=min(next_power_of_2(max(num_speculative_steps - 1, 1)), 64),
    )


@triton.jit
def _input_hidden_states_kernel(
    draft_hidden_ptr,
    draft_hidden_stride0,
    target_hidden_ptr,
    target_hidden_stride0,
    cached_hidden_ptr,
    cached_hidden_stride0,
    cached_hidden_stride1,
    input_embeds_ptr,
    input_embeds_stride0,
    cached_embeds_ptr,
    cached_embeds_stride0,
    cached_embeds_stride1,
    idx_mapping_ptr,
    num_rejected_ptr,
    query_start_loc_ptr,
    num_reqs,
    row_tiles,
    max_rows,
    width,
    num_speculative_steps,
    USE_INPUT_EMBEDS: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, num_reqs * row_tiles, programs):
        req = item // row_tiles
        tile = item - req * row_tiles
        start = tl.load(query_start_loc_ptr + req)
        rejected = tl.load(num_rejected_ptr + req)
        gap = tl.maximum(rejected - 1, 0)
        # The rows vLLM's grid covers: the kept ones, up to grid[1] * BLOCK_SIZE_Q.
        rows_end = tl.minimum(tl.load(query_start_loc_ptr + req + 1) - start - rejected, max_rows)
        rows = tile * ROWS + tl.arange(0, ROWS)
        src_rows = (start + rows).to(tl.int64)
        dst_rows = (start + gap + rows).to(tl.int64)
        for c in range(0, width, COLS):
            cols = c + tl.arange(0, COLS)
            mask = (rows < rows_end)[:, None] & (cols < width)[None, :]
            values = tl.load(
                target_hidden_ptr + src_rows[:, None] * target_hidden_stride0 + cols[None, :], mask=mask
            )
            tl.store(
                draft_hidden_ptr + dst_rows[:, None] * draft_hidden_stride0 + cols[None, :],
                values.to(draft_hidden_ptr.dtype.element_ty),
                mask=mask,
            )
        if tile == 0:
            state = tl.cast(tl.load(idx_mapping_ptr + req), tl.int64)
            for i in range(0, gap):
                slot = num_speculative_steps - 1 - gap + i
                row = tl.cast(start + i, tl.int64)
                _copy_row(
                    draft_hidden_ptr + row * draft_hidden_stride0,
                    cached_hidden_ptr + state * cached_hidden_stride0 + slot * cached_hidden_stride1,
                    width,
                    COLS,
                )
                if USE_INPUT_EMBEDS:
                    _copy_row(
                        input_embeds_ptr + row * input_embeds_stride0,
                        cached_embeds_ptr + state * cached_embeds_stride0 + slot * cached_embeds_stride1,
                        width,
                        COLS,
                    )


def prepare_input_hidden_states_and_embeddings(
    grid: Grid,
    draft_input_hidden_states_ptr: torch.Tensor,
    draft_input_hidden_states_stride0: int,
    target_hidden_states_ptr: torch.Tensor,
    target_hidden_states_stride0: int,
    cached_target_hidden_states_ptr: torch.Tensor | None,
    cached_target_hidden_states_stride0: int,
    cached_target_hidden_states_stride1: int,
    input_embeds_ptr: torch.Tensor | None,
    input_embeds_stride0: int,
    cached_draft_input_embeds_ptr: torch.Tensor | None,
    cached_draft_input_embeds_stride0: int,
    cached_draft_input_embeds_stride1: int,
    idx_mapping_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_speculative_steps: int,
    hidden_size: int,
    BLOCK_SIZE_Q: int,
    BLOCK_SIZE_H: int,
    USE_INPUT_EMBEDS: bool,
) -> None:
    num_reqs, query_blocks, dim_blocks = grid_dim(grid, 0), grid_dim(grid, 1), grid_dim(grid, 2)
    width = min(hidden_size, dim_blocks * BLOCK_SIZE_H)
    max_rows = query_blocks * BLOCK_SIZE_Q
    if num_reqs == 0 or max_rows == 0 or width <= 0:
        return
    device = draft_input_hidden_states_ptr.device
    rows, cols = _row_tiles(device, width, BLOCK_SIZE_Q)
    row_tiles = cdiv(max_rows, rows)
    use_embeds = bool(USE_INPUT_EMBEDS)
    dummy = draft_input_hidden_states_ptr
    _input_hidden_states_kernel[(_geometry.programs(device, num_reqs * row_tiles),)](
        draft_input_hidden_states_ptr,
        draft_input_hidden_states_stride0,
        target_hidden_states_ptr,
        target_hidden_states_stride0,
        dummy if cached_target_hidden_states_ptr is None else cached_target_hidden_states_ptr,
        cached_target_hidden_states_stride0,
        cached_target_hidden_states_stride1,
        input_embeds_ptr if use_embeds else dummy,
        input_embeds_stride0,
        cached_draft_input_embeds_ptr if use_embeds else dummy,
        cached_draft_input_embeds_stride0,
        cached_draft_input_embeds_stride1,
        idx_mapping_ptr,
        num_rejected_ptr,
        query_start_loc_ptr,
        num_reqs,
        row_tiles,
        max_rows,
        width,
        num_speculative_steps,
        USE_INPUT_EMBEDS=use_embeds,
        ROWS=rows,
        COLS=cols,
    )


@triton.jit
def _pad_slots_kernel(
    slot_mappings_ptr,
    slot_mappings_stride0,
    query_start_loc_ptr,
    last_token_indices_ptr,
    pad_id,
    num_groups,
    num_reqs,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, num_groups * num_reqs, programs):
        group = item // num_reqs
        req = item - group * num_reqs
        first = tl.load(last_token_indices_ptr + req) + 1
        end = tl.load(query_start_loc_ptr + req + 1)
        base = slot_mappings_ptr + tl.cast(group, tl.int64) * slot_mappings_stride0
        for i in range(first, end, TILE):
            offs = i + tl.arange(0, TILE)
            value = tl.zeros([TILE], dtype=slot_mappings_ptr.dtype.element_ty) + pad_id
            tl.store(base + offs, value.to(slot_mappings_ptr.dtype.element_ty), mask=offs < end)


def pad_trailing_draft_slots(
    grid: Grid,
    slot_mappings_ptr: torch.Tensor,
    slot_mappings_stride0: int,
    query_start_loc_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    PAD_ID: int,
    BLOCK_SIZE: int,
) -> None:
    num_groups, num_reqs = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_groups == 0 or num_reqs == 0:
        return
    device = slot_mappings_ptr.device
    _pad_slots_kernel[(_geometry.programs(device, num_groups * num_reqs),)](
        slot_mappings_ptr,
        slot_mappings_stride0,
        query_start_loc_ptr,
        last_token_indices_ptr,
        PAD_ID,
        num_groups,
        num_reqs,
        TILE=ub_cap(device, next_power_of_2(BLOCK_SIZE)),
    )


@triton.jit
def _cache_inputs_kernel(
    draft_input_ids_ptr,
    draft_embeds_ptr,
    draft_embeds_stride0,
    draft_hidden_ptr,
    draft_hidden_stride0,
    cached_ids_ptr,
    cached_ids_stride0,
    cached_embeds_ptr,
    cached_embeds_stride0,
    cached_embeds_stride1,
    cached_hidden_ptr,
    cached_hidden_stride0,
    cached_hidden_stride1,
    idx_mapping_ptr,
    last_token_indices_ptr,
    query_start_loc_ptr,
    num_reqs,
    num_speculative_steps,
    width,
    USE_INPUT_EMBEDS: tl.constexpr,
    COLS: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.cast(tl.load(idx_mapping_ptr + req), tl.int64)
        if state >= 0:
            start = tl.load(query_start_loc_ptr + req)
            last = tl.load(last_token_indices_ptr + req)
            window_start = last - (num_speculative_steps - 1) + 1
            for t in range(tl.maximum(window_start, start), last + 1):
                slot = t - window_start
                token = tl.load(draft_input_ids_ptr + t)
                tl.store(
                    cached_ids_ptr + state * cached_ids_stride0 + slot,
                    token.to(cached_ids_ptr.dtype.element_ty),
                )
                row = tl.cast(t, tl.int64)
                if USE_INPUT_EMBEDS:
                    _copy_row(
                        cached_embeds_ptr + state * cached_embeds_stride0 + slot * cached_embeds_stride1,
                        draft_embeds_ptr + row * draft_embeds_stride0,
                        width,
                        COLS,
                    )
                _copy_row(
                    cached_hidden_ptr + state * cached_hidden_stride0 + slot * cached_hidden_stride1,
                    draft_hidden_ptr + row * draft_hidden_stride0,
                    width,
                    COLS,
                )


def cache_inputs(
    grid: Grid,
    draft_input_ids_ptr: torch.Tensor,
    draft_input_embeds_ptr: torch.Tensor | None,
    draft_input_embeds_stride0: int,
    draft_input_hidden_states_ptr: torch.Tensor,
    draft_input_hidden_states_stride0: int,
    cached_draft_input_ids_ptr: torch.Tensor,
    cached_draft_input_ids_stride0: int,
    cached_draft_input_embeds_ptr: torch.Tensor | None,
    cached_draft_input_embeds_stride0: int,
    cached_draft_input_embeds_stride1: int,
    cached_target_hidden_states_ptr: torch.Tensor,
    cached_target_hidden_states_stride0: int,
    cached_target_hidden_states_stride1: int,
    idx_mapping_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_speculative_steps: int,
    hidden_size: int,
    BLOCK_SIZE: int,
    USE_INPUT_EMBEDS: bool,
) -> None:
    num_reqs, dim_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or dim_blocks == 0:
        return
    device = draft_input_hidden_states_ptr.device
    width = min(hidden_size, dim_blocks * BLOCK_SIZE)
    use_embeds = bool(USE_INPUT_EMBEDS)
    dummy = draft_input_hidden_states_ptr
    _cache_inputs_kernel[(_geometry.programs(device, num_reqs),)](
        draft_input_ids_ptr,
        draft_input_embeds_ptr if use_embeds else dummy,
        draft_input_embeds_stride0,
        draft_input_hidden_states_ptr,
        draft_input_hidden_states_stride0,
        cached_draft_input_ids_ptr,
        cached_draft_input_ids_stride0,
        cached_draft_input_embeds_ptr if use_embeds else dummy,
        cached_draft_input_embeds_stride0,
        cached_draft_input_embeds_stride1,
        cached_target_hidden_states_ptr,
        cached_target_hidden_states_stride0,
        cached_target_hidden_states_stride1,
        idx_mapping_ptr,
        last_token_indices_ptr,
        query_start_loc_ptr,
        num_reqs,
        num_speculative_steps,
        width,
        USE_INPUT_EMBEDS=use_embeds,
        COLS=_row_tiles(device, width, 1)[1],
    )


@triton.jit
def _shift_ids_kernel(
    input_ids_ptr,
    idx_mapping_ptr,
    query_start_loc_ptr,
    last_token_indices_ptr,
    draft_tokens_ptr,
    num_reqs,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + req)
        if state >= 0:
            start = tl.load(query_start_loc_ptr + req)
            last = tl.load(last_token_indices_ptr + req)
            # Front to back: each tile is loaded before it lands one slot lower, over the previous tile's tail.
            for i in range(start + 1, last + 1, TILE):
                offs = i + tl.arange(0, TILE)
                mask = offs <= last
                ids = tl.load(input_ids_ptr + offs, mask=mask, other=0)
                tl.store(input_ids_ptr + offs - 1, ids, mask=mask)
            token = tl.load(draft_tokens_ptr + req)
            tl.store(input_ids_ptr + last, token.to(input_ids_ptr.dtype.element_ty))


def shift_input_ids(
    grid: Grid,
    input_ids_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = input_ids_ptr.device
    _shift_ids_kernel[(_geometry.programs(device, num_reqs),)](
        input_ids_ptr,
        idx_mapping_ptr,
        query_start_loc_ptr,
        last_token_indices_ptr,
        draft_tokens_ptr,
        num_reqs,
        TILE=ub_cap(device, next_power_of_2(BLOCK_SIZE)),
    )


@triton.jit
def _shift_embeds_kernel(
    input_embeds_ptr,
    input_embeds_stride0,
    draft_embeds_ptr,
    draft_embeds_stride0,
    idx_mapping_ptr,
    query_start_loc_ptr,
    last_token_indices_ptr,
    num_reqs,
    width,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + req)
        if state >= 0:
            start = tl.load(query_start_loc_ptr + req)
            last = tl.load(last_token_indices_ptr + req)
            for c in range(0, width, COLS):
                cols = c + tl.arange(0, COLS)
                col_mask = cols < width
                for i in range(start + 1, last + 1, ROWS):
                    rows = i + tl.arange(0, ROWS)
                    mask = (rows <= last)[:, None] & col_mask[None, :]
                    src = input_embeds_ptr + rows.to(tl.int64)[:, None] * input_embeds_stride0 + cols[None, :]
                    values = tl.load(src, mask=mask)
                    tl.store(src - input_embeds_stride0, values, mask=mask)
            _copy_row(
                input_embeds_ptr + tl.cast(last, tl.int64) * input_embeds_stride0,
                draft_embeds_ptr + tl.cast(req, tl.int64) * draft_embeds_stride0,
                width,
                COLS,
            )


def shift_input_embeds(
    grid: Grid,
    input_embeds_ptr: torch.Tensor,
    input_embeds_stride0: int,
    draft_embeds_ptr: torch.Tensor,
    draft_embeds_stride0: int,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    hidden_size: int,
    BLOCK_SIZE_Q: int,
    BLOCK_SIZE_H: int,
) -> None:
    num_reqs, dim_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    width = min(hidden_size, dim_blocks * BLOCK_SIZE_H)
    if num_reqs == 0 or width <= 0:
        return
    device = input_embeds_ptr.device
    rows, cols = _row_tiles(device, width, BLOCK_SIZE_Q)
    _shift_embeds_kernel[(_geometry.programs(device, num_reqs),)](
        input_embeds_ptr,
        input_embeds_stride0,
        draft_embeds_ptr,
        draft_embeds_stride0,
        idx_mapping_ptr,
        query_start_loc_ptr,
        last_token_indices_ptr,
        num_reqs,
        width,
        ROWS=rows,
        COLS=cols,
    )
