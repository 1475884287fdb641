"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_watermark`.

One program per vector core walks the rows (mask) or the ``(row, vocabulary block)`` pairs (sampling)
grid-stride. Philox's 32x32-bit high/low products come from one uint64 product (no ``umulhi``); a
block's context state is absorbed once, then each tile draws one Philox counter per four token ids
(the four words are the four lanes ``4g + i``, loaded as four strided vectors). The blocks' argmaxes
are leftmost-first across the lanes and the tiles, as vLLM's. The seeded rows (``skip_mask``) reuse
the murmur3 Gumbel helpers of ``sample_gumbel``; fp64 launches run the torch reference (no fp64 on
Ascend's vector units).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels._triton.v2.sample_gumbel import (
    gumbel_from_uniform,
    murmur3_prefix,
    murmur3_uniform_from_prefix,
)
from vllm_ascend.kernels.v2 import sample_watermark as reference
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2

_M0 = tl.constexpr(reference.PHILOX_M0)
_M1 = tl.constexpr(reference.PHILOX_M1)
_W0 = tl.constexpr(reference.PHILOX_W0)
_W1 = tl.constexpr(reference.PHILOX_W1)
_U32 = tl.constexpr(reference.U32)
_CONTEXT_DOMAIN = tl.constexpr(reference.CONTEXT_DOMAIN)
_TOKEN_DOMAIN = tl.constexpr(reference.TOKEN_DOMAIN)
_SALT = tl.constexpr(reference.DRAFT_NOISE_SALT)


@triton.jit
def _philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 (uint32 words)."""
    for round_index in tl.static_range(10):
        p0 = c0.to(tl.uint64) * _M0
        p1 = c2.to(tl.uint64) * _M1
        hi0 = (p0 >> 32).to(tl.uint32)
        hi1 = (p1 >> 32).to(tl.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, p1.to(tl.uint32), hi0 ^ c3 ^ k1, p0.to(tl.uint32)
        if round_index != 9:
            k0 = k0 + _W0
            k1 = k1 + _W1
    return c0, c1, c2, c3


@triton.jit
def _context_word(row_ptr, index: tl.constexpr, WIDTH: tl.constexpr):
    if index < WIDTH:
        word = tl.load(row_ptr + index).to(tl.uint32)
    else:
        word = tl.full([], _U32 - (index % 4), tl.uint32)
    return word


@triton.jit
def _context_state(row_ptr, k0, k1, WIDTH: tl.constexpr):
    s0 = tl.full([], _CONTEXT_DOMAIN, tl.uint32)
    s1 = tl.full([], WIDTH, tl.uint32)
    s2 = tl.full([], 0, tl.uint32)
    s3 = tl.full([], 0, tl.uint32)
    for offset in tl.static_range(0, WIDTH, 4):
        s0, s1, s2, s3 = _philox(
            s0 ^ _context_word(row_ptr, offset, WIDTH),
            s1 ^ _context_word(row_ptr, offset + 1, WIDTH),
            s2 ^ _context_word(row_ptr, offset + 2, WIDTH),
            s3 ^ _context_word(row_ptr, offset + 3, WIDTH),
            k0 ^ offset,
            k1,
        )
    return s0, s1, s2, s3


@triton.jit
def _keyed_value(logits_row, token, vocab_size, word):
    """``logit - log(-log(u))`` of ``token`` (NaN and out-of-vocabulary as ``-inf``), ``u`` the float
    just below ``((word >> 8) + 1) * 2**-24``."""
    logit = tl.load(logits_row + token, mask=token < vocab_size, other=float("-inf")).to(tl.float32)
    logit = tl.where(logit != logit, float("-inf"), logit)
    scaled = ((word >> 8) + 1).to(tl.float32) * 5.960464477539063e-08
    uniform = (scaled.to(tl.uint32, bitcast=True) - 1).to(tl.float32, bitcast=True)
    return logit - tl.log(-tl.log(uniform))


@triton.jit
def _take_larger(best, best_token, value, token):
    larger = value > best
    return tl.where(larger, value, best), tl.where(larger, token, best_token)


@triton.jit
def _philox_gumbel_kernel(
    local_argmax_ptr,
    local_argmax_stride,
    local_max_ptr,
    local_max_stride,
    logits_ptr,
    logits_stride,
    contexts_ptr,
    context_stride,
    skip_mask_ptr,
    idx_mapping_ptr,
    seeds_ptr,
    pos_ptr,
    temp_ptr,
    cache_ptr,
    cache_stride_0,
    cache_stride_1,
    cache_col_ptr,
    source_ptr,
    source_stride,
    key_0_value,
    key_1_value,
    vocab_size,
    num_rows,
    num_blocks,
    CONTEXT_WIDTH: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    HAS_MAPPING: tl.constexpr,
    HAS_SKIP: tl.constexpr,
    HAS_CACHE: tl.constexpr,
    IS_DRAFTING: tl.constexpr,
    PER_TOKEN_COL: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    k0 = key_0_value.to(tl.uint32)
    k1 = key_1_value.to(tl.uint32)
    for item in range(pid, num_rows * num_blocks, programs):
        row = item // num_blocks
        block = item - row * num_blocks
        block_start = block * BLOCK_SIZE
        row64 = tl.cast(row, tl.int64)
        if HAS_MAPPING:
            req = tl.load(idx_mapping_ptr + row).to(tl.int64)
        else:
            req = row64
        valid = req >= 0
        logits_row = logits_ptr + row64 * logits_stride
        if HAS_CACHE:
            if valid:
                if PER_TOKEN_COL:
                    col = tl.load(cache_col_ptr + row).to(tl.int64)
                else:
                    col = tl.load(cache_col_ptr).to(tl.int64)
                cache_row = cache_ptr + req * cache_stride_0 + col * cache_stride_1
                for start in range(0, BLOCK_SIZE, TILE):
                    offs = block_start + start + tl.arange(0, TILE)
                    raw = tl.load(source_ptr + row64 * source_stride + offs, mask=offs < vocab_size)
                    tl.store(cache_row + offs, raw, mask=offs < vocab_size)
        seeded = False
        if HAS_SKIP:
            seeded = tl.load(skip_mask_ptr + row) != 0
        best = tl.full([], float("-inf"), tl.float32)
        best_token = tl.full([], 0, tl.int32) + block_start
        if seeded:
            state = tl.where(valid, req, 0)
            temp = tl.where(valid, tl.load(temp_ptr + state).to(tl.float32), 0.0)
            seed = tl.where(valid, tl.load(seeds_ptr + state).to(tl.int64), 0)
            pos = tl.load(pos_ptr + row).to(tl.int64)
            if IS_DRAFTING:
                pos = pos + _SALT
            prefix = murmur3_prefix(seed, pos)
            for start in range(0, BLOCK_SIZE, TILE):
                offs = block_start + start + tl.arange(0, TILE)
                mask = offs < vocab_size
                x = tl.load(logits_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
                if temp != 0.0:
                    noise = gumbel_from_uniform(murmur3_uniform_from_prefix(prefix, offs))
                    x = tl.where(mask, x + noise, float("-inf"))
                value, index = tl.max(x, axis=0, return_indices=True)
                larger = value > best
                best_token = tl.where(larger, block_start + start + index.to(tl.int32), best_token)
                best = tl.where(larger, value, best)
        else:
            s0, s1, s2, s3 = _context_state(contexts_ptr + row64 * context_stride, k0, k1, CONTEXT_WIDTH)
            draw_k0 = k0 ^ s3
            draw_k1 = k1 ^ _TOKEN_DOMAIN
            for start in range(0, BLOCK_SIZE, TILE):
                groups = (block_start + start) // 4 + tl.arange(0, TILE // 4)
                zero = groups.to(tl.uint32) * 0
                w0, w1, w2, w3 = _philox(
                    groups.to(tl.uint32), s0 + zero, s1 + zero, s2 + zero, draw_k0 + zero, draw_k1 + zero
                )
                token = groups * 4
                lane_best = _keyed_value(logits_row, token, vocab_size, w0)
                lane_token = token
                lane_best, lane_token = _take_larger(
                    lane_best, lane_token, _keyed_value(logits_row, token + 1, vocab_size, w1), token + 1
                )
                lane_best, lane_token = _take_larger(
                    lane_best, lane_token, _keyed_value(logits_row, token + 2, vocab_size, w2), token + 2
                )
                lane_best, lane_token = _take_larger(
                    lane_best, lane_token, _keyed_value(logits_row, token + 3, vocab_size, w3), token + 3
                )
                value = tl.max(lane_best, axis=0)
                first = tl.min(tl.where(lane_best == value, lane_token, 2147483647), axis=0)
                larger = value > best
                best_token = tl.where(larger, first, best_token)
                best = tl.where(larger, value, best)
        tl.store(local_argmax_ptr + row64 * local_argmax_stride + block, best_token.to(tl.int64))
        tl.store(local_max_ptr + row64 * local_max_stride + block, best.to(local_max_ptr.dtype.element_ty))


def philox_gumbel(
    grid: Grid,
    local_argmax_ptr: torch.Tensor,
    local_argmax_stride: int,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    contexts_ptr: torch.Tensor,
    context_stride: int,
    skip_mask_ptr: torch.Tensor | None,
    expanded_idx_mapping_ptr: torch.Tensor | None,
    seeds_ptr: torch.Tensor | None,
    pos_ptr: torch.Tensor | None,
    temp_ptr: torch.Tensor | None,
    logits_cache_ptr: torch.Tensor | None,
    logits_cache_stride_0: int,
    logits_cache_stride_1: int,
    logits_cache_col_ptr: torch.Tensor | None,
    logits_cache_source_ptr: torch.Tensor | None,
    logits_cache_source_stride: int,
    key_0_value: int,
    key_1_value: int,
    vocab_size: int,
    CONTEXT_WIDTH: int,
    BLOCK_SIZE: int,
    USE_FP64: bool,
    IS_DRAFTING: bool,
    PER_TOKEN_COL: bool,
) -> None:
    args = (
        grid,
        local_argmax_ptr,
        local_argmax_stride,
        local_max_ptr,
        local_max_stride,
        logits_ptr,
        logits_stride,
        contexts_ptr,
        context_stride,
        skip_mask_ptr,
        expanded_idx_mapping_ptr,
        seeds_ptr,
        pos_ptr,
        temp_ptr,
        logits_cache_ptr,
        logits_cache_stride_0,
        logits_cache_stride_1,
        logits_cache_col_ptr,
        logits_cache_source_ptr,
        logits_cache_source_stride,
        key_0_value,
        key_1_value,
        vocab_size,
        CONTEXT_WIDTH,
        BLOCK_SIZE,
        USE_FP64,
        IS_DRAFTING,
        PER_TOKEN_COL,
    )
    if USE_FP64:
        # Ascend's vector units have no fp64: the opt-in fp64 draw runs as torch ops on the device.
        reference.philox_gumbel_torch(*args)
        return
    rows, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if rows == 0 or num_blocks == 0:
        return
    device = logits_ptr.device
    has_mapping = expanded_idx_mapping_ptr is not None
    has_skip = skip_mask_ptr is not None
    has_cache = logits_cache_ptr is not None
    programs = _geometry.programs(device, rows * num_blocks)
    tile = max(4, min(BLOCK_SIZE, ub_cap(device, 64 if IS_INTERPRETED else 2048, 12)))
    _philox_gumbel_kernel[(programs,)](
        local_argmax_ptr,
        local_argmax_stride,
        local_max_ptr,
        local_max_stride,
        logits_ptr,
        logits_stride,
        contexts_ptr,
        context_stride,
        skip_mask_ptr if has_skip else logits_ptr,
        expanded_idx_mapping_ptr if has_mapping else logits_ptr,
        seeds_ptr if has_skip else logits_ptr,
        pos_ptr if has_skip else logits_ptr,
        temp_ptr if has_skip else logits_ptr,
        logits_cache_ptr if has_cache else logits_ptr,
        logits_cache_stride_0,
        logits_cache_stride_1,
        logits_cache_col_ptr if has_cache else logits_ptr,
        logits_cache_source_ptr if has_cache else logits_ptr,
        logits_cache_source_stride,
        key_0_value,
        key_1_value,
        vocab_size,
        rows,
        num_blocks,
        CONTEXT_WIDTH=CONTEXT_WIDTH,
        BLOCK_SIZE=BLOCK_SIZE,
        TILE=tile,
        HAS_MAPPING=has_mapping,
        HAS_SKIP=has_skip,
        HAS_CACHE=has_cache,
        IS_DRAFTING=IS_DRAFTING,
        PER_TOKEN_COL=PER_TOKEN_COL,
    )


@triton.jit
def _repeated_context_kernel(
    output_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    req_indices_ptr,
    prompt_lens_ptr,
    total_lens_ptr,
    history_offsets_ptr,
    history_offsets_stride,
    contexts_ptr,
    context_stride,
    local_positions_ptr,
    prior_contexts_ptr,
    prior_contexts_stride_0,
    prior_contexts_stride_1,
    steps_ptr,
    steps_stride,
    enabled_ptr,
    num_rows,
    CONTEXT_WIDTH: tl.constexpr,
    CONTEXT_BLOCK: tl.constexpr,
    NUM_SPECULATIVE_STEPS: tl.constexpr,
    MAX_HISTORY: tl.constexpr,
    INCLUDE_PROMPT: tl.constexpr,
    PARTIAL_LIMIT: tl.constexpr,
    HAS_HISTORY_OFFSETS: tl.constexpr,
    SPECULATIVE_CONTEXTS: tl.constexpr,
    DRAFT_CONTEXTS: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, CONTEXT_BLOCK)
    in_context = cols < CONTEXT_WIDTH
    for row in range(pid, num_rows, programs):
        row64 = tl.cast(row, tl.int64)
        req = tl.load(req_indices_ptr + row).to(tl.int64)
        result = tl.full([], 0, tl.int32)
        if req >= 0:
            prompt_len = tl.load(prompt_lens_ptr + req)
            total_len = tl.load(total_lens_ptr + req)
            if total_len - prompt_len < PARTIAL_LIMIT:
                result = tl.full([], 1, tl.int32)
            else:
                context_row = contexts_ptr + row64 * context_stride
                context = tl.load(context_row + cols, mask=in_context, other=0).to(tl.int64)
                if INCLUDE_PROMPT:
                    sequence_start = prompt_len * 0
                else:
                    sequence_start = prompt_len
                history_len = total_len - sequence_start
                scan_start = history_len * 0
                if MAX_HISTORY > 0:
                    offset = 0
                    if HAS_HISTORY_OFFSETS:
                        offset = tl.load(history_offsets_ptr + row64 * history_offsets_stride)
                    scan_start = tl.maximum(history_len - tl.maximum(MAX_HISTORY - offset, 0), 0)
                history = all_token_ids_ptr + req * all_token_ids_stride + sequence_start
                repeated = tl.full([], 0, tl.int32)
                for p0 in range(scan_start, history_len, TILE):
                    previous = p0 + tl.arange(0, TILE)
                    found = previous < history_len
                    for o in tl.static_range(CONTEXT_WIDTH):
                        past = previous + (o - CONTEXT_WIDTH)
                        token = tl.load(history + past, mask=found & (past >= 0), other=-1).to(tl.int64)
                        found = found & (token == tl.load(context_row + o).to(tl.int64))
                    repeated = repeated | tl.max(found.to(tl.int32), axis=0)
                padded = tl.max(tl.where(in_context & (context < 0), 1, 0), axis=0)
                if SPECULATIVE_CONTEXTS:
                    local_pos = tl.load(local_positions_ptr + row)
                    if INCLUDE_PROMPT:
                        repeated = repeated | padded
                    for back in tl.static_range(1, NUM_SPECULATIVE_STEPS + 1):
                        if (MAX_HISTORY == 0) or (back <= MAX_HISTORY):
                            if (row64 >= back) & (local_pos >= back):
                                prior_row = row64 - back
                                prior_context = tl.load(
                                    contexts_ptr + prior_row * context_stride + cols, mask=in_context, other=0
                                ).to(tl.int64)
                                differ = tl.sum(
                                    tl.where(in_context & (prior_context != context), 1, 0), axis=0
                                )
                                same = (
                                    (tl.load(req_indices_ptr + prior_row).to(tl.int64) == req)
                                    & (tl.load(local_positions_ptr + prior_row) + back == local_pos)
                                    & (differ == 0)
                                )
                                repeated = repeated | same.to(tl.int32)
                if DRAFT_CONTEXTS:
                    step = tl.load(steps_ptr + row64 * steps_stride).to(tl.int64)
                    if INCLUDE_PROMPT:
                        repeated = repeated | padded
                    prior_row_ptr = prior_contexts_ptr + row64 * prior_contexts_stride_0
                    for prior_step in tl.static_range(NUM_SPECULATIVE_STEPS):
                        in_history = step > prior_step
                        if MAX_HISTORY > 0:
                            in_history = in_history & (step - MAX_HISTORY <= prior_step)
                        prior = tl.load(
                            prior_row_ptr + prior_step * prior_contexts_stride_1 + cols,
                            mask=in_context,
                            other=0,
                        ).to(tl.int64)
                        differ = tl.sum(tl.where(in_context & (prior != context), 1, 0), axis=0)
                        repeated = repeated | (in_history & (differ == 0)).to(tl.int32)
                    tl.store(
                        prior_row_ptr + step * prior_contexts_stride_1 + cols,
                        context.to(prior_contexts_ptr.dtype.element_ty),
                        mask=in_context,
                    )
                    enabled = tl.load(enabled_ptr + row).to(tl.int32)
                    repeated = tl.where((enabled != 0) & (repeated == 0), 1, 0)
                result = repeated
        tl.store(output_ptr + row, (result != 0).to(output_ptr.dtype.element_ty))


def repeated_context_mask(
    grid: Grid,
    output_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    req_indices_ptr: torch.Tensor,
    prompt_lens_ptr: torch.Tensor,
    total_lens_ptr: torch.Tensor,
    history_offsets_ptr: torch.Tensor | None,
    history_offsets_stride: int,
    contexts_ptr: torch.Tensor,
    context_stride: int,
    local_positions_ptr: torch.Tensor | None,
    prior_contexts_ptr: torch.Tensor | None,
    prior_contexts_stride_0: int,
    prior_contexts_stride_1: int,
    steps_ptr: torch.Tensor | None,
    steps_stride: int,
    enabled_ptr: torch.Tensor | None,
    CONTEXT_WIDTH: int,
    NUM_SPECULATIVE_STEPS: int,
    MAX_HISTORY: int,
    INCLUDE_PROMPT: bool,
    SKIP_PARTIAL_CONTEXT: bool,
    HAS_HISTORY_OFFSETS: bool,
    SPECULATIVE_CONTEXTS: bool,
    DRAFT_CONTEXTS: bool,
    BLOCK: int,
) -> None:
    rows = grid_dim(grid, 0)
    if rows == 0:
        return
    device = contexts_ptr.device
    programs = _geometry.programs(device, rows)
    dummy = req_indices_ptr
    _repeated_context_kernel[(programs,)](
        output_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        req_indices_ptr,
        prompt_lens_ptr,
        total_lens_ptr,
        history_offsets_ptr if HAS_HISTORY_OFFSETS else dummy,
        history_offsets_stride,
        contexts_ptr,
        context_stride,
        local_positions_ptr if SPECULATIVE_CONTEXTS else dummy,
        prior_contexts_ptr if DRAFT_CONTEXTS else dummy,
        prior_contexts_stride_0,
        prior_contexts_stride_1,
        steps_ptr if DRAFT_CONTEXTS else dummy,
        steps_stride,
        enabled_ptr if DRAFT_CONTEXTS else dummy,
        rows,
        CONTEXT_WIDTH=CONTEXT_WIDTH,
        CONTEXT_BLOCK=next_power_of_2(max(CONTEXT_WIDTH, 1)),
        NUM_SPECULATIVE_STEPS=NUM_SPECULATIVE_STEPS,
        MAX_HISTORY=MAX_HISTORY,
        INCLUDE_PROMPT=INCLUDE_PROMPT,
        PARTIAL_LIMIT=CONTEXT_WIDTH if SKIP_PARTIAL_CONTEXT else -(2**31),
        HAS_HISTORY_OFFSETS=HAS_HISTORY_OFFSETS,
        SPECULATIVE_CONTEXTS=SPECULATIVE_CONTEXTS,
        DRAFT_CONTEXTS=DRAFT_CONTEXTS,
        TILE=min(next_power_of_2(max(BLOCK, 1)), 8 if IS_INTERPRETED else 1024),
    )
