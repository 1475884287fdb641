"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.spec_decode_dflash`.

One program per vector core walks the requests grid-stride, each request's context and query rows in
tiles (vLLM: one program per ``(request, BLOCK_SIZE rows)``); program 0 also writes the padding of the
per-request buffers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED
from vllm_ascend.kernels.v2._launch import Grid, grid_dim


@triton.jit
def _local_slot(
    pos, block_id, block_size, cp_rank, CP_SIZE: tl.constexpr, CP_INTERLEAVE: tl.constexpr, PAD: tl.constexpr
):
    """The rank-local KV slot of ``pos`` in block ``block_id``, ``PAD`` where another CP rank owns it."""
    offset = pos % (block_size * CP_SIZE)
    if CP_SIZE == 1:
        slot = block_id * block_size + offset
    else:
        mine = (offset // CP_INTERLEAVE) % CP_SIZE == cp_rank
        local = (offset // (CP_INTERLEAVE * CP_SIZE)) * CP_INTERLEAVE + offset % CP_INTERLEAVE
        slot = tl.where(mine, block_id * block_size + local, PAD)
    return slot


@triton.jit
def _fill(ptr, start, end, value, TILE: tl.constexpr):
    for i in range(start, end, TILE):
        offs = i + tl.arange(0, TILE)
        tl.store(ptr + offs, (tl.zeros([TILE], tl.int32) + value).to(ptr.dtype.element_ty), mask=offs < end)


@triton.jit
def _dflash_inputs_kernel(
    out_input_ids_ptr,
    out_query_positions_ptr,
    out_query_start_loc_ptr,
    out_seq_lens_ptr,
    out_query_slot_mapping_ptr,
    out_context_positions_ptr,
    out_context_slot_mapping_ptr,
    out_sample_indices_ptr,
    out_sample_pos_ptr,
    out_sample_idx_mapping_ptr,
    out_temperature_ptr,
    out_seeds_ptr,
    target_positions_ptr,
    target_query_start_loc_ptr,
    idx_mapping_ptr,
    last_sampled_ptr,
    next_prefill_tokens_ptr,
    num_sampled_ptr,
    num_rejected_ptr,
    temperature_ptr,
    seeds_ptr,
    block_table_ptr,
    block_table_stride,
    parallel_drafting_token_id,
    block_size,
    num_query_per_req,
    num_speculative_steps,
    max_num_reqs,
    max_num_tokens,
    max_model_len,
    cp_rank,
    num_reqs,
    covered,
    SAMPLE_FROM_ANCHOR: tl.constexpr,
    PAD_SLOT_ID: tl.constexpr,
    CP_SIZE: tl.constexpr,
    CP_INTERLEAVE: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    span = block_size * CP_SIZE
    for r in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + r).to(tl.int64)
        ctx_start = tl.load(target_query_start_loc_ptr + r)
        ctx_end = tl.load(target_query_start_loc_ptr + r + 1)
        num_ctx = ctx_end - ctx_start
        valid_end = ctx_end - tl.load(num_rejected_ptr + r)
        num_valid = valid_end - ctx_start
        sampled = tl.load(num_sampled_ptr + r)
        bonus = tl.where(
            sampled > 0,
            tl.load(last_sampled_ptr + state).to(tl.int32),
            tl.load(next_prefill_tokens_ptr + state).to(tl.int32),
        )
        last_valid_pos = tl.load(target_positions_ptr + valid_end - 1)
        query_base = r * num_query_per_req
        table_row = block_table_ptr + tl.cast(r, tl.int64) * block_table_stride
        rows = tl.minimum(covered, tl.maximum(num_ctx, num_valid + num_query_per_req))
        for j0 in range(0, rows, TILE):
            j = j0 + tl.arange(0, TILE)
            inside = j < covered
            is_ctx = inside & (j < num_ctx)
            is_valid_ctx = inside & (j < num_valid)
            is_query = inside & (j >= num_valid) & (j < num_valid + num_query_per_req)
            query_off = j - num_valid

            ctx_pos = tl.load(target_positions_ptr + ctx_start + j, mask=is_valid_ctx, other=0)
            ctx_block = tl.minimum(ctx_pos // span, block_table_stride - 1)
            ctx_block_id = tl.load(table_row + ctx_block, mask=is_valid_ctx, other=0).to(tl.int64)
            ctx_slot = _local_slot(
                ctx_pos, ctx_block_id, block_size, cp_rank, CP_SIZE, CP_INTERLEAVE, PAD_SLOT_ID
            )
            ctx_slot = tl.where(is_valid_ctx & (ctx_block_id != 0), ctx_slot, PAD_SLOT_ID)
            tl.store(
                out_context_positions_ptr + ctx_start + j,
                ctx_pos.to(out_context_positions_ptr.dtype.element_ty),
                mask=is_ctx,
            )
            tl.store(
                out_context_slot_mapping_ptr + ctx_start + j,
                ctx_slot.to(out_context_slot_mapping_ptr.dtype.element_ty),
                mask=is_ctx,
            )

            query_pos = last_valid_pos + 1 + query_off
            query_idx = query_base + query_off
            input_id = tl.where(query_off == 0, bonus, parallel_drafting_token_id)
            q_block = tl.minimum(query_pos // span, block_table_stride - 1)
            q_block_id = tl.load(table_row + q_block, mask=is_query, other=0).to(tl.int64)
            q_slot = _local_slot(
                query_pos, q_block_id, block_size, cp_rank, CP_SIZE, CP_INTERLEAVE, PAD_SLOT_ID
            )
            q_slot = tl.where(is_query & (q_block_id != 0), q_slot, PAD_SLOT_ID)
            tl.store(
                out_input_ids_ptr + query_idx, input_id.to(out_input_ids_ptr.dtype.element_ty), mask=is_query
            )
            tl.store(
                out_query_positions_ptr + query_idx,
                tl.minimum(query_pos, max_model_len - 1).to(out_query_positions_ptr.dtype.element_ty),
                mask=is_query,
            )
            tl.store(
                out_query_slot_mapping_ptr + query_idx,
                q_slot.to(out_query_slot_mapping_ptr.dtype.element_ty),
                mask=is_query,
            )

            if SAMPLE_FROM_ANCHOR:
                is_sample = is_query
                sample_idx = r * num_speculative_steps + query_off
                sample_pos = query_pos + 1
            else:
                is_sample = is_query & (query_off >= 1)
                sample_idx = r * num_speculative_steps + query_off - 1
                sample_pos = query_pos
            tl.store(
                out_sample_indices_ptr + sample_idx,
                query_idx.to(out_sample_indices_ptr.dtype.element_ty),
                mask=is_sample,
            )
            tl.store(
                out_sample_pos_ptr + sample_idx,
                sample_pos.to(out_sample_pos_ptr.dtype.element_ty),
                mask=is_sample,
            )
            tl.store(
                out_sample_idx_mapping_ptr + sample_idx,
                (j * 0 + state).to(out_sample_idx_mapping_ptr.dtype.element_ty),
                mask=is_sample,
            )

        tl.store(out_query_start_loc_ptr + r, query_base)
        seq_len = tl.minimum(last_valid_pos + 1 + num_query_per_req, max_model_len)
        tl.store(out_seq_lens_ptr + r, seq_len.to(out_seq_lens_ptr.dtype.element_ty))
        tl.store(out_temperature_ptr + state, tl.load(temperature_ptr + state))
        tl.store(out_seeds_ptr + state, tl.load(seeds_ptr + state))

    if pid == 0:
        # Padding for CUDA-graph-style replays at larger batch sizes.
        _fill(out_query_start_loc_ptr, num_reqs, max_num_reqs + 1, num_reqs * num_query_per_req, TILE)
        _fill(out_seq_lens_ptr, num_reqs, max_num_reqs, 0, TILE)
        pad_start = num_reqs * num_speculative_steps
        pad_end = max_num_reqs * num_speculative_steps
        _fill(out_sample_indices_ptr, pad_start, pad_end, 0, TILE)
        _fill(out_sample_pos_ptr, pad_start, pad_end, 0, TILE)
        _fill(out_sample_idx_mapping_ptr, pad_start, pad_end, -1, TILE)
        _fill(out_query_slot_mapping_ptr, num_reqs * num_query_per_req, max_num_tokens, PAD_SLOT_ID, TILE)


def prepare_dflash_inputs(
    grid: Grid,
    out_input_ids_ptr: torch.Tensor,
    out_query_positions_ptr: torch.Tensor,
    out_query_start_loc_ptr: torch.Tensor,
    out_seq_lens_ptr: torch.Tensor,
    out_query_slot_mapping_ptr: torch.Tensor,
    out_context_positions_ptr: torch.Tensor,
    out_context_slot_mapping_ptr: torch.Tensor,
    out_sample_indices_ptr: torch.Tensor,
    out_sample_pos_ptr: torch.Tensor,
    out_sample_idx_mapping_ptr: torch.Tensor,
    out_temperature_ptr: torch.Tensor,
    out_seeds_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    target_query_start_loc_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    temperature_ptr: torch.Tensor,
    seeds_ptr: torch.Tensor,
    block_table_ptr: torch.Tensor,
    block_table_stride: int,
    parallel_drafting_token_id: int,
    block_size: int,
    num_query_per_req: int,
    num_speculative_steps: int,
    max_num_reqs: int,
    max_num_tokens: int,
    max_model_len: int,
    cp_rank: int,
    SAMPLE_FROM_ANCHOR: bool,
    PAD_SLOT_ID: int,
    CP_SIZE: int,
    CP_INTERLEAVE: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or num_blocks == 0:
        return
    device = target_positions_ptr.device
    programs = _geometry.programs(device, num_reqs)
    _dflash_inputs_kernel[(programs,)](
        out_input_ids_ptr,
        out_query_positions_ptr,
        out_query_start_loc_ptr,
        out_seq_lens_ptr,
        out_query_slot_mapping_ptr,
        out_context_positions_ptr,
        out_context_slot_mapping_ptr,
        out_sample_indices_ptr,
        out_sample_pos_ptr,
        out_sample_idx_mapping_ptr,
        out_temperature_ptr,
        out_seeds_ptr,
        target_positions_ptr,
        target_query_start_loc_ptr,
        idx_mapping_ptr,
        last_sampled_ptr,
        next_prefill_tokens_ptr,
        num_sampled_ptr,
        num_rejected_ptr,
        temperature_ptr,
        seeds_ptr,
        block_table_ptr,
        block_table_stride,
        parallel_drafting_token_id,
        block_size,
        num_query_per_req,
        num_speculative_steps,
        max_num_reqs,
        max_num_tokens,
        max_model_len,
        cp_rank,
        num_reqs,
        num_blocks * BLOCK_SIZE,
        SAMPLE_FROM_ANCHOR=SAMPLE_FROM_ANCHOR,
        PAD_SLOT_ID=PAD_SLOT_ID,
        CP_SIZE=CP_SIZE,
        CP_INTERLEAVE=CP_INTERLEAVE,
        TILE=8 if IS_INTERPRETED else 256,
    )
