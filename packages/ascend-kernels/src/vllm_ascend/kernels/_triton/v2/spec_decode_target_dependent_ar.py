"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.spec_decode_target_dependent_ar`.

One program per vector core walks the requests grid-stride (vLLM launches one program per request); the
token and hidden-state copies of a request go in UB-bounded tiles, and the padding that vLLM's last (or
extra) program writes is written by the last program here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import ub_cap
from vllm_ascend.kernels.v2._launch import Grid, cdiv, grid_dim


@triton.jit
def _prefill_inputs_kernel(
    last_token_indices_ptr,
    draft_current_step_ptr,
    draft_input_ids_ptr,
    draft_positions_ptr,
    draft_query_start_loc_ptr,
    draft_seq_lens_ptr,
    target_input_ids_ptr,
    target_positions_ptr,
    idx_mapping_ptr,
    last_sampled_ptr,
    next_prefill_tokens_ptr,
    num_sampled_ptr,
    num_rejected_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    num_reqs,
    max_num_reqs,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + req)
        start = tl.load(query_start_loc_ptr + req)
        end = tl.load(query_start_loc_ptr + req + 1)
        valid = end - start - tl.load(num_rejected_ptr + req)
        sampled = tl.load(num_sampled_ptr + req)
        last = tl.load(last_sampled_ptr + state).to(tl.int32)
        chunk = tl.load(next_prefill_tokens_ptr + state).to(tl.int32)
        next_token = tl.where(sampled > 0, last, chunk)
        for i in range(0, valid, TILE):
            offs = i + tl.arange(0, TILE)
            in_query = offs < valid
            shifted = in_query & (offs > 0)
            ids = tl.load(target_input_ids_ptr + start + offs, mask=shifted, other=0)
            tl.store(draft_input_ids_ptr + start + offs - 1, ids, mask=shifted)
            pos = tl.load(target_positions_ptr + start + offs, mask=in_query, other=0)
            tl.store(draft_positions_ptr + start + offs, pos, mask=in_query)
        last_index = start + valid - 1
        tl.store(last_token_indices_ptr + req, last_index.to(last_token_indices_ptr.dtype.element_ty))
        tl.store(draft_input_ids_ptr + last_index, next_token.to(draft_input_ids_ptr.dtype.element_ty))
        tl.store(draft_query_start_loc_ptr + req, start.to(draft_query_start_loc_ptr.dtype.element_ty))
        seq_len = tl.load(seq_lens_ptr + req)
        tl.store(draft_seq_lens_ptr + req, seq_len.to(draft_seq_lens_ptr.dtype.element_ty))
    if pid == programs - 1:
        step = tl.load(draft_current_step_ptr)
        tl.store(draft_current_step_ptr, step - step)
        query_end = tl.load(query_start_loc_ptr + num_reqs)
        for i in range(num_reqs, max_num_reqs + 1, TILE):
            offs = i + tl.arange(0, TILE)
            loc = tl.zeros([TILE], dtype=tl.int32) + query_end
            tl.store(
                draft_query_start_loc_ptr + offs,
                loc.to(draft_query_start_loc_ptr.dtype.element_ty),
                mask=offs < max_num_reqs + 1,
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


def prepare_prefill_inputs(
    grid: Grid,
    last_token_indices_ptr: torch.Tensor,
    draft_current_step_ptr: torch.Tensor,
    draft_input_ids_ptr: torch.Tensor,
    draft_positions_ptr: torch.Tensor,
    draft_query_start_loc_ptr: torch.Tensor,
    draft_seq_lens_ptr: torch.Tensor,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = draft_input_ids_ptr.device
    _prefill_inputs_kernel[(_geometry.programs(device, num_reqs),)](
        last_token_indices_ptr,
        draft_current_step_ptr,
        draft_input_ids_ptr,
        draft_positions_ptr,
        draft_query_start_loc_ptr,
        draft_seq_lens_ptr,
        target_input_ids_ptr,
        target_positions_ptr,
        idx_mapping_ptr,
        last_sampled_ptr,
        next_prefill_tokens_ptr,
        num_sampled_ptr,
        num_rejected_ptr,
        query_start_loc_ptr,
        seq_lens_ptr,
        num_reqs,
        max_num_reqs,
        TILE=ub_cap(device, BLOCK_SIZE),
    )


@triton.jit
def _decode_inputs_kernel(
    draft_tokens_ptr,
    draft_tokens_stride,
    target_seq_lens_ptr,
    num_rejected_ptr,
    input_ids_ptr,
    positions_ptr,
    sample_src_positions_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    num_reqs,
    max_model_len,
    max_num_reqs,
    TILE: tl.constexpr,
    ADVANCE_DRAFT_POSITIONS: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for first in range(pid * TILE, num_reqs, programs * TILE):
        rows = first + tl.arange(0, TILE)
        live = rows < num_reqs
        token = tl.load(draft_tokens_ptr + rows.to(tl.int64) * draft_tokens_stride, mask=live, other=0)
        tl.store(input_ids_ptr + rows, token.to(input_ids_ptr.dtype.element_ty), mask=live)
        key = tl.load(sample_src_positions_ptr + rows, mask=live, other=0)
        tl.store(sample_src_positions_ptr + rows, key + 1, mask=live)
        seq_len = tl.load(target_seq_lens_ptr + rows, mask=live, other=0) - tl.load(
            num_rejected_ptr + rows, mask=live, other=0
        )
        if ADVANCE_DRAFT_POSITIONS:
            pos = tl.load(positions_ptr + rows, mask=live, other=0)
            tl.store(positions_ptr + rows, tl.minimum(pos + 1, max_model_len - 1), mask=live)
            seq_len = tl.minimum(seq_len + 1, max_model_len)
        tl.store(seq_lens_ptr + rows, seq_len.to(seq_lens_ptr.dtype.element_ty), mask=live)
    if pid == programs - 1:
        for i in range(0, max_num_reqs + 1, TILE):
            offs = i + tl.arange(0, TILE)
            loc = tl.minimum(offs, num_reqs)
            tl.store(
                query_start_loc_ptr + offs,
                loc.to(query_start_loc_ptr.dtype.element_ty),
                mask=offs < max_num_reqs + 1,
            )
        for i in range(num_reqs, max_num_reqs, TILE):
            offs = i + tl.arange(0, TILE)
            tl.store(
                seq_lens_ptr + offs, tl.zeros([TILE], seq_lens_ptr.dtype.element_ty), mask=offs < max_num_reqs
            )


def prepare_decode_inputs(
    grid: Grid,
    draft_tokens_ptr: torch.Tensor,
    draft_tokens_stride: int,
    target_seq_lens_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    sample_src_positions_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    max_model_len: int,
    max_num_reqs: int,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    programs = grid_dim(grid, 0)
    if programs == 0:
        return
    num_reqs = programs - 1
    device = input_ids_ptr.device
    tile = ub_cap(device, BLOCK_SIZE)
    _decode_inputs_kernel[(_geometry.programs(device, cdiv(num_reqs, tile)),)](
        draft_tokens_ptr,
        draft_tokens_stride,
        target_seq_lens_ptr,
        num_rejected_ptr,
        input_ids_ptr,
        positions_ptr,
        sample_src_positions_ptr,
        query_start_loc_ptr,
        seq_lens_ptr,
        num_reqs,
        max_model_len,
        max_num_reqs,
        TILE=tile,
        ADVANCE_DRAFT_POSITIONS=bool(ADVANCE_DRAFT_POSITIONS),
    )


@triton.jit
def _update_draft_inputs_kernel(
    output_draft_tokens_ptr,
    output_draft_tokens_stride,
    next_input_hidden_states_ptr,
    next_input_hidden_states_stride,
    input_ids_ptr,
    positions_ptr,
    sample_src_positions_ptr,
    seq_lens_ptr,
    draft_tokens_ptr,
    current_draft_step_ptr,
    hidden_states_ptr,
    hidden_states_stride,
    num_reqs,
    hidden_size,
    max_model_len,
    num_speculative_steps,
    TILE: tl.constexpr,
    ADVANCE_DRAFT_POSITIONS: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    step = tl.load(current_draft_step_ptr)
    for req in range(pid, num_reqs, programs):
        token = tl.load(draft_tokens_ptr + req)
        row = tl.cast(req, tl.int64)
        tl.store(
            output_draft_tokens_ptr + row * output_draft_tokens_stride + step,
            token.to(output_draft_tokens_ptr.dtype.element_ty),
        )
        if step < num_speculative_steps - 1:
            key = tl.load(sample_src_positions_ptr + req)
            tl.store(sample_src_positions_ptr + req, key + 1)
            tl.store(input_ids_ptr + req, token.to(input_ids_ptr.dtype.element_ty))
            source = hidden_states_ptr + row * hidden_states_stride
            target = next_input_hidden_states_ptr + row * next_input_hidden_states_stride
            for i in range(0, hidden_size, TILE):
                cols = i + tl.arange(0, TILE)
                mask = cols < hidden_size
                values = tl.load(source + cols, mask=mask, other=0)
                tl.store(target + cols, values.to(next_input_hidden_states_ptr.dtype.element_ty), mask=mask)
            if ADVANCE_DRAFT_POSITIONS:
                pos = tl.load(positions_ptr + req)
                tl.store(positions_ptr + req, tl.minimum(pos + 1, max_model_len - 1))
                seq_len = tl.load(seq_lens_ptr + req)
                tl.store(seq_lens_ptr + req, tl.minimum(seq_len + 1, max_model_len))


def update_draft_inputs(
    grid: Grid,
    output_draft_tokens_ptr: torch.Tensor,
    output_draft_tokens_stride: int,
    next_input_hidden_states_ptr: torch.Tensor,
    next_input_hidden_states_stride: int,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    sample_src_positions_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    current_draft_step_ptr: torch.Tensor,
    hidden_states_ptr: torch.Tensor,
    hidden_states_stride: int,
    hidden_size: int,
    max_model_len: int,
    num_speculative_steps: int,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = draft_tokens_ptr.device
    _update_draft_inputs_kernel[(_geometry.programs(device, num_reqs),)](
        output_draft_tokens_ptr,
        output_draft_tokens_stride,
        next_input_hidden_states_ptr,
        next_input_hidden_states_stride,
        input_ids_ptr,
        positions_ptr,
        sample_src_positions_ptr,
        seq_lens_ptr,
        draft_tokens_ptr,
        current_draft_step_ptr,
        hidden_states_ptr,
        hidden_states_stride,
        num_reqs,
        hidden_size,
        max_model_len,
        num_speculative_steps,
        TILE=ub_cap(device, BLOCK_SIZE),
        ADVANCE_DRAFT_POSITIONS=bool(ADVANCE_DRAFT_POSITIONS),
    )
