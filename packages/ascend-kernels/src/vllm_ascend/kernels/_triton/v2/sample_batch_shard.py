"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_batch_shard`.

One program per vector core walks the requests grid-stride (vLLM: one program per request, or per
``(request, position)``). The shard plan counts a request's lower-owner and earlier same-owner requests
over the batch in tiles instead of one ``PADDED_NUM_REQS``-wide block; rows are copied in column tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED
from vllm_ascend.kernels.v2._launch import Grid, grid_dim

_TILE = 4 if IS_INTERPRETED else 256


@triton.jit
def _shard_plan_kernel(
    idx_mapping_ptr,
    cu_num_logits_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    sorted_logits_indices_ptr,
    gathered_src_indices_ptr,
    local_idx_mapping_ptr,
    local_cu_num_logits_ptr,
    local_logits_indices_ptr,
    local_expanded_idx_mapping_ptr,
    local_expanded_local_pos_ptr,
    local_seq_lens_ptr,
    num_programs,
    counted,
    max_logits,
    local_logits_start,
    max_num_reqs_per_rank,
    TP_SIZE: tl.constexpr,
    TP_RANK: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for r in range(pid, num_programs, programs):
        state = tl.load(idx_mapping_ptr + r)
        owner = state % TP_SIZE
        num_logits = tl.load(cu_num_logits_ptr + r + 1) - tl.load(cu_num_logits_ptr + r)
        start = tl.full([], 0, tl.int32)
        local_req = tl.full([], 0, tl.int32)
        for j0 in range(0, counted, TILE):
            j = j0 + tl.arange(0, TILE)
            m = j < counted
            owners = tl.load(idx_mapping_ptr + j, mask=m, other=0) % TP_SIZE
            counts = tl.load(cu_num_logits_ptr + j + 1, mask=m, other=0) - tl.load(
                cu_num_logits_ptr + j, mask=m, other=0
            )
            earlier = m & (owners == owner) & (j < r)
            before = earlier | (m & (owners < owner))
            start += tl.sum(tl.where(before, counts, 0), axis=0).to(tl.int32)
            local_req += tl.sum(earlier.to(tl.int32), axis=0)
        query_start = tl.load(query_start_loc_ptr + r + 1) - num_logits
        width = tl.minimum(num_logits, max_logits)
        tl.store(gathered_src_indices_ptr + r, (owner * max_num_reqs_per_rank + local_req).to(tl.int64))
        if r == 0:
            tl.store(local_cu_num_logits_ptr, 0)
        mine = owner == TP_RANK
        local_start = start - local_logits_start
        for k0 in range(0, width, TILE):
            k = k0 + tl.arange(0, TILE)
            km = k < width
            index = (query_start + k).to(tl.int64)
            tl.store(sorted_logits_indices_ptr + start + k, index, mask=km)
            if mine:
                tl.store(local_logits_indices_ptr + local_start + k, index, mask=km)
                tl.store(
                    local_expanded_idx_mapping_ptr + local_start + k,
                    (k * 0 + state).to(local_expanded_idx_mapping_ptr.dtype.element_ty),
                    mask=km,
                )
                tl.store(
                    local_expanded_local_pos_ptr + local_start + k,
                    k.to(local_expanded_local_pos_ptr.dtype.element_ty),
                    mask=km,
                )
        if mine:
            tl.store(local_idx_mapping_ptr + local_req, state)
            tl.store(local_cu_num_logits_ptr + local_req + 1, local_start + num_logits)
            tl.store(local_seq_lens_ptr + local_req, tl.load(seq_lens_ptr + r))


def build_shard_plan(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    sorted_logits_indices_ptr: torch.Tensor,
    gathered_src_indices_ptr: torch.Tensor,
    local_idx_mapping_ptr: torch.Tensor,
    local_cu_num_logits_ptr: torch.Tensor,
    local_logits_indices_ptr: torch.Tensor,
    local_expanded_idx_mapping_ptr: torch.Tensor,
    local_expanded_local_pos_ptr: torch.Tensor,
    local_seq_lens_ptr: torch.Tensor,
    num_reqs: int,
    local_logits_start: int,
    max_num_reqs_per_rank: int,
    TP_SIZE: int,
    TP_RANK: int,
    PADDED_NUM_REQS: int,
    PADDED_NUM_LOGITS_PER_REQ: int,
) -> None:
    programs = grid_dim(grid, 0)
    if programs == 0:
        return
    _shard_plan_kernel[(_geometry.programs(idx_mapping_ptr.device, programs),)](
        idx_mapping_ptr,
        cu_num_logits_ptr,
        query_start_loc_ptr,
        seq_lens_ptr,
        sorted_logits_indices_ptr,
        gathered_src_indices_ptr,
        local_idx_mapping_ptr,
        local_cu_num_logits_ptr,
        local_logits_indices_ptr,
        local_expanded_idx_mapping_ptr,
        local_expanded_local_pos_ptr,
        local_seq_lens_ptr,
        programs,
        max(0, min(int(num_reqs), PADDED_NUM_REQS)),
        PADDED_NUM_LOGITS_PER_REQ,
        local_logits_start,
        max_num_reqs_per_rank,
        TP_SIZE=TP_SIZE,
        TP_RANK=TP_RANK,
        TILE=_TILE,
    )


@triton.jit
def _pack_output_kernel(
    packed_ptr,
    packed_stride,
    sampled_token_ids_ptr,
    sampled_token_ids_stride,
    num_sampled_ptr,
    num_rejected_ptr,
    num_nans_ptr,
    local_cu_num_logits_ptr,
    num_reqs,
    max_num_logits_per_req,
    width,
    num_src_cols,
    nan_rows,
    HAS_NANS: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for r in range(pid, num_reqs, programs):
        row = packed_ptr + tl.cast(r, tl.int64) * packed_stride
        src = sampled_token_ids_ptr + tl.cast(r, tl.int64) * sampled_token_ids_stride
        for c0 in range(0, width, TILE):
            c = c0 + tl.arange(0, TILE)
            tokens = tl.load(src + c, mask=(c < num_src_cols) & (c < width), other=0)
            tl.store(row + c, tokens.to(packed_ptr.dtype.element_ty), mask=c < width)
        tl.store(row + max_num_logits_per_req, tl.load(num_sampled_ptr + r).to(tl.int64))
        tl.store(row + max_num_logits_per_req + 1, tl.load(num_rejected_ptr + r).to(tl.int64))
        if HAS_NANS:
            start = tl.load(local_cu_num_logits_ptr + r)
            count = tl.minimum(tl.load(local_cu_num_logits_ptr + r + 1) - start, nan_rows)
            total = tl.full([], 0, tl.int64)
            for i0 in range(0, count, TILE):
                i = i0 + tl.arange(0, TILE)
                nans = tl.load(num_nans_ptr + start + i, mask=i < count, other=0)
                total += tl.sum(nans.to(tl.int64), axis=0)
            tl.store(row + max_num_logits_per_req + 2, total)


def pack_sampler_output(
    grid: Grid,
    packed_ptr: torch.Tensor,
    packed_stride: int,
    sampled_token_ids_ptr: torch.Tensor,
    sampled_token_ids_stride: int,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    num_nans_ptr: torch.Tensor | None,
    local_cu_num_logits_ptr: torch.Tensor | None,
    max_num_logits_per_req: int,
    num_src_cols: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    has_nans = num_nans_ptr is not None
    _pack_output_kernel[(_geometry.programs(packed_ptr.device, num_reqs),)](
        packed_ptr,
        packed_stride,
        sampled_token_ids_ptr,
        sampled_token_ids_stride,
        num_sampled_ptr,
        num_rejected_ptr,
        num_nans_ptr if has_nans else num_sampled_ptr,
        local_cu_num_logits_ptr if has_nans else num_sampled_ptr,
        num_reqs,
        max_num_logits_per_req,
        max(0, min(max_num_logits_per_req, BLOCK_SIZE)),
        num_src_cols,
        BLOCK_SIZE,
        HAS_NANS=has_nans,
        TILE=_TILE,
    )


@triton.jit
def _unpack_output_kernel(
    gathered_ptr,
    gathered_stride,
    gathered_src_indices_ptr,
    sampled_token_ids_ptr,
    num_sampled_ptr,
    num_rejected_ptr,
    num_nans_ptr,
    num_reqs,
    max_num_logits_per_req,
    width,
    HAS_NANS: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for r in range(pid, num_reqs, programs):
        row = gathered_ptr + tl.load(gathered_src_indices_ptr + r).to(tl.int64) * gathered_stride
        dst = sampled_token_ids_ptr + tl.cast(r, tl.int64) * max_num_logits_per_req
        for c0 in range(0, width, TILE):
            c = c0 + tl.arange(0, TILE)
            tokens = tl.load(row + c, mask=c < width)
            tl.store(dst + c, tokens.to(sampled_token_ids_ptr.dtype.element_ty), mask=c < width)
        tl.store(num_sampled_ptr + r, tl.load(row + max_num_logits_per_req).to(tl.int32))
        tl.store(num_rejected_ptr + r, tl.load(row + max_num_logits_per_req + 1).to(tl.int32))
        if HAS_NANS:
            tl.store(num_nans_ptr + r, tl.load(row + max_num_logits_per_req + 2).to(tl.int32))


def unpack_gathered_output(
    grid: Grid,
    gathered_ptr: torch.Tensor,
    gathered_stride: int,
    gathered_src_indices_ptr: torch.Tensor,
    sampled_token_ids_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    num_nans_ptr: torch.Tensor | None,
    max_num_logits_per_req: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    has_nans = num_nans_ptr is not None
    _unpack_output_kernel[(_geometry.programs(gathered_ptr.device, num_reqs),)](
        gathered_ptr,
        gathered_stride,
        gathered_src_indices_ptr,
        sampled_token_ids_ptr,
        num_sampled_ptr,
        num_rejected_ptr,
        num_nans_ptr if has_nans else num_sampled_ptr,
        num_reqs,
        max_num_logits_per_req,
        max(0, min(max_num_logits_per_req, BLOCK_SIZE)),
        HAS_NANS=has_nans,
        TILE=_TILE,
    )


@triton.jit
def _pack_logprobs_kernel(
    send_ids_ptr,
    send_ids_stride,
    send_logprobs_ptr,
    send_logprobs_stride,
    src_ids_ptr,
    src_ids_stride,
    src_logprobs_ptr,
    src_logprobs_stride,
    selected_token_ranks_ptr,
    local_cu_num_logits_ptr,
    num_reqs,
    positions,
    max_num_logits_per_req,
    num_logprob_cols,
    width,
    num_src_cols,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for r in range(pid, num_reqs, programs):
        start = tl.load(local_cu_num_logits_ptr + r)
        count = tl.minimum(tl.load(local_cu_num_logits_ptr + r + 1) - start, positions)
        for pos in range(0, count):
            src = (start + pos).to(tl.int64)
            dst = tl.cast(r, tl.int64) * max_num_logits_per_req + pos
            ids_row = send_ids_ptr + dst * send_ids_stride
            for c0 in range(0, width, TILE):
                c = c0 + tl.arange(0, TILE)
                live = (c < num_src_cols) & (c < width)
                ids = tl.load(src_ids_ptr + src * src_ids_stride + c, mask=live, other=0)
                logprobs = tl.load(
                    src_logprobs_ptr + src * src_logprobs_stride + c, mask=live, other=float("-inf")
                )
                tl.store(ids_row + c, ids.to(tl.int64), mask=c < width)
                tl.store(
                    send_logprobs_ptr + dst * send_logprobs_stride + c,
                    logprobs.to(tl.float32),
                    mask=c < width,
                )
            tl.store(ids_row + num_logprob_cols, tl.load(selected_token_ranks_ptr + src).to(tl.int64))


def pack_logprobs(
    grid: Grid,
    send_ids_ptr: torch.Tensor,
    send_ids_stride: int,
    send_logprobs_ptr: torch.Tensor,
    send_logprobs_stride: int,
    src_ids_ptr: torch.Tensor,
    src_ids_stride: int,
    src_logprobs_ptr: torch.Tensor,
    src_logprobs_stride: int,
    selected_token_ranks_ptr: torch.Tensor,
    local_cu_num_logits_ptr: torch.Tensor,
    max_num_logits_per_req: int,
    num_logprob_cols: int,
    num_src_cols: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs, positions = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or positions == 0:
        return
    _pack_logprobs_kernel[(_geometry.programs(send_ids_ptr.device, num_reqs),)](
        send_ids_ptr,
        send_ids_stride,
        send_logprobs_ptr,
        send_logprobs_stride,
        src_ids_ptr,
        src_ids_stride,
        src_logprobs_ptr,
        src_logprobs_stride,
        selected_token_ranks_ptr,
        local_cu_num_logits_ptr,
        num_reqs,
        positions,
        max_num_logits_per_req,
        num_logprob_cols,
        max(0, min(num_logprob_cols, BLOCK_SIZE)),
        num_src_cols,
        TILE=_TILE,
    )


@triton.jit
def _unpack_logprobs_kernel(
    gathered_ids_ptr,
    gathered_ids_stride,
    gathered_logprobs_ptr,
    gathered_logprobs_stride,
    gathered_src_indices_ptr,
    cu_num_logits_ptr,
    logprob_token_ids_ptr,
    logprobs_ptr,
    selected_token_ranks_ptr,
    num_reqs,
    positions,
    max_num_logits_per_req,
    num_logprob_cols,
    width,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for r in range(pid, num_reqs, programs):
        start = tl.load(cu_num_logits_ptr + r)
        count = tl.minimum(tl.load(cu_num_logits_ptr + r + 1) - start, positions)
        base = tl.load(gathered_src_indices_ptr + r).to(tl.int64) * max_num_logits_per_req
        for pos in range(0, count):
            src = base + pos
            dst = (start + pos).to(tl.int64)
            ids_row = gathered_ids_ptr + src * gathered_ids_stride
            for c0 in range(0, width, TILE):
                c = c0 + tl.arange(0, TILE)
                m = c < width
                ids = tl.load(ids_row + c, mask=m)
                tl.store(
                    logprob_token_ids_ptr + dst * num_logprob_cols + c,
                    ids.to(logprob_token_ids_ptr.dtype.element_ty),
                    mask=m,
                )
                logprobs = tl.load(gathered_logprobs_ptr + src * gathered_logprobs_stride + c, mask=m)
                tl.store(
                    logprobs_ptr + dst * num_logprob_cols + c,
                    logprobs.to(logprobs_ptr.dtype.element_ty),
                    mask=m,
                )
            rank = tl.load(ids_row + num_logprob_cols)
            tl.store(selected_token_ranks_ptr + dst, rank.to(selected_token_ranks_ptr.dtype.element_ty))


def unpack_logprobs(
    grid: Grid,
    gathered_ids_ptr: torch.Tensor,
    gathered_ids_stride: int,
    gathered_logprobs_ptr: torch.Tensor,
    gathered_logprobs_stride: int,
    gathered_src_indices_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    logprob_token_ids_ptr: torch.Tensor,
    logprobs_ptr: torch.Tensor,
    selected_token_ranks_ptr: torch.Tensor,
    max_num_logits_per_req: int,
    num_logprob_cols: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs, positions = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or positions == 0:
        return
    _unpack_logprobs_kernel[(_geometry.programs(gathered_ids_ptr.device, num_reqs),)](
        gathered_ids_ptr,
        gathered_ids_stride,
        gathered_logprobs_ptr,
        gathered_logprobs_stride,
        gathered_src_indices_ptr,
        cu_num_logits_ptr,
        logprob_token_ids_ptr,
        logprobs_ptr,
        selected_token_ranks_ptr,
        num_reqs,
        positions,
        max_num_logits_per_req,
        num_logprob_cols,
        max(0, min(num_logprob_cols, BLOCK_SIZE)),
        TILE=_TILE,
    )
