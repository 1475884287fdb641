"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_logprob`.

One program per vector core walks the rows grid-stride over UB-sized tiles: the log-softmax at chosen
ids (a max pass, a sum-of-exponentials pass, a gather), the rank of a token (a counting pass), and the
logprob token-id table."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim


def _programs(rows: int, device: torch.device) -> int:
    return max(1, min(rows, geometry(device).persistent_programs()))


def _tile(vocab_size: int, device: torch.device, live: int) -> int:
    return min(
        triton.next_power_of_2(max(vocab_size, 1)), ub_cap(device, 32 if IS_INTERPRETED else 8192, live)
    )


@triton.jit
def _topk_log_softmax_kernel(
    output_ptr,
    logits_ptr,
    logits_stride,
    ids_ptr,
    ids_stride,
    batch,
    topk,
    vocab_size,
    TILE: tl.constexpr,
    TOPK_TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for r in range(pid, batch, programs):
        r64 = tl.cast(r, tl.int64)
        row = logits_ptr + r64 * logits_stride
        row_max = tl.full([], float("-inf"), tl.float32)
        for start in range(0, vocab_size, TILE):
            offs = start + tl.arange(0, TILE)
            x = tl.load(row + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
            row_max = tl.maximum(row_max, tl.max(tl.where(x != x, float("-inf"), x), axis=0))
        total = tl.full([], 0.0, tl.float32)
        for start in range(0, vocab_size, TILE):
            offs = start + tl.arange(0, TILE)
            mask = offs < vocab_size
            x = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
            total += tl.sum(tl.where(mask, tl.exp(x - row_max), 0.0), axis=0)
        lse = tl.log(total)
        for start in range(0, topk, TOPK_TILE):
            k = start + tl.arange(0, TOPK_TILE)
            k_mask = k < topk
            ids = tl.load(ids_ptr + r64 * ids_stride + k, mask=k_mask, other=0)
            x = tl.load(row + ids, mask=k_mask, other=0.0).to(tl.float32)
            tl.store(output_ptr + r64 * topk + k, (x - row_max) - lse, mask=k_mask)


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
    if batch == 0 or topk <= 0:
        return
    device = logits_ptr.device
    _topk_log_softmax_kernel[(_programs(batch, device),)](
        output_ptr,
        logits_ptr,
        logits_stride,
        topk_ids_ptr,
        topk_ids_stride,
        batch,
        topk,
        vocab_size,
        TILE=_tile(vocab_size, device, 3),
        TOPK_TILE=min(triton.next_power_of_2(topk), 1024),
    )


@triton.jit
def _ranks_kernel(
    output_ptr, logits_ptr, logits_stride, token_ids_ptr, batch, vocab_size, TILE: tl.constexpr
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for r in range(pid, batch, programs):
        row = logits_ptr + tl.cast(r, tl.int64) * logits_stride
        chosen = tl.load(row + tl.load(token_ids_ptr + r)).to(tl.float32)
        count = tl.full([], 0, tl.int32)
        for start in range(0, vocab_size, TILE):
            offs = start + tl.arange(0, TILE)
            x = tl.load(row + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
            count += tl.sum(((x >= chosen) & (offs < vocab_size)).to(tl.int32), axis=0)
        tl.store(output_ptr + r, count.to(output_ptr.dtype.element_ty))


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
    _ranks_kernel[(_programs(batch, device),)](
        output_ptr,
        logits_ptr,
        logits_stride,
        token_ids_ptr,
        batch,
        vocab_size,
        TILE=_tile(vocab_size, device, 2),
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
    _fill_logprob_token_ids_kernel[(_programs(batch, out_token_ids_ptr.device),)](
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
