"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/spec_decode/dflash/speculator.py`` (the DFlash
/ DSpark drafter's inputs: context and query positions, KV slots, sampling indices)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.spec_decode.dflash.speculator"


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view from ``t``'s first element to the end of its storage: what ``ptr + offset`` addresses."""
    offset = t.storage_offset()
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size() - offset,), (1,), offset)


def _div(a: torch.Tensor, b: int) -> torch.Tensor:
    """Triton's integer ``//`` (truncating)."""
    return torch.div(a, b, rounding_mode="trunc")


def cp_local_slot_torch(
    positions: torch.Tensor,
    block_ids: torch.Tensor,
    block_size: int,
    cp_rank: int,
    cp_size: int,
    cp_interleave: int,
    pad_id: int,
) -> torch.Tensor:
    """vLLM's ``cp_local_slot``: the rank-local KV slot of each position in its block, ``pad_id`` for
    positions another context-parallel rank owns (tokens dealt round-robin in runs of
    ``cp_interleave``)."""
    offsets = torch.fmod(positions, block_size * cp_size)
    if cp_size == 1:
        return block_ids * block_size + offsets
    is_local = torch.fmod(_div(offsets, cp_interleave), cp_size) == cp_rank
    local = _div(offsets, cp_interleave * cp_size) * cp_interleave + torch.fmod(offsets, cp_interleave)
    return torch.where(is_local, block_ids * block_size + local, pad_id)


def prepare_dflash_inputs_torch(
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
    """Reference of :func:`prepare_dflash_inputs`."""
    num_reqs, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or num_blocks == 0:
        return
    device = target_positions_ptr.device
    reqs = torch.arange(num_reqs, device=device)
    states = idx_mapping_ptr[:num_reqs].long()
    ctx_start = target_query_start_loc_ptr[:num_reqs].long()
    ctx_end = target_query_start_loc_ptr[1 : num_reqs + 1].long()
    num_ctx = ctx_end - ctx_start
    valid_end = ctx_end - num_rejected_ptr[:num_reqs].long()
    num_valid = valid_end - ctx_start
    bonus = torch.where(
        num_sampled_ptr[:num_reqs] > 0,
        last_sampled_ptr[states].to(torch.int32),
        next_prefill_tokens_ptr[states].to(torch.int32),
    )
    last_valid_pos = target_positions_ptr[valid_end - 1].long()
    query_base = reqs * num_query_per_req
    table = _flat(block_table_ptr)
    span = block_size * CP_SIZE

    j = torch.arange(num_blocks * BLOCK_SIZE, device=device)[None, :]
    is_ctx = j < num_ctx[:, None]
    is_valid_ctx = j < num_valid[:, None]
    is_query = (j >= num_valid[:, None]) & (j < num_valid[:, None] + num_query_per_req)
    query_off = j - num_valid[:, None]

    # Context rows: the target positions (0 for the rejected suffix) and their slots (PAD when not
    # resident: rejected, or in the null block 0).
    ctx_index = (ctx_start[:, None] + j).clamp(0, max(target_positions_ptr.numel() - 1, 0))
    ctx_pos = torch.where(is_valid_ctx, target_positions_ptr[ctx_index].long(), 0)
    ctx_block_num = torch.clamp_max(_div(ctx_pos, span), block_table_stride - 1)
    ctx_block_id = torch.where(
        is_valid_ctx, table[(reqs[:, None] * block_table_stride + ctx_block_num) * is_valid_ctx].long(), 0
    )
    ctx_slot = torch.where(
        is_valid_ctx & (ctx_block_id != 0),
        cp_local_slot_torch(ctx_pos, ctx_block_id, block_size, cp_rank, CP_SIZE, CP_INTERLEAVE, PAD_SLOT_ID),
        PAD_SLOT_ID,
    )
    rows, cols = is_ctx.nonzero(as_tuple=True)
    dst = ctx_start[rows] + cols
    out_context_positions_ptr[dst] = ctx_pos[rows, cols].to(out_context_positions_ptr.dtype)
    out_context_slot_mapping_ptr[dst] = ctx_slot[rows, cols].to(out_context_slot_mapping_ptr.dtype)

    # Query rows: the bonus token then parallel-drafting tokens, after the last valid position.
    query_pos = last_valid_pos[:, None] + 1 + query_off
    query_idx = query_base[:, None] + query_off
    input_id = torch.where(query_off == 0, bonus[:, None].long(), parallel_drafting_token_id)
    q_block_num = torch.clamp_max(_div(query_pos, span), block_table_stride - 1)
    q_block_id = torch.where(
        is_query, table[(reqs[:, None] * block_table_stride + q_block_num) * is_query].long(), 0
    )
    q_slot = torch.where(
        is_query & (q_block_id != 0),
        cp_local_slot_torch(query_pos, q_block_id, block_size, cp_rank, CP_SIZE, CP_INTERLEAVE, PAD_SLOT_ID),
        PAD_SLOT_ID,
    )
    rows, cols = is_query.nonzero(as_tuple=True)
    dst = query_idx[rows, cols]
    out_input_ids_ptr[dst] = input_id[rows, cols].to(out_input_ids_ptr.dtype)
    out_query_positions_ptr[dst] = torch.clamp_max(query_pos[rows, cols], max_model_len - 1).to(
        out_query_positions_ptr.dtype
    )
    out_query_slot_mapping_ptr[dst] = q_slot[rows, cols].to(out_query_slot_mapping_ptr.dtype)

    # Sampled positions: every query row (DSpark, predicting position + 1) or all but the anchor.
    sample_off = 0 if SAMPLE_FROM_ANCHOR else 1
    is_sample = is_query & (query_off >= sample_off)
    rows, cols = is_sample.nonzero(as_tuple=True)
    sample_idx = reqs[rows] * num_speculative_steps + query_off[rows, cols] - sample_off
    out_sample_indices_ptr[sample_idx] = query_idx[rows, cols].to(out_sample_indices_ptr.dtype)
    sample_pos = query_pos[rows, cols] + (1 if SAMPLE_FROM_ANCHOR else 0)
    out_sample_pos_ptr[sample_idx] = sample_pos.to(out_sample_pos_ptr.dtype)
    out_sample_idx_mapping_ptr[sample_idx] = states[rows].to(out_sample_idx_mapping_ptr.dtype)

    # Per-request values (vLLM's block-0 programs), then the padding up to the graph sizes.
    out_query_start_loc_ptr[:num_reqs] = query_base.to(out_query_start_loc_ptr.dtype)
    out_seq_lens_ptr[:num_reqs] = torch.clamp_max(last_valid_pos + 1 + num_query_per_req, max_model_len).to(
        out_seq_lens_ptr.dtype
    )
    out_temperature_ptr[states] = temperature_ptr[states].to(out_temperature_ptr.dtype)
    out_seeds_ptr[states] = seeds_ptr[states].to(out_seeds_ptr.dtype)
    out_query_start_loc_ptr[num_reqs : max_num_reqs + 1] = num_reqs * num_query_per_req
    out_seq_lens_ptr[num_reqs:max_num_reqs] = 0
    pad_start, pad_end = num_reqs * num_speculative_steps, max_num_reqs * num_speculative_steps
    out_sample_indices_ptr[pad_start:pad_end] = 0
    out_sample_pos_ptr[pad_start:pad_end] = 0
    out_sample_idx_mapping_ptr[pad_start:pad_end] = -1
    out_query_slot_mapping_ptr[num_reqs * num_query_per_req : max_num_tokens] = PAD_SLOT_ID


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
    """The drafter's inputs, in place. Request ``r < grid[0]`` (state ``s``): its target tokens
    ``[ctx_start, ctx_end)`` minus ``num_rejected`` trailing ones are the context: their positions and
    KV slots (``PAD_SLOT_ID`` for rejected rows and null-block 0 entries; the rejected rows get position
    0); then ``num_query_per_req`` query rows at ``r * num_query_per_req``: ids (the bonus token, i.e.
    ``last_sampled[s]`` or ``next_prefill_tokens[s]`` when nothing was sampled, then
    ``parallel_drafting_token_id``), positions after the last valid one (clamped to
    ``max_model_len - 1``) and slots, and the sampled rows (indices, positions, ``s``). Also the query
    start and sequence length of ``r``, ``temperature`` / ``seeds`` of ``s``, and the padding of every
    per-request buffer up to ``max_num_reqs`` / ``max_num_tokens``. Only the first
    ``grid[1] * BLOCK_SIZE`` rows of each request are covered."""
    impl = dispatch_v2(
        "spec_decode_dflash",
        "prepare_dflash_inputs",
        prepare_dflash_inputs_torch,
        target_positions_ptr.device,
    )
    impl(
        grid,
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
        SAMPLE_FROM_ANCHOR,
        PAD_SLOT_ID,
        CP_SIZE,
        CP_INTERLEAVE,
        BLOCK_SIZE,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._prepare_dflash_inputs_kernel": prepare_dflash_inputs,
}
