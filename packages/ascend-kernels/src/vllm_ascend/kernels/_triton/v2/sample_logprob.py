"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_logprob`.

The log-softmax at chosen ids and the rank of a token reduce over a row: its work items are ``(row,
column chunk)`` (``LaunchGeometry.column_split``: a tile each on CUDA; on Ascend whole rows once the rows
fill the vector cores). A chunk's partial (``(max, sum of exponentials)`` from a max pass and a sum pass
over UB-sized tiles; a count of the values at least the chosen one's) goes to a scratch row, and the
row's last chunk to finish (:func:`.common.last_chunk`) combines them and writes the row: one launch
either way. Unsplit rows write directly. The logprob token-id table walks the rows grid-stride."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, counters, last_chunk, scratch, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2

#: Partials read at once by a combining chunk.
COMBINE_BLOCK = 32


def _tile(vocab_size: int, device: torch.device, live: int) -> int:
    return min(next_power_of_2(max(vocab_size, 1)), ub_cap(device, 32 if IS_INTERPRETED else 8192, live))


@triton.jit
def _combine(part_m_ptr, part_s_ptr, base, chunks, CB: tl.constexpr):
    """A row's ``(max, sum of exp(x - max))`` from its ``chunks`` partials at ``base``."""
    row_max = tl.full([], float("-inf"), tl.float32)
    for c0 in range(0, chunks, CB):
        c = c0 + tl.arange(0, CB)
        m = tl.load(part_m_ptr + base + c, mask=c < chunks, other=float("-inf"))
        row_max = tl.maximum(row_max, tl.max(m, axis=0))
    shift = tl.where(row_max > float("-inf"), row_max, 0.0)
    total = tl.full([], 0.0, tl.float32)
    for c0 in range(0, chunks, CB):
        c = c0 + tl.arange(0, CB)
        live = c < chunks
        m = tl.load(part_m_ptr + base + c, mask=live, other=float("-inf"))
        s = tl.load(part_s_ptr + base + c, mask=live, other=0.0)
        total += tl.sum(tl.where(live, s * tl.exp(m - shift), 0.0), axis=0)
    return row_max, total


@triton.jit
def _store_topk(output_ptr, row, r64, ids_ptr, ids_stride, topk, row_max, total, TOPK_TILE: tl.constexpr):
    """``log_softmax`` of the row at its ``topk`` ids: ``x - max - log(sum of exp(x - max))``."""
    lse = tl.log(total)
    for start in range(0, topk, TOPK_TILE):
        k = start + tl.arange(0, TOPK_TILE)
        k_mask = k < topk
        ids = tl.load(ids_ptr + r64 * ids_stride + k, mask=k_mask, other=0)
        x = tl.load(row + ids, mask=k_mask, other=0.0).to(tl.float32)
        tl.store(output_ptr + r64 * topk + k, (x - row_max) - lse, mask=k_mask)


@triton.jit
def _topk_log_softmax_kernel(
    output_ptr,
    logits_ptr,
    logits_stride,
    ids_ptr,
    ids_stride,
    part_m_ptr,
    part_s_ptr,
    counter_ptr,
    batch,
    topk,
    vocab_size,
    chunks,
    chunk,
    TILE: tl.constexpr,
    TOPK_TILE: tl.constexpr,
    CB: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, batch * chunks, programs):
        r = item // chunks
        part = item - r * chunks
        begin = part * chunk
        end = tl.minimum(begin + chunk, vocab_size)
        r64 = tl.cast(r, tl.int64)
        row = logits_ptr + r64 * logits_stride
        row_max = tl.full([], float("-inf"), tl.float32)
        for start in range(begin, end, TILE):
            offs = start + tl.arange(0, TILE)
            x = tl.load(row + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
            row_max = tl.maximum(row_max, tl.max(tl.where(x != x, float("-inf"), x), axis=0))
        # A chunk of -inf only: its sum is 0 (exp(-inf - 0)), not exp(-inf - -inf).
        shift = tl.where(row_max > float("-inf"), row_max, 0.0)
        total = tl.full([], 0.0, tl.float32)
        for start in range(begin, end, TILE):
            offs = start + tl.arange(0, TILE)
            mask = offs < end
            x = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
            total += tl.sum(tl.where(mask, tl.exp(x - shift), 0.0), axis=0)
        if chunks == 1:
            _store_topk(output_ptr, row, r64, ids_ptr, ids_stride, topk, row_max, total, TOPK_TILE)
        else:
            tl.store(part_m_ptr + r64 * chunks + part, row_max)
            tl.store(part_s_ptr + r64 * chunks + part, total)
            if last_chunk(counter_ptr, r, chunks):
                row_max, total = _combine(part_m_ptr, part_s_ptr, r64 * chunks, chunks, CB)
                _store_topk(output_ptr, row, r64, ids_ptr, ids_stride, topk, row_max, total, TOPK_TILE)


def topk_log_softmax(
    grid: Grid,
    output_ptr: torch.Tensor,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    topk_ids_ptr: torch.Tensor,
    topk_ids_stride: int,
    topk: int,
    vocab_size: int,
    BLOCK_SIZE: int,
    TOPK_BLOCK_SIZE: int,
) -> None:
    batch = grid_dim(grid, 0)
    if batch == 0 or topk <= 0 or vocab_size <= 0:
        return
    device = logits_ptr.device
    geometry = _geometry.geometry(device)
    tile = _tile(vocab_size, device, 3)
    chunks, chunk = geometry.column_split(batch, vocab_size, tile)
    _topk_log_softmax_kernel[(geometry.programs(batch * chunks),)](
        output_ptr,
        logits_ptr,
        logits_stride,
        topk_ids_ptr,
        topk_ids_stride,
        scratch("v2_lse_max", batch * chunks, torch.float32, device),
        scratch("v2_lse_sum", batch * chunks, torch.float32, device),
        counters("v2_lse_counter", batch, device),
        batch,
        topk,
        vocab_size,
        chunks,
        chunk,
        TILE=tile,
        TOPK_TILE=min(next_power_of_2(topk), 1024),
        CB=COMBINE_BLOCK,
    )


@triton.jit
def _ranks_kernel(
    output_ptr,
    logits_ptr,
    logits_stride,
    token_ids_ptr,
    part_count_ptr,
    counter_ptr,
    batch,
    vocab_size,
    chunks,
    chunk,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, batch * chunks, programs):
        r = item // chunks
        begin = (item - r * chunks) * chunk
        end = tl.minimum(begin + chunk, vocab_size)
        row = logits_ptr + tl.cast(r, tl.int64) * logits_stride
        chosen = tl.load(row + tl.load(token_ids_ptr + r)).to(tl.float32)
        count = tl.full([], 0, tl.int32)
        for start in range(begin, end, TILE):
            offs = start + tl.arange(0, TILE)
            x = tl.load(row + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
            count += tl.sum(((x >= chosen) & (offs < end)).to(tl.int32), axis=0)
        if chunks == 1:
            tl.store(output_ptr + r, count.to(output_ptr.dtype.element_ty))
        else:
            # The counts add up in the row's zeroed slot; the last chunk takes the sum and re-zeroes it.
            tl.atomic_add(part_count_ptr + r, count)
            if last_chunk(counter_ptr, r, chunks):
                total = tl.atomic_xchg(part_count_ptr + r, 0)
                tl.store(output_ptr + r, total.to(output_ptr.dtype.element_ty))


def ranks(
    grid: Grid,
    output_ptr: torch.Tensor,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    token_ids_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    batch = grid_dim(grid, 0)
    if batch == 0:
        return
    device = logits_ptr.device
    geometry = _geometry.geometry(device)
    tile = _tile(vocab_size, device, 2)
    chunks, chunk = geometry.column_split(batch, vocab_size, tile)
    _ranks_kernel[(geometry.programs(batch * chunks),)](
        output_ptr,
        logits_ptr,
        logits_stride,
        token_ids_ptr,
        counters("v2_rank_count", batch, device),
        counters("v2_rank_counter", batch, device),
        batch,
        vocab_size,
        chunks,
        chunk,
        TILE=tile,
    )


@triton.jit
def _fill_logprob_token_ids_kernel(
    out_ids_ptr,
    out_ids_stride,
    out_valid_ptr,
    out_valid_stride,
    sampled_ptr,
    topk_ptr,
    topk_stride,
    idx_mapping_ptr,
    num_custom_ptr,
    custom_ptr,
    custom_stride,
    batch,
    NUM_TOPK: tl.constexpr,
    PADDED_COLS: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, PADDED_COLS)
    for b in range(pid, batch, programs):
        b64 = tl.cast(b, tl.int64)
        ids_row = out_ids_ptr + b64 * out_ids_stride
        valid_row = out_valid_ptr + b64 * out_valid_stride
        tl.store(ids_row, tl.load(sampled_ptr + b).to(out_ids_ptr.dtype.element_ty))
        tl.store(valid_row, tl.full([], 1, tl.int1).to(out_valid_ptr.dtype.element_ty))
        state = tl.load(idx_mapping_ptr + b).to(tl.int64)
        num_custom = tl.load(num_custom_ptr + state)
        ones = tl.full([PADDED_COLS], 1, tl.int1).to(out_valid_ptr.dtype.element_ty)
        if num_custom > 0:
            live = cols < num_custom
            tokens = tl.load(custom_ptr + state * custom_stride + cols, mask=live, other=0)
            tl.store(ids_row + 1 + cols, tokens.to(out_ids_ptr.dtype.element_ty), mask=live)
            tl.store(valid_row + 1 + cols, ones, mask=live)
        elif NUM_TOPK > 0:
            live = cols < NUM_TOPK
            tokens = tl.load(topk_ptr + b64 * topk_stride + cols, mask=live, other=0)
            tl.store(ids_row + 1 + cols, tokens.to(out_ids_ptr.dtype.element_ty), mask=live)
            tl.store(valid_row + 1 + cols, ones, mask=live)


def fill_logprob_token_ids(
    grid: Grid,
    out_token_ids_ptr: torch.Tensor,
    out_token_ids_stride: int,
    out_valid_mask_ptr: torch.Tensor,
    out_valid_mask_stride: int,
    sampled_token_ids_ptr: torch.Tensor,
    topk_indices_ptr: torch.Tensor,
    topk_indices_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    num_per_req_token_ids_ptr: torch.Tensor,
    per_req_token_ids_ptr: torch.Tensor,
    per_req_token_ids_stride: int,
    NUM_TOPK: int,
    PADDED_COLS: int,
) -> None:
    batch = grid_dim(grid, 0)
    if batch == 0:
        return
    _fill_logprob_token_ids_kernel[(_geometry.programs(out_token_ids_ptr.device, batch),)](
        out_token_ids_ptr,
        out_token_ids_stride,
        out_valid_mask_ptr,
        out_valid_mask_stride,
        sampled_token_ids_ptr,
        topk_indices_ptr,
        topk_indices_stride,
        expanded_idx_mapping_ptr,
        num_per_req_token_ids_ptr,
        per_req_token_ids_ptr,
        per_req_token_ids_stride,
        batch,
        NUM_TOPK=NUM_TOPK,
        PADDED_COLS=PADDED_COLS,
    )
