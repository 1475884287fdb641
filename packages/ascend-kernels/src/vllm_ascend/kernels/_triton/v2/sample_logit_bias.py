"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_logit_bias`.

One program per vector core walks the token rows grid-stride; the id lists (at most ``BLOCK_SIZE``
entries) are one gather each, the row sweeps (the allowed-ids fill, the all-masked scan) UB-sized
tiles. ``-inf`` is stored as a float32 tile cast to the logits' dtype (no bfloat16 constants)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


@triton.jit
def _bias_kernel(
    logits_ptr,
    logits_stride,
    vocab_size,
    idx_mapping_ptr,
    num_allowed_ptr,
    allowed_ptr,
    allowed_stride,
    num_bias_ptr,
    bias_ids_ptr,
    bias_ids_stride,
    bias_ptr,
    bias_stride,
    pos_ptr,
    min_lens_ptr,
    num_stop_ptr,
    restore_ptr,
    stop_ptr,
    stop_stride,
    num_tokens,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    CHECK_ALL_MASKED_ROWS: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    dtype = logits_ptr.dtype.element_ty
    lanes = tl.arange(0, BLOCK_SIZE)
    neg_inf_tile = tl.full([TILE], float("-inf"), tl.float32).to(dtype)
    neg_inf_lanes = tl.full([BLOCK_SIZE], float("-inf"), tl.float32).to(dtype)
    for token in range(pid, num_tokens, programs):
        state = tl.load(idx_mapping_ptr + token).to(tl.int64)
        row = logits_ptr + tl.cast(token, tl.int64) * logits_stride

        num_allowed = tl.load(num_allowed_ptr + state)
        if num_allowed > 0:
            live = lanes < num_allowed
            ids = tl.load(allowed_ptr + state * allowed_stride + lanes, mask=live, other=0)
            kept = tl.load(row + ids, mask=live)
            tl.debug_barrier()
            for start in range(0, vocab_size, TILE):
                offs = start + tl.arange(0, TILE)
                tl.store(row + offs, neg_inf_tile, mask=offs < vocab_size)
            tl.debug_barrier()
            tl.store(row + ids, kept, mask=live)

        num_bias = tl.load(num_bias_ptr + state)
        if num_bias > 0:
            live = lanes < num_bias
            ids = tl.load(bias_ids_ptr + state * bias_ids_stride + lanes, mask=live, other=0)
            bias = tl.load(bias_ptr + state * bias_stride + lanes, mask=live, other=0.0).to(tl.float32)
            x = tl.load(row + ids, mask=live, other=0.0).to(tl.float32)
            tl.store(row + ids, (x + bias).to(dtype), mask=live)

        num_stop = tl.load(num_stop_ptr + state)
        pos = tl.load(pos_ptr + token)
        min_len = tl.load(min_lens_ptr + state)
        if (num_stop > 0) & (pos + 1 < min_len):
            live = lanes < num_stop
            ids = tl.load(stop_ptr + state * stop_stride + lanes, mask=live, other=0)
            restore = 0
            if CHECK_ALL_MASKED_ROWS:
                restore = tl.load(restore_ptr + state)
            if restore != 0:
                saved = tl.load(row + ids, mask=live, other=0.0).to(tl.float32)
                tl.debug_barrier()
                tl.store(row + ids, neg_inf_lanes, mask=live)
                tl.debug_barrier()
                row_max = tl.full([], float("-inf"), tl.float32)
                for start in range(0, vocab_size, TILE):
                    offs = start + tl.arange(0, TILE)
                    x = tl.load(row + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
                    row_max = tl.maximum(row_max, tl.max(tl.where(x != x, float("-inf"), x), axis=0))
                if row_max == float("-inf"):
                    finite = (saved > float("-inf")) & (saved < float("inf"))
                    tl.store(row + ids, saved.to(dtype), mask=live & finite)
            else:
                tl.store(row + ids, neg_inf_lanes, mask=live)


def bias(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    vocab_size: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    num_allowed_token_ids_ptr: torch.Tensor,
    allowed_token_ids_ptr: torch.Tensor,
    allowed_token_ids_stride: int,
    num_logit_bias_ptr: torch.Tensor,
    bias_token_ids_ptr: torch.Tensor,
    bias_token_ids_stride: int,
    bias_ptr: torch.Tensor,
    bias_stride: int,
    pos_ptr: torch.Tensor,
    min_lens_ptr: torch.Tensor,
    num_stop_token_ids_ptr: torch.Tensor,
    restore_when_all_masked_ptr: torch.Tensor,
    stop_token_ids_ptr: torch.Tensor,
    stop_token_ids_stride: int,
    BLOCK_SIZE: int,
    LOGITS_BLOCK_SIZE: int,
    CHECK_ALL_MASKED_ROWS: bool,
) -> None:
    num_tokens = grid_dim(grid, 0)
    if num_tokens == 0:
        return
    device = logits_ptr.device
    programs = _geometry.programs(device, num_tokens)
    _bias_kernel[(programs,)](
        logits_ptr,
        logits_stride,
        vocab_size,
        expanded_idx_mapping_ptr,
        num_allowed_token_ids_ptr,
        allowed_token_ids_ptr,
        allowed_token_ids_stride,
        num_logit_bias_ptr,
        bias_token_ids_ptr,
        bias_token_ids_stride,
        bias_ptr,
        bias_stride,
        pos_ptr,
        min_lens_ptr,
        num_stop_token_ids_ptr,
        restore_when_all_masked_ptr,
        stop_token_ids_ptr,
        stop_token_ids_stride,
        num_tokens,
        BLOCK_SIZE=BLOCK_SIZE,
        TILE=min(next_power_of_2(max(vocab_size, 1)), ub_cap(device, 32 if IS_INTERPRETED else 8192, 2)),
        CHECK_ALL_MASKED_ROWS=CHECK_ALL_MASKED_ROWS,
    )
