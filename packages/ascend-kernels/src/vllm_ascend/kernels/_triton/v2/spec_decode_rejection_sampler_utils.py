"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.spec_decode_rejection_sampler_utils`.

One program per vector core walks the ``(logits row, vocabulary block)`` pairs (statistics, residual mass,
resampling) or the requests (joint ratio, accept/reject walk, insertion) grid-stride; vLLM launches one
program per pair or per request. A vocabulary block (vLLM's layout: its ``BLOCK_SIZE`` and block count,
which the next kernels read) is swept in UB-sized tiles: block maxima and leftmost argmaxes combined
across tiles, summed exponentials by an online rescale. The acceptance uniform is Triton's ``tl.rand``
stream rebuilt from the Philox helper of ``sample_watermark`` (uint64 products, no ``umulhi``); the
resampling noise is ``sample_gumbel``'s murmur3 stream or ``sample_watermark``'s keyed Philox stream.
``log1p`` is the compensated ``log(1 + x) * x / ((1 + x) - 1)`` (no libdevice). Ascend's vector units have
no fp64: the opt-in fp64 resampling and its insertion run the torch references on the device.
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
from vllm_ascend.kernels._triton.v2.sample_watermark import _context_state, _philox
from vllm_ascend.kernels.v2 import spec_decode_rejection_sampler_utils as reference
from vllm_ascend.kernels.v2._launch import Grid, grid_dim
from vllm_ascend.kernels.v2.sample_watermark import TOKEN_DOMAIN

_RAND_MIN = tl.constexpr(reference.TL_RAND_MIN)
_TOKEN_DOMAIN = tl.constexpr(TOKEN_DOMAIN)
_INTERPRETED_TILE = 8


def _tile(device: torch.device, block: int, live_tiles: int, cap: int = 4096) -> int:
    """A power-of-two tile dividing the (power-of-two) vocabulary block."""
    return min(block, ub_cap(device, _INTERPRETED_TILE if IS_INTERPRETED else cap, live_tiles))


# ---------------------------------------------------------------------------------------------------
# shared device helpers


@triton.jit
def _global_lse(max_ptr, max_stride, sum_ptr, sum_stride, row, num_blocks, PADDED: tl.constexpr):
    """Logsumexp of a logits row from its per-block maxima and summed exponentials."""
    blocks = tl.arange(0, PADDED)
    inside = blocks < num_blocks
    maxes = tl.load(max_ptr + row * max_stride + blocks, mask=inside, other=float("-inf"))
    sums = tl.load(sum_ptr + row * sum_stride + blocks, mask=inside, other=0.0)
    top = tl.max(maxes, axis=0)
    return top + tl.log(tl.sum(sums * tl.exp(maxes - top), axis=0))


@triton.jit
def _leftmost_block(max_ptr, row_offset, num_blocks, PADDED: tl.constexpr):
    """Index of the block with the largest value (NaN as ``-inf``; the leftmost of equals)."""
    blocks = tl.arange(0, PADDED)
    maxes = tl.load(max_ptr + row_offset + blocks, mask=blocks < num_blocks, other=float("-inf"))
    maxes = tl.where(maxes != maxes, float("-inf"), maxes)
    top = tl.max(maxes, axis=0)
    return tl.min(tl.where(maxes == top, blocks, PADDED), axis=0)


@triton.jit
def _accept_uniform(seed, pos, POS_WIDE: tl.constexpr):
    """Triton's ``tl.rand(seed, pos)`` floored at its smallest positive value: word 0 of Philox4x32-10 at
    counter ``(pos low, pos high, 0, 0)`` under key ``(seed low, seed high)``, as int32 with negatives
    complemented, times ``4.6566127342e-10``."""
    seed = seed.to(tl.int64)
    pos = pos.to(tl.int64)
    c0 = pos.to(tl.uint32)
    zero = c0 * 0
    if POS_WIDE:
        c1 = (pos >> 32).to(tl.uint32)
    else:
        c1 = zero
    word, _w1, _w2, _w3 = _philox(c0, c1, zero, zero, seed.to(tl.uint32), (seed >> 32).to(tl.uint32))
    half = tl.where(word >= 0x80000000, word ^ 0xFFFFFFFF, word)
    return tl.maximum(half.to(tl.int32).to(tl.float32) * _RAND_MIN, _RAND_MIN)


@triton.jit
def _log1p(x):
    """``log(1 + x)`` without libdevice, compensated for the rounding of ``1 + x``."""
    y = 1.0 + x
    d = y - 1.0
    return tl.where(d == 0.0, x, tl.log(y) * (x / tl.where(d == 0.0, 1.0, d)))


# ---------------------------------------------------------------------------------------------------
# per-block logits statistics


@triton.jit
def _logits_stats_kernel(
    target_local_argmax_ptr,
    target_local_argmax_stride,
    target_local_max_ptr,
    target_local_max_stride,
    target_local_sumexp_ptr,
    target_local_sumexp_stride,
    draft_local_max_ptr,
    draft_local_max_stride,
    draft_local_sumexp_ptr,
    draft_local_sumexp_stride,
    target_logits_ptr,
    target_logits_stride,
    draft_logits_ptr,
    draft_logits_stride_0,
    draft_logits_stride_1,
    expanded_idx_mapping_ptr,
    expanded_local_pos_ptr,
    temp_ptr,
    vocab_size,
    num_speculative_steps,
    num_rows,
    num_blocks,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    HAS_DRAFT_LOGITS: tl.constexpr,
):
    # (row, block) pairs grid-stride; draft-step rows only (bonus rows need no statistics).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, num_rows * num_blocks, programs):
        row = item // num_blocks
        block = item - row * num_blocks
        row64 = tl.cast(row, tl.int64)
        step = tl.load(expanded_local_pos_ptr + row)
        if step < num_speculative_steps:
            state = tl.load(expanded_idx_mapping_ptr + row).to(tl.int64)
            temp = tl.load(temp_ptr + state).to(tl.float32)
            block_start = block * BLOCK_SIZE
            target_row = target_logits_ptr + row64 * target_logits_stride
            if temp == 0.0:
                best = tl.full([], float("-inf"), tl.float32)
                best_token = tl.full([], 0, tl.int32) + block_start
                for start in range(0, BLOCK_SIZE, TILE):
                    offs = block_start + start + tl.arange(0, TILE)
                    x = tl.load(target_row + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
                    value, index = tl.max(x, axis=0, return_indices=True)
                    larger = value > best
                    best_token = tl.where(larger, block_start + start + index.to(tl.int32), best_token)
                    best = tl.where(larger, value, best)
                tl.store(
                    target_local_argmax_ptr + row64 * target_local_argmax_stride + block,
                    best_token.to(tl.int64),
                )
                tl.store(target_local_max_ptr + row64 * target_local_max_stride + block, best)
            else:
                top = tl.full([], float("-inf"), tl.float32)
                total = tl.full([], 0.0, tl.float32)
                for start in range(0, BLOCK_SIZE, TILE):
                    offs = block_start + start + tl.arange(0, TILE)
                    x = tl.load(target_row + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
                    new_top = tl.maximum(top, tl.max(x, axis=0))
                    live = new_top > float("-inf")
                    total = tl.where(
                        live, total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), axis=0), 0.0
                    )
                    top = new_top
                tl.store(target_local_max_ptr + row64 * target_local_max_stride + block, top)
                tl.store(target_local_sumexp_ptr + row64 * target_local_sumexp_stride + block, total)
                if HAS_DRAFT_LOGITS:
                    draft_row = (
                        draft_logits_ptr + state * draft_logits_stride_0 + step * draft_logits_stride_1
                    )
                    top = tl.full([], float("-inf"), tl.float32)
                    total = tl.full([], 0.0, tl.float32)
                    for start in range(0, BLOCK_SIZE, TILE):
                        offs = block_start + start + tl.arange(0, TILE)
                        x = tl.load(draft_row + offs, mask=offs < vocab_size, other=float("-inf")).to(
                            tl.float32
                        )
                        x = x / temp
                        new_top = tl.maximum(top, tl.max(x, axis=0))
                        live = new_top > float("-inf")
                        total = tl.where(
                            live, total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), axis=0), 0.0
                        )
                        top = new_top
                    tl.store(draft_local_max_ptr + row64 * draft_local_max_stride + block, top)
                    tl.store(draft_local_sumexp_ptr + row64 * draft_local_sumexp_stride + block, total)


def compute_local_logits_stats(
    grid: Grid,
    target_local_argmax_ptr: torch.Tensor,
    target_local_argmax_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    num_speculative_steps: int,
    BLOCK_SIZE: int,
    HAS_DRAFT_LOGITS: bool,
) -> None:
    num_rows, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_rows == 0 or num_blocks == 0:
        return
    device = target_logits_ptr.device
    _logits_stats_kernel[(_geometry.programs(device, num_rows * num_blocks),)](
        target_local_argmax_ptr,
        target_local_argmax_stride,
        target_local_max_ptr,
        target_local_max_stride,
        target_local_sumexp_ptr,
        target_local_sumexp_stride,
        draft_local_max_ptr,
        draft_local_max_stride,
        draft_local_sumexp_ptr,
        draft_local_sumexp_stride,
        target_logits_ptr,
        target_logits_stride,
        target_logits_ptr if draft_logits_ptr is None else draft_logits_ptr,
        draft_logits_stride_0,
        draft_logits_stride_1,
        expanded_idx_mapping_ptr,
        expanded_local_pos_ptr,
        temp_ptr,
        vocab_size,
        num_speculative_steps,
        num_rows,
        num_blocks,
        BLOCK_SIZE=BLOCK_SIZE,
        TILE=_tile(device, BLOCK_SIZE, 4),
        HAS_DRAFT_LOGITS=HAS_DRAFT_LOGITS,
    )


# ---------------------------------------------------------------------------------------------------
# block verification: running joint ratio and residual mass


@triton.jit
def _cumulative_log_p_kernel(
    cumulative_log_p_ptr,
    target_logits_ptr,
    target_logits_stride,
    target_local_max_ptr,
    target_local_max_stride,
    target_local_sumexp_ptr,
    target_local_sumexp_stride,
    draft_sampled_ptr,
    draft_logits_ptr,
    draft_logits_stride_0,
    draft_logits_stride_1,
    draft_local_max_ptr,
    draft_local_max_stride,
    draft_local_sumexp_ptr,
    draft_local_sumexp_stride,
    cu_num_logits_ptr,
    idx_mapping_ptr,
    temp_ptr,
    vocab_num_blocks,
    num_reqs,
    PADDED: tl.constexpr,
    HAS_DRAFT_LOGITS: tl.constexpr,
):
    # Requests grid-stride; each walks its draft steps, carrying the clamped log joint ratio (a -1
    # placeholder adds nothing).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + req).to(tl.int64)
        start = tl.load(cu_num_logits_ptr + req).to(tl.int64)
        num_draft = tl.load(cu_num_logits_ptr + req + 1).to(tl.int64) - start - 1
        temp = tl.load(temp_ptr + state).to(tl.float32)
        if temp != 0.0:
            log_p = tl.full([], 0.0, tl.float32)
            for step in range(0, num_draft):
                row = start + step
                token = tl.load(draft_sampled_ptr + row + 1).to(tl.int64)
                if token >= 0:
                    target_lse = _global_lse(
                        target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                        target_local_sumexp_stride, row, vocab_num_blocks, PADDED,
                    )  # fmt: skip
                    logit = tl.load(target_logits_ptr + row * target_logits_stride + token).to(tl.float32)
                    delta = logit - target_lse
                    if HAS_DRAFT_LOGITS:
                        draft_lse = _global_lse(
                            draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr,
                            draft_local_sumexp_stride, row, vocab_num_blocks, PADDED,
                        )  # fmt: skip
                        draft_row = (
                            draft_logits_ptr + state * draft_logits_stride_0 + step * draft_logits_stride_1
                        )
                        draft_lp = tl.load(draft_row + token).to(tl.float32) / temp - draft_lse
                        delta = delta - draft_lp
                    # min(., 0) keeping the non-NaN operand (vLLM's fminf), as a comparison.
                    log_p = log_p + delta
                    log_p = tl.where(log_p < 0.0, log_p, 0.0)
                tl.store(cumulative_log_p_ptr + row, log_p)


def compute_cumulative_log_p(
    grid: Grid,
    cumulative_log_p_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_sampled_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_num_blocks: int,
    PADDED_VOCAB_NUM_BLOCKS: int,
    HAS_DRAFT_LOGITS: bool,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    _cumulative_log_p_kernel[(_geometry.programs(target_logits_ptr.device, num_reqs),)](
        cumulative_log_p_ptr,
        target_logits_ptr,
        target_logits_stride,
        target_local_max_ptr,
        target_local_max_stride,
        target_local_sumexp_ptr,
        target_local_sumexp_stride,
        draft_sampled_ptr,
        target_logits_ptr if draft_logits_ptr is None else draft_logits_ptr,
        draft_logits_stride_0,
        draft_logits_stride_1,
        draft_local_max_ptr,
        draft_local_max_stride,
        draft_local_sumexp_ptr,
        draft_local_sumexp_stride,
        cu_num_logits_ptr,
        idx_mapping_ptr,
        temp_ptr,
        vocab_num_blocks,
        num_reqs,
        PADDED=PADDED_VOCAB_NUM_BLOCKS,
        HAS_DRAFT_LOGITS=HAS_DRAFT_LOGITS,
    )


@triton.jit
def _residual_mass_kernel(
    local_residual_mass_ptr,
    local_residual_mass_stride,
    cumulative_log_p_ptr,
    target_logits_ptr,
    target_logits_stride,
    target_local_max_ptr,
    target_local_max_stride,
    target_local_sumexp_ptr,
    target_local_sumexp_stride,
    draft_logits_ptr,
    draft_logits_stride_0,
    draft_logits_stride_1,
    draft_local_max_ptr,
    draft_local_max_stride,
    draft_local_sumexp_ptr,
    draft_local_sumexp_stride,
    draft_sampled_ptr,
    expanded_idx_mapping_ptr,
    expanded_local_pos_ptr,
    temp_ptr,
    vocab_size,
    num_speculative_steps,
    vocab_num_blocks,
    num_rows,
    num_blocks,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    PADDED: tl.constexpr,
):
    # (row, block) pairs grid-stride; rows of draft steps 1 .. num_speculative_steps - 1 (not the
    # grid's last row, not before a placeholder, not greedy) get sum(max(p * M_b - M_s, 0)) per block.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, (num_rows - 1) * num_blocks, programs):
        row = item // num_blocks
        block = item - row * num_blocks
        row64 = tl.cast(row, tl.int64)
        step = tl.load(expanded_local_pos_ptr + row)
        wanted = (step != 0) & (step < num_speculative_steps)
        if wanted:
            if tl.load(draft_sampled_ptr + row64 + 1) >= 0:
                state = tl.load(expanded_idx_mapping_ptr + row).to(tl.int64)
                temp = tl.load(temp_ptr + state).to(tl.float32)
                if temp != 0.0:
                    target_lse = _global_lse(
                        target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                        target_local_sumexp_stride, row64, vocab_num_blocks, PADDED,
                    )  # fmt: skip
                    draft_lse = _global_lse(
                        draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr,
                        draft_local_sumexp_stride, row64, vocab_num_blocks, PADDED,
                    )  # fmt: skip
                    joint = tl.exp(tl.load(cumulative_log_p_ptr + row64 - 1).to(tl.float32))
                    target_row = target_logits_ptr + row64 * target_logits_stride
                    draft_row = (
                        draft_logits_ptr + state * draft_logits_stride_0 + step * draft_logits_stride_1
                    )
                    block_start = block * BLOCK_SIZE
                    partial = tl.full([], 0.0, tl.float32)
                    for start in range(0, BLOCK_SIZE, TILE):
                        offs = block_start + start + tl.arange(0, TILE)
                        inside = offs < vocab_size
                        target_lp = tl.load(target_row + offs, mask=inside, other=float("-inf")).to(
                            tl.float32
                        )
                        target_lp = target_lp - target_lse
                        draft_lp = tl.load(draft_row + offs, mask=inside, other=float("-inf")).to(tl.float32)
                        draft_lp = draft_lp / temp - draft_lse
                        excess = joint * tl.exp(target_lp) - tl.exp(draft_lp)
                        excess = tl.where(excess > 0.0, excess, 0.0)  # fmaxf: NaN -> 0
                        partial += tl.sum(excess, axis=0)
                    tl.store(local_residual_mass_ptr + row64 * local_residual_mass_stride + block, partial)


def compute_local_residual_mass(
    grid: Grid,
    local_residual_mass_ptr: torch.Tensor,
    local_residual_mass_stride: int,
    cumulative_log_p_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_logits_ptr: torch.Tensor,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    draft_sampled_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    num_speculative_steps: int,
    vocab_num_blocks: int,
    BLOCK_SIZE: int,
    PADDED_VOCAB_NUM_BLOCKS: int,
) -> None:
    num_rows, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_rows <= 1 or num_blocks == 0:
        return
    device = target_logits_ptr.device
    _residual_mass_kernel[(_geometry.programs(device, (num_rows - 1) * num_blocks),)](
        local_residual_mass_ptr,
        local_residual_mass_stride,
        cumulative_log_p_ptr,
        target_logits_ptr,
        target_logits_stride,
        target_local_max_ptr,
        target_local_max_stride,
        target_local_sumexp_ptr,
        target_local_sumexp_stride,
        draft_logits_ptr,
        draft_logits_stride_0,
        draft_logits_stride_1,
        draft_local_max_ptr,
        draft_local_max_stride,
        draft_local_sumexp_ptr,
        draft_local_sumexp_stride,
        draft_sampled_ptr,
        expanded_idx_mapping_ptr,
        expanded_local_pos_ptr,
        temp_ptr,
        vocab_size,
        num_speculative_steps,
        vocab_num_blocks,
        num_rows,
        num_blocks,
        BLOCK_SIZE=BLOCK_SIZE,
        TILE=_tile(device, BLOCK_SIZE, 5),
        PADDED=PADDED_VOCAB_NUM_BLOCKS,
    )


# ---------------------------------------------------------------------------------------------------
# the accept/reject walk


@triton.jit
def _rejection_kernel(
    sampled_ptr,
    sampled_stride,
    rejected_steps_ptr,
    target_rejected_logsumexp_ptr,
    draft_rejected_logsumexp_ptr,
    target_logits_ptr,
    target_logits_stride,
    target_local_argmax_ptr,
    target_local_argmax_stride,
    target_local_max_ptr,
    target_local_max_stride,
    target_local_sumexp_ptr,
    target_local_sumexp_stride,
    draft_sampled_ptr,
    draft_logits_ptr,
    draft_logits_stride_0,
    draft_logits_stride_1,
    draft_local_max_ptr,
    draft_local_max_stride,
    draft_local_sumexp_ptr,
    draft_local_sumexp_stride,
    cu_num_logits_ptr,
    idx_mapping_ptr,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    rates_ptr,
    cumulative_log_p_ptr,
    local_residual_mass_ptr,
    local_residual_mass_stride,
    vocab_num_blocks,
    num_reqs,
    PADDED: tl.constexpr,
    HAS_DRAFT_LOGITS: tl.constexpr,
    SYNTHETIC_MODE: tl.constexpr,
    USE_BLOCK_VERIFICATION: tl.constexpr,
    POS_WIDE: tl.constexpr,
):
    # Requests grid-stride, each walking its draft steps while it verifies (greedy: draft == target
    # argmax, the argmax stored at the first rejection; sampled: the probability-ratio test, or block
    # verification's last step with u <= h).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + req).to(tl.int64)
        start = tl.load(cu_num_logits_ptr + req).to(tl.int64)
        num_draft = tl.load(cu_num_logits_ptr + req + 1).to(tl.int64) - start - 1
        seed = tl.load(seed_ptr + state).to(tl.int64)
        temp = tl.load(temp_ptr + state).to(tl.float32)
        out_row = sampled_ptr + tl.cast(req, tl.int64) * sampled_stride
        accepted_length = tl.full([], 0, tl.int64)
        verifying = tl.full([], 1, tl.int32)
        target_lse = tl.full([], 0.0, tl.float32)
        draft_lse = tl.full([], 0.0, tl.float32)
        for i in range(0, num_draft):
            row = start + i
            token = tl.load(draft_sampled_ptr + row + 1).to(tl.int64)
            valid = token >= 0
            token = tl.maximum(token, 0)
            if temp != 0.0:
                verifying = tl.where(valid, verifying, 0)
            if verifying != 0:
                u = _accept_uniform(seed, tl.load(pos_ptr + row), POS_WIDE)
                if temp == 0.0:
                    best = _leftmost_block(
                        target_local_max_ptr, row * target_local_max_stride, vocab_num_blocks, PADDED
                    )
                    argmax = tl.load(target_local_argmax_ptr + row * target_local_argmax_stride + best).to(
                        tl.int64
                    )
                    if SYNTHETIC_MODE:
                        accepted = u < tl.load(rates_ptr + i)
                    else:
                        accepted = argmax == token
                    accepted = accepted & valid
                    verifying = accepted.to(tl.int32)
                    accepted_length += accepted.to(tl.int64)
                    tl.store(out_row + i, tl.where(accepted, token, argmax))
                elif USE_BLOCK_VERIFICATION:
                    joint = tl.exp(tl.load(cumulative_log_p_ptr + row).to(tl.float32))
                    next_token = tl.full([], -1, tl.int64)
                    if i < num_draft - 1:
                        next_token = tl.load(draft_sampled_ptr + row + 2).to(tl.int64)
                    h = joint
                    if next_token >= 0:
                        if HAS_DRAFT_LOGITS:
                            blocks = tl.arange(0, PADDED)
                            partials = tl.load(
                                local_residual_mass_ptr + (row + 1) * local_residual_mass_stride + blocks,
                                mask=blocks < vocab_num_blocks,
                                other=0.0,
                            )
                            residual = tl.sum(partials, axis=0)
                        else:
                            lse = _global_lse(
                                target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                                target_local_sumexp_stride, row + 1, vocab_num_blocks, PADDED,
                            )  # fmt: skip
                            logit = tl.load(target_logits_ptr + (row + 1) * target_logits_stride + next_token)
                            residual = joint * (1.0 - tl.exp(logit.to(tl.float32) - lse))
                        denom = residual + 1.0 - joint
                        h = tl.where(denom > 0.0, residual / tl.where(denom > 0.0, denom, 1.0), 1.0)
                    accepted_length = tl.where(u <= h, accepted_length * 0 + i + 1, accepted_length)
                    tl.store(out_row + i, token)
                else:
                    target_lse = _global_lse(
                        target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                        target_local_sumexp_stride, row, vocab_num_blocks, PADDED,
                    )  # fmt: skip
                    log_ratio = tl.load(target_logits_ptr + row * target_logits_stride + token).to(tl.float32)
                    log_ratio = log_ratio - target_lse
                    if HAS_DRAFT_LOGITS:
                        draft_lse = _global_lse(
                            draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr,
                            draft_local_sumexp_stride, row, vocab_num_blocks, PADDED,
                        )  # fmt: skip
                        draft_row = (
                            draft_logits_ptr + state * draft_logits_stride_0 + i * draft_logits_stride_1
                        )
                        draft_lp = tl.load(draft_row + token).to(tl.float32) / temp - draft_lse
                        threshold = tl.log(u) + draft_lp
                    else:
                        threshold = tl.log(u) + 0.0
                    if SYNTHETIC_MODE:
                        accepted = u < tl.load(rates_ptr + i)
                    else:
                        accepted = log_ratio > threshold
                    verifying = accepted.to(tl.int32)
                    accepted_length += accepted.to(tl.int64)
                    tl.store(out_row + i, token)
        tl.store(rejected_steps_ptr + req, accepted_length.to(tl.int32))
        if USE_BLOCK_VERIFICATION:
            if (temp != 0.0) & (accepted_length < num_draft):
                rejected_row = start + accepted_length
                target_lse = _global_lse(
                    target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                    target_local_sumexp_stride, rejected_row, vocab_num_blocks, PADDED,
                )  # fmt: skip
                if HAS_DRAFT_LOGITS:
                    draft_lse = _global_lse(
                        draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr,
                        draft_local_sumexp_stride, rejected_row, vocab_num_blocks, PADDED,
                    )  # fmt: skip
        tl.store(target_rejected_logsumexp_ptr + req, target_lse)
        tl.store(draft_rejected_logsumexp_ptr + req, draft_lse)


def rejection(
    grid: Grid,
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    rejected_steps_ptr: torch.Tensor,
    target_rejected_logsumexp_ptr: torch.Tensor,
    draft_rejected_logsumexp_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_argmax_ptr: torch.Tensor,
    target_local_argmax_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_sampled_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    seed_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    synthetic_conditional_rates_ptr: torch.Tensor | None,
    cumulative_log_p_ptr: torch.Tensor | None,
    local_residual_mass_ptr: torch.Tensor | None,
    local_residual_mass_stride: int,
    vocab_num_blocks: int,
    PADDED_VOCAB_NUM_BLOCKS: int,
    HAS_DRAFT_LOGITS: bool,
    SYNTHETIC_MODE: bool,
    USE_BLOCK_VERIFICATION: bool,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    dummy = target_local_max_ptr
    _rejection_kernel[(_geometry.programs(target_logits_ptr.device, num_reqs),)](
        sampled_ptr,
        sampled_stride,
        rejected_steps_ptr,
        target_rejected_logsumexp_ptr,
        draft_rejected_logsumexp_ptr,
        target_logits_ptr,
        target_logits_stride,
        target_local_argmax_ptr,
        target_local_argmax_stride,
        target_local_max_ptr,
        target_local_max_stride,
        target_local_sumexp_ptr,
        target_local_sumexp_stride,
        draft_sampled_ptr,
        target_logits_ptr if draft_logits_ptr is None else draft_logits_ptr,
        draft_logits_stride_0,
        draft_logits_stride_1,
        draft_local_max_ptr,
        draft_local_max_stride,
        draft_local_sumexp_ptr,
        draft_local_sumexp_stride,
        cu_num_logits_ptr,
        idx_mapping_ptr,
        temp_ptr,
        seed_ptr,
        pos_ptr,
        dummy if synthetic_conditional_rates_ptr is None else synthetic_conditional_rates_ptr,
        dummy if cumulative_log_p_ptr is None else cumulative_log_p_ptr,
        dummy if local_residual_mass_ptr is None else local_residual_mass_ptr,
        local_residual_mass_stride,
        vocab_num_blocks,
        num_reqs,
        PADDED=PADDED_VOCAB_NUM_BLOCKS,
        HAS_DRAFT_LOGITS=HAS_DRAFT_LOGITS,
        SYNTHETIC_MODE=SYNTHETIC_MODE,
        USE_BLOCK_VERIFICATION=USE_BLOCK_VERIFICATION,
        POS_WIDE=pos_ptr.element_size() > 4,
    )


# ---------------------------------------------------------------------------------------------------
# resampling


@triton.jit
def _residual(
    tokens,
    inside,
    target_row,
    draft_row,
    temp,
    target_lse,
    draft_lse,
    log_p_tau,
    rejected,
    plain,
    HAS_DRAFT_LOGITS: tl.constexpr,
    USE_BLOCK_VERIFICATION: tl.constexpr,
):
    """The logits to resample from at ``tokens``: the target's for a bonus step or a placeholder, else
    ``log max(p - q, 0)`` (draft logits) or the target without the rejected token (one-hot draft)."""
    target = tl.load(target_row + tokens, mask=inside, other=float("-inf")).to(tl.float32)
    if HAS_DRAFT_LOGITS:
        draft = tl.load(draft_row + tokens, mask=inside, other=float("-inf")).to(tl.float32) / temp
        target_lp = target - target_lse
        if USE_BLOCK_VERIFICATION:
            target_lp = target_lp + log_p_tau
        ratio = tl.exp((draft - draft_lse) - target_lp)
        below = ratio < 1.0
        residual = tl.where(below, target_lp + _log1p(-tl.where(below, ratio, 0.0)), float("-inf"))
    else:
        residual = tl.where(tokens != rejected, target, float("-inf"))
    return tl.where(plain, target, residual)


@triton.jit
def _keyed(residual, word, inside):
    """The watermark value ``logit - log(-log(u))`` (NaN logits as ``-inf``; ``-inf`` outside the vocab)."""
    residual = tl.where(residual != residual, float("-inf"), residual)
    scaled = ((word >> 8) + 1).to(tl.float32) * 5.960464477539063e-08
    uniform = (scaled.to(tl.uint32, bitcast=True) - 1).to(tl.float32, bitcast=True)
    return tl.where(inside, residual - tl.log(-tl.log(uniform)), float("-inf"))


@triton.jit
def _take_larger(best, best_token, value, token):
    larger = value > best
    return tl.where(larger, value, best), tl.where(larger, token, best_token)


@triton.jit
def _resample_kernel(
    resampled_local_argmax_ptr,
    resampled_local_argmax_stride,
    resampled_local_max_ptr,
    resampled_local_max_stride,
    target_logits_ptr,
    target_logits_stride,
    target_rejected_logsumexp_ptr,
    draft_logits_ptr,
    draft_logits_stride_0,
    draft_logits_stride_1,
    draft_rejected_logsumexp_ptr,
    rejected_step_ptr,
    cu_num_logits_ptr,
    expanded_idx_mapping_ptr,
    draft_sampled_ptr,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    cumulative_log_p_ptr,
    contexts_ptr,
    contexts_stride,
    watermarking_ptr,
    skip_mask_ptr,
    watermark_key_0,
    watermark_key_1,
    vocab_size,
    num_reqs,
    num_blocks,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    HAS_DRAFT_LOGITS: tl.constexpr,
    USE_BLOCK_VERIFICATION: tl.constexpr,
    CONTEXT_WIDTH: tl.constexpr,
    WATERMARK: tl.constexpr,
    DEDUPLICATE_CONTEXTS: tl.constexpr,
):
    # (request, block) pairs grid-stride: the Gumbel-max candidate of the residual distribution at the
    # request's rejected (or bonus) step; greedy requests only at the bonus step.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, num_reqs * num_blocks, programs):
        req = item // num_blocks
        block = item - req * num_blocks
        req64 = tl.cast(req, tl.int64)
        step = tl.load(rejected_step_ptr + req).to(tl.int64)
        end = tl.load(cu_num_logits_ptr + req + 1).to(tl.int64)
        row = tl.load(cu_num_logits_ptr + req).to(tl.int64) + step
        state = tl.load(expanded_idx_mapping_ptr + row).to(tl.int64)
        temp = tl.load(temp_ptr + state).to(tl.float32)
        bonus = row == end - 1
        if (temp != 0.0) | bonus:
            rejected = tl.full([], 0, tl.int64)
            if row != end - 1:
                rejected = tl.load(draft_sampled_ptr + row + 1).to(tl.int64)
            plain = bonus | (rejected < 0)
            target_lse = tl.load(target_rejected_logsumexp_ptr + req)
            draft_lse = tl.load(draft_rejected_logsumexp_ptr + req)
            log_p_tau = tl.full([], 0.0, tl.float32)
            if USE_BLOCK_VERIFICATION:
                if step > 0:
                    log_p_tau = tl.load(cumulative_log_p_ptr + row - 1).to(tl.float32)
            target_row = target_logits_ptr + row * target_logits_stride
            draft_row = draft_logits_ptr + state * draft_logits_stride_0 + step * draft_logits_stride_1
            keyed = tl.full([], 0, tl.int32)
            if WATERMARK:
                if state >= 0:
                    keyed = (tl.load(watermarking_ptr + state) != 0).to(tl.int32)
                keyed = tl.where(temp == 0.0, 0, keyed)
                if DEDUPLICATE_CONTEXTS:
                    keyed = tl.where(tl.load(skip_mask_ptr + row) != 0, 0, keyed)
            block_start = block * BLOCK_SIZE
            best = tl.full([], float("-inf"), tl.float32)
            best_token = tl.full([], 0, tl.int32) + block_start
            if keyed != 0:
                k0 = watermark_key_0.to(tl.uint32)
                k1 = watermark_key_1.to(tl.uint32)
                s0, s1, s2, s3 = _context_state(contexts_ptr + row * contexts_stride, k0, k1, CONTEXT_WIDTH)
                draw_k0 = k0 ^ s3
                draw_k1 = k1 ^ _TOKEN_DOMAIN
                for start in range(0, BLOCK_SIZE, TILE):
                    groups = (block_start + start) // 4 + tl.arange(0, TILE // 4)
                    zero = groups.to(tl.uint32) * 0
                    w0, w1, w2, w3 = _philox(
                        groups.to(tl.uint32), s0 + zero, s1 + zero, s2 + zero, draw_k0 + zero, draw_k1 + zero
                    )
                    token = groups * 4
                    lane_best = tl.full([TILE // 4], float("-inf"), tl.float32)
                    lane_token = token
                    for lane in tl.static_range(4):
                        if lane == 0:
                            word = w0
                        elif lane == 1:
                            word = w1
                        elif lane == 2:
                            word = w2
                        else:
                            word = w3
                        inside = token + lane < vocab_size
                        residual = _residual(
                            token + lane, inside, target_row, draft_row, temp, target_lse, draft_lse,
                            log_p_tau, rejected, plain, HAS_DRAFT_LOGITS, USE_BLOCK_VERIFICATION,
                        )  # fmt: skip
                        value = _keyed(residual, word, inside)
                        if lane == 0:
                            lane_best = value
                        else:
                            lane_best, lane_token = _take_larger(lane_best, lane_token, value, token + lane)
                    value = tl.max(lane_best, axis=0)
                    first = tl.min(tl.where(lane_best == value, lane_token, 2147483647), axis=0)
                    best, best_token = _take_larger(best, best_token, value, first)
            else:
                seed = tl.load(seed_ptr + state).to(tl.int64)
                prefix = murmur3_prefix(seed, tl.load(pos_ptr + row).to(tl.int64))
                for start in range(0, BLOCK_SIZE, TILE):
                    offs = block_start + start + tl.arange(0, TILE)
                    inside = offs < vocab_size
                    x = _residual(
                        offs, inside, target_row, draft_row, temp, target_lse, draft_lse, log_p_tau,
                        rejected, plain, HAS_DRAFT_LOGITS, USE_BLOCK_VERIFICATION,
                    )  # fmt: skip
                    if temp != 0.0:
                        noise = gumbel_from_uniform(murmur3_uniform_from_prefix(prefix, offs))
                        x = tl.where(inside, x + noise, float("-inf"))
                    x = tl.where(x != x, float("-inf"), x)
                    value, index = tl.max(x, axis=0, return_indices=True)
                    best, best_token = _take_larger(
                        best, best_token, value, block_start + start + index.to(tl.int32)
                    )
            tl.store(
                resampled_local_argmax_ptr + req64 * resampled_local_argmax_stride + block,
                best_token.to(tl.int64),
            )
            tl.store(resampled_local_max_ptr + req64 * resampled_local_max_stride + block, best)


def resample(
    grid: Grid,
    resampled_local_argmax_ptr: torch.Tensor,
    resampled_local_argmax_stride: int,
    resampled_local_max_ptr: torch.Tensor,
    resampled_local_max_stride: int,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_rejected_logsumexp_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_rejected_logsumexp_ptr: torch.Tensor,
    rejected_step_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    draft_sampled_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    seed_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    cumulative_log_p_ptr: torch.Tensor | None,
    contexts_ptr: torch.Tensor | None,
    contexts_stride: int,
    watermarking_ptr: torch.Tensor | None,
    watermarking_skip_mask_ptr: torch.Tensor | None,
    watermark_key_0: int,
    watermark_key_1: int,
    vocab_size: int,
    BLOCK_SIZE: int,
    HAS_DRAFT_LOGITS: bool,
    USE_FP64: bool,
    USE_BLOCK_VERIFICATION: bool,
    CONTEXT_WIDTH: int,
    WATERMARK: bool,
    DEDUPLICATE_CONTEXTS: bool,
) -> None:
    if USE_FP64:
        # Ascend's vector units have no fp64: the opt-in fp64 draw runs as torch ops on the device.
        reference.resample_torch(
            grid, resampled_local_argmax_ptr, resampled_local_argmax_stride, resampled_local_max_ptr,
            resampled_local_max_stride, target_logits_ptr, target_logits_stride, target_rejected_logsumexp_ptr,
            draft_logits_ptr, draft_logits_stride_0, draft_logits_stride_1, draft_rejected_logsumexp_ptr,
            rejected_step_ptr, cu_num_logits_ptr, expanded_idx_mapping_ptr, draft_sampled_ptr, temp_ptr,
            seed_ptr, pos_ptr, cumulative_log_p_ptr, contexts_ptr, contexts_stride, watermarking_ptr,
            watermarking_skip_mask_ptr, watermark_key_0, watermark_key_1, vocab_size, BLOCK_SIZE,
            HAS_DRAFT_LOGITS, USE_FP64, USE_BLOCK_VERIFICATION, CONTEXT_WIDTH, WATERMARK, DEDUPLICATE_CONTEXTS,
        )  # fmt: skip
        return
    num_reqs, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or num_blocks == 0:
        return
    device = target_logits_ptr.device
    dummy = target_rejected_logsumexp_ptr
    tile = max(4, _tile(device, BLOCK_SIZE, 12, cap=2048))
    _resample_kernel[(_geometry.programs(device, num_reqs * num_blocks),)](
        resampled_local_argmax_ptr,
        resampled_local_argmax_stride,
        resampled_local_max_ptr,
        resampled_local_max_stride,
        target_logits_ptr,
        target_logits_stride,
        target_rejected_logsumexp_ptr,
        target_logits_ptr if draft_logits_ptr is None else draft_logits_ptr,
        draft_logits_stride_0,
        draft_logits_stride_1,
        draft_rejected_logsumexp_ptr,
        rejected_step_ptr,
        cu_num_logits_ptr,
        expanded_idx_mapping_ptr,
        draft_sampled_ptr,
        temp_ptr,
        seed_ptr,
        pos_ptr,
        dummy if cumulative_log_p_ptr is None else cumulative_log_p_ptr,
        draft_sampled_ptr if contexts_ptr is None else contexts_ptr,
        contexts_stride,
        rejected_step_ptr if watermarking_ptr is None else watermarking_ptr,
        rejected_step_ptr if watermarking_skip_mask_ptr is None else watermarking_skip_mask_ptr,
        watermark_key_0,
        watermark_key_1,
        vocab_size,
        num_reqs,
        num_blocks,
        BLOCK_SIZE=BLOCK_SIZE,
        TILE=tile,
        HAS_DRAFT_LOGITS=HAS_DRAFT_LOGITS,
        USE_BLOCK_VERIFICATION=USE_BLOCK_VERIFICATION,
        CONTEXT_WIDTH=CONTEXT_WIDTH,
        WATERMARK=WATERMARK,
        DEDUPLICATE_CONTEXTS=DEDUPLICATE_CONTEXTS,
    )


@triton.jit
def _insert_resampled_kernel(
    sampled_ptr,
    sampled_stride,
    num_sampled_ptr,
    resampled_local_argmax_ptr,
    resampled_local_argmax_stride,
    resampled_local_max_ptr,
    resampled_local_max_stride,
    resample_num_blocks,
    cu_num_logits_ptr,
    expanded_idx_mapping_ptr,
    temp_ptr,
    num_reqs,
    PADDED: tl.constexpr,
):
    # Requests grid-stride: count + 1, and the best block's token written after the accepted drafts.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        req64 = tl.cast(req, tl.int64)
        count = tl.load(num_sampled_ptr + req)
        end = tl.load(cu_num_logits_ptr + req + 1)
        row = tl.load(cu_num_logits_ptr + req) + count
        state = tl.load(expanded_idx_mapping_ptr + row)
        tl.store(num_sampled_ptr + req, count + 1)
        temp = tl.load(temp_ptr + state).to(tl.float32)
        if (temp != 0.0) | (row == end - 1):
            best = _leftmost_block(
                resampled_local_max_ptr, req64 * resampled_local_max_stride, resample_num_blocks, PADDED
            )
            token = tl.load(resampled_local_argmax_ptr + req64 * resampled_local_argmax_stride + best)
            tl.store(sampled_ptr + req64 * sampled_stride + count, token)


def insert_resampled(
    grid: Grid,
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    num_sampled_ptr: torch.Tensor,
    resampled_local_argmax_ptr: torch.Tensor,
    resampled_local_argmax_stride: int,
    resampled_local_max_ptr: torch.Tensor,
    resampled_local_max_stride: int,
    resample_num_blocks: int,
    cu_num_logits_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    PADDED_RESAMPLE_NUM_BLOCKS: int,
) -> None:
    if resampled_local_max_ptr.dtype == torch.float64:
        # The fp64 candidates of an fp64 resampling: no fp64 loads on Ascend's vector units.
        reference.insert_resampled_torch(
            grid, sampled_ptr, sampled_stride, num_sampled_ptr, resampled_local_argmax_ptr,
            resampled_local_argmax_stride, resampled_local_max_ptr, resampled_local_max_stride,
            resample_num_blocks, cu_num_logits_ptr, expanded_idx_mapping_ptr, temp_ptr,
            PADDED_RESAMPLE_NUM_BLOCKS,
        )  # fmt: skip
        return
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    _insert_resampled_kernel[(_geometry.programs(sampled_ptr.device, num_reqs),)](
        sampled_ptr,
        sampled_stride,
        num_sampled_ptr,
        resampled_local_argmax_ptr,
        resampled_local_argmax_stride,
        resampled_local_max_ptr,
        resampled_local_max_stride,
        resample_num_blocks,
        cu_num_logits_ptr,
        expanded_idx_mapping_ptr,
        temp_ptr,
        num_reqs,
        PADDED=PADDED_RESAMPLE_NUM_BLOCKS,
    )
