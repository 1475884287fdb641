"""Ascend Triton kernel of :mod:`vllm_ascend.kernels.v2.spec_decode_standalone_ar`.

One program per vector core walks the requests grid-stride (vLLM launches one per request), writing each
request's expanded slots in UB-bounded tiles; the last program writes the padding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


@triton.jit
def _expanded_prefill_kernel(
    target_input_ids_ptr,
    target_positions_ptr,
    last_sampled_ptr,
    idx_mapping_ptr,
    out_input_ids_ptr,
    out_positions_ptr,
    last_token_indices_ptr,
    out_query_start_loc_ptr,
    out_seq_lens_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    num_rejected_ptr,
    num_reqs,
    max_num_reqs,
    max_model_len,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + req)
        q_start = tl.load(query_start_loc_ptr + req)
        total_out = tl.load(query_start_loc_ptr + req + 1) - q_start + 1
        num_valid = total_out - 1 - tl.load(num_rejected_ptr + req)
        correction = tl.load(last_sampled_ptr + state).to(tl.int32)
        start_pos = tl.load(target_positions_ptr + q_start)
        out_start = q_start + req
        for i in range(0, total_out, TILE):
            j = i + tl.arange(0, TILE)
            in_bounds = j < total_out
            ids = tl.load(target_input_ids_ptr + q_start + j, mask=j < num_valid, other=0).to(tl.int32)
            ids = tl.where(j == num_valid, correction, ids)
            positions = tl.minimum(start_pos + j, max_model_len - 1)
            tl.store(
                out_input_ids_ptr + out_start + j, ids.to(out_input_ids_ptr.dtype.element_ty), mask=in_bounds
            )
            tl.store(
                out_positions_ptr + out_start + j,
                positions.to(out_positions_ptr.dtype.element_ty),
                mask=in_bounds,
            )
        tl.store(
            last_token_indices_ptr + req, (out_start + num_valid).to(last_token_indices_ptr.dtype.element_ty)
        )
        tl.store(out_query_start_loc_ptr + req, out_start.to(out_query_start_loc_ptr.dtype.element_ty))
        seq_len = tl.minimum(tl.load(seq_lens_ptr + req) + 1, max_model_len)
        tl.store(out_seq_lens_ptr + req, seq_len.to(out_seq_lens_ptr.dtype.element_ty))
    if pid == programs - 1:
        total_expanded = tl.load(query_start_loc_ptr + num_reqs) + num_reqs
        for i in range(num_reqs, max_num_reqs + 1, TILE):
            offs = i + tl.arange(0, TILE)
            loc = tl.zeros([TILE], dtype=tl.int32) + total_expanded
            tl.store(
                out_query_start_loc_ptr + offs,
                loc.to(out_query_start_loc_ptr.dtype.element_ty),
                mask=offs <= max_num_reqs,
            )
        for i in range(num_reqs, max_num_reqs, TILE):
            offs = i + tl.arange(0, TILE)
            pad = offs < max_num_reqs
            tl.store(out_seq_lens_ptr + offs, tl.zeros([TILE], out_seq_lens_ptr.dtype.element_ty), mask=pad)
            tl.store(
                last_token_indices_ptr + offs,
                tl.zeros([TILE], last_token_indices_ptr.dtype.element_ty),
                mask=pad,
            )


def prepare_prefill_inputs(
    grid: Grid,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    out_input_ids_ptr: torch.Tensor,
    out_positions_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    out_query_start_loc_ptr: torch.Tensor,
    out_seq_lens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    max_num_reqs: int,
    max_model_len: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = out_input_ids_ptr.device
    programs = _geometry.programs(device, num_reqs)
    _expanded_prefill_kernel[(programs,)](
        target_input_ids_ptr,
        target_positions_ptr,
        last_sampled_ptr,
        idx_mapping_ptr,
        out_input_ids_ptr,
        out_positions_ptr,
        last_token_indices_ptr,
        out_query_start_loc_ptr,
        out_seq_lens_ptr,
        query_start_loc_ptr,
        seq_lens_ptr,
        num_rejected_ptr,
        num_reqs,
        max_num_reqs,
        max_model_len,
        TILE=ub_cap(device, next_power_of_2(BLOCK_SIZE)),
    )
