"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.spec_decode_acceptance_estimator`.

One program per vector core walks the draft positions (accumulation), the ``(row, vocabulary block)``
pairs (statistics) or the rows (prediction) grid-stride, where vLLM launches one program per position,
pair or row; requests and vocabulary blocks are swept in UB-sized tiles (the block's summed exponentials
by an online rescale). The refit is one program over the (few) positions, as vLLM's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


def _tile(device: torch.device, block: int, live_tiles: int, cap: int = 4096) -> int:
    return min(block, ub_cap(device, 8 if IS_INTERPRETED else cap, live_tiles))


@triton.jit
def _accumulate_kernel(
    info_ptr,
    grad_ptr,
    idx_mapping_ptr,
    num_sampled_ptr,
    num_rejected_ptr,
    features_ptr,
    features_stride,
    pred_ptr,
    pred_stride,
    counts_ptr,
    num_reqs,
    num_steps,
    TILE: tl.constexpr,
):
    # Positions grid-stride; each sums its observed requests tile by tile, then adds to its statistics.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for step in range(pid, num_steps, programs):
        a = tl.full([], 0.0, tl.float32)
        b = tl.full([], 0.0, tl.float32)
        c = tl.full([], 0.0, tl.float32)
        g0 = tl.full([], 0.0, tl.float32)
        g1 = tl.full([], 0.0, tl.float32)
        count = tl.full([], 0.0, tl.float32)
        for start in range(0, num_reqs, TILE):
            reqs = start + tl.arange(0, TILE)
            inside = reqs < num_reqs
            state = tl.load(idx_mapping_ptr + reqs, mask=inside, other=0).to(tl.int64)
            accepted = tl.maximum(tl.load(num_sampled_ptr + reqs, mask=inside, other=0).to(tl.int64) - 1, 0)
            admitted = accepted + tl.load(num_rejected_ptr + reqs, mask=inside, other=0).to(tl.int64)
            feature = tl.load(features_ptr + state * features_stride + step, mask=inside, other=0.0).to(
                tl.float32
            )
            pred = tl.load(pred_ptr + state * pred_stride + step, mask=inside, other=0.0).to(tl.float32)
            observed = inside & (step <= accepted) & (step < admitted)
            label = tl.where(step < accepted, 1.0, 0.0)
            w = tl.where(observed, pred * (1.0 - pred), 0.0)
            resid = tl.where(observed, label - pred, 0.0)
            a += tl.sum(w * feature * feature, axis=0)
            b += tl.sum(w * feature, axis=0)
            c += tl.sum(w, axis=0)
            g0 += tl.sum(resid * feature, axis=0)
            g1 += tl.sum(resid, axis=0)
            count += tl.sum(tl.where(observed, 1.0, 0.0), axis=0)
        info = info_ptr + step * 3
        tl.store(info, tl.load(info) + a)
        tl.store(info + 1, tl.load(info + 1) + b)
        tl.store(info + 2, tl.load(info + 2) + c)
        grad = grad_ptr + step * 2
        tl.store(grad, tl.load(grad) + g0)
        tl.store(grad + 1, tl.load(grad + 1) + g1)
        tl.store(counts_ptr + step, tl.load(counts_ptr + step) + count)


def accumulate(
    grid: Grid,
    info_ptr: torch.Tensor,
    grad_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    features_ptr: torch.Tensor,
    features_stride: int,
    pred_ptr: torch.Tensor,
    pred_stride: int,
    counts_ptr: torch.Tensor,
    num_reqs: int,
    BLOCK_R: int,
) -> None:
    steps = grid_dim(grid, 0)
    if steps == 0:
        return
    device = info_ptr.device
    _accumulate_kernel[(_geometry.programs(device, steps),)](
        info_ptr,
        grad_ptr,
        idx_mapping_ptr,
        num_sampled_ptr,
        num_rejected_ptr,
        features_ptr,
        features_stride,
        pred_ptr,
        pred_stride,
        counts_ptr,
        max(0, min(num_reqs, BLOCK_R)),  # vLLM's one tile of BLOCK_R requests
        steps,
        TILE=_tile(device, next_power_of_2(max(1, min(num_reqs, BLOCK_R))), 8, cap=1024),
    )


@triton.jit
def _refit_kernel(
    slope_ptr,
    intercepts_ptr,
    info_ptr,
    info_row_stride,
    grad_ptr,
    grad_row_stride,
    counts_ptr,
    num_steps,
    L2: tl.constexpr,
    DAMPING: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # The arrowhead system (XᵀWX + λI) Δθ = Xᵀr solved in closed form: the slope step by the Schur
    # complement of the diagonal, then each intercept's; both damped by their observation counts.
    k = tl.arange(0, BLOCK)
    inside = k < num_steps
    a_k = tl.load(info_ptr + k * info_row_stride, mask=inside, other=0.0)
    b_k = tl.load(info_ptr + k * info_row_stride + 1, mask=inside, other=0.0)
    c_k = tl.load(info_ptr + k * info_row_stride + 2, mask=inside, other=0.0) + L2
    g0_k = tl.load(grad_ptr + k * grad_row_stride, mask=inside, other=0.0)
    g1_k = tl.load(grad_ptr + k * grad_row_stride + 1, mask=inside, other=0.0)
    n = tl.load(counts_ptr + k, mask=inside, other=0.0)
    slope = tl.load(slope_ptr)
    bias = tl.load(intercepts_ptr + k, mask=inside, other=0.0)

    schur = (tl.sum(a_k, axis=0) + L2) - tl.sum(b_k * b_k / c_k, axis=0)
    step_w = (tl.sum(g0_k, axis=0) - tl.sum(b_k * g1_k / c_k, axis=0)) / schur
    total = tl.sum(n, axis=0)
    step_w = step_w * (total / (total + DAMPING))
    step_w = tl.where((step_w == step_w) & (slope + step_w >= 0.0), step_w, 0.0)
    step_b = (g1_k - b_k * step_w) / c_k
    step_b = step_b * (n / (n + DAMPING))
    step_b = tl.where(step_b == step_b, step_b, 0.0)

    tl.store(slope_ptr, slope + step_w)
    tl.store(intercepts_ptr + k, bias + step_b, mask=inside)
    zero = tl.zeros([BLOCK], dtype=tl.float32)
    for column in tl.static_range(3):
        tl.store(info_ptr + k * info_row_stride + column, zero, mask=inside)
    for column in tl.static_range(2):
        tl.store(grad_ptr + k * grad_row_stride + column, zero, mask=inside)
    tl.store(counts_ptr + k, zero, mask=inside)


def refit(
    grid: Grid,
    slope_ptr: torch.Tensor,
    intercepts_ptr: torch.Tensor,
    info_ptr: torch.Tensor,
    info_row_stride: int,
    grad_ptr: torch.Tensor,
    grad_row_stride: int,
    counts_ptr: torch.Tensor,
    NUM_SPECULATIVE_STEPS: int,
    L2: float,
    DAMPING: float,
    BLOCK: int,
) -> None:
    if grid_dim(grid, 0) == 0:
        return
    _refit_kernel[(1,)](
        slope_ptr,
        intercepts_ptr,
        info_ptr,
        info_row_stride,
        grad_ptr,
        grad_row_stride,
        counts_ptr,
        min(NUM_SPECULATIVE_STEPS, BLOCK),
        L2=L2,
        DAMPING=DAMPING,
        BLOCK=BLOCK,
    )


@triton.jit
def _local_max_sumexp_kernel(
    local_max_ptr,
    local_max_stride,
    local_sumexp_ptr,
    local_sumexp_stride,
    logits_ptr,
    logits_stride,
    idx_mapping_ptr,
    idx_mapping_stride,
    temperature_ptr,
    num_rows,
    num_blocks,
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
):
    # (row, block) pairs grid-stride: the max and summed exponentials of the tempered block (-inf / 0 for
    # a padded row).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, num_rows * num_blocks, programs):
        row = item // num_blocks
        block = item - row * num_blocks
        row64 = tl.cast(row, tl.int64)
        state = tl.load(idx_mapping_ptr + row64 * idx_mapping_stride).to(tl.int64)
        top = tl.full([], float("-inf"), tl.float32)
        total = tl.full([], 0.0, tl.float32)
        if state >= 0:
            temp = tl.load(temperature_ptr + state).to(tl.float32)
            temp = tl.where(temp > 0.0, temp, 1.0)
            logits_row = logits_ptr + row64 * logits_stride
            block_start = block * BLOCK_SIZE
            for start in range(0, BLOCK_SIZE, TILE):
                offs = block_start + start + tl.arange(0, TILE)
                x = tl.load(logits_row + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
                x = x / temp
                new_top = tl.maximum(top, tl.max(x, axis=0))
                live = new_top > float("-inf")
                total = tl.where(
                    live, total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), axis=0), 0.0
                )
                top = new_top
        tl.store(local_max_ptr + row64 * local_max_stride + block, top)
        tl.store(local_sumexp_ptr + row64 * local_sumexp_stride + block, total)


def local_max_sumexp(
    grid: Grid,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    local_sumexp_ptr: torch.Tensor,
    local_sumexp_stride: int,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    idx_mapping_ptr: torch.Tensor,
    idx_mapping_stride: int,
    temperature_ptr: torch.Tensor,
    num_tokens: int,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    rows, blocks = min(grid_dim(grid, 0), num_tokens), grid_dim(grid, 1)
    if rows <= 0 or blocks == 0:
        return
    device = logits_ptr.device
    _local_max_sumexp_kernel[(_geometry.programs(device, rows * blocks),)](
        local_max_ptr,
        local_max_stride,
        local_sumexp_ptr,
        local_sumexp_stride,
        logits_ptr,
        logits_stride,
        idx_mapping_ptr,
        idx_mapping_stride,
        temperature_ptr,
        rows,
        blocks,
        vocab_size,
        BLOCK_SIZE=BLOCK_SIZE,
        TILE=_tile(device, BLOCK_SIZE, 4),
    )


@triton.jit
def _predict_kernel(
    features_ptr,
    features_stride,
    pred_ptr,
    pred_stride,
    conf_ptr,
    conf_stride,
    slope_ptr,
    intercepts_ptr,
    local_max_ptr,
    local_max_stride,
    local_sumexp_ptr,
    local_sumexp_stride,
    idx_mapping_ptr,
    idx_mapping_stride,
    step_ptr,
    num_rows,
    vocab_num_blocks,
    PER_TOKEN_STEP: tl.constexpr,
    NUM_SPECULATIVE_STEPS: tl.constexpr,
    MAX_LOG_ODDS: tl.constexpr,
    PADDED: tl.constexpr,
):
    # Rows grid-stride (padded rows skipped): feature = -log(sum of the other tokens' exponentials
    # relative to the max), clamped; prediction = sigmoid(slope * feature + intercept[step]).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    slope = tl.load(slope_ptr)
    for row in range(pid, num_rows, programs):
        row64 = tl.cast(row, tl.int64)
        state = tl.load(idx_mapping_ptr + row64 * idx_mapping_stride).to(tl.int64)
        if state >= 0:
            if PER_TOKEN_STEP:
                step = tl.load(step_ptr + row64).to(tl.int64)
                batch = row64 // NUM_SPECULATIVE_STEPS
            else:
                step = tl.load(step_ptr).to(tl.int64)
                batch = row64
            blocks = tl.arange(0, PADDED)
            inside = blocks < vocab_num_blocks
            maxes = tl.load(
                local_max_ptr + row64 * local_max_stride + blocks, mask=inside, other=float("-inf")
            )
            sums = tl.load(local_sumexp_ptr + row64 * local_sumexp_stride + blocks, mask=inside, other=0.0)
            top = tl.max(maxes, axis=0)
            total = tl.sum(tl.where(inside, sums * tl.exp(maxes - top), 0.0), axis=0)
            # max(total - 1, 0) and the clamp keep the non-NaN operand (vLLM's fmaxf / fminf semantics,
            # spelled as comparisons so that no backend's NaN rule matters): a padded row's NaN -> 0.
            others = total - 1.0
            others = tl.where(others > 0.0, others, 0.0)
            feature = -tl.log(others)
            feature = tl.where(feature < -MAX_LOG_ODDS, -MAX_LOG_ODDS, feature)
            feature = tl.where(feature > MAX_LOG_ODDS, MAX_LOG_ODDS, feature)
            prob = 1.0 / (1.0 + tl.exp(-(slope * feature + tl.load(intercepts_ptr + step))))
            tl.store(features_ptr + state * features_stride + step, feature)
            tl.store(pred_ptr + state * pred_stride + step, prob)
            tl.store(conf_ptr + batch * conf_stride + step, prob)


def predict(
    grid: Grid,
    features_ptr: torch.Tensor,
    features_stride: int,
    pred_ptr: torch.Tensor,
    pred_stride: int,
    conf_ptr: torch.Tensor,
    conf_stride: int,
    slope_ptr: torch.Tensor,
    intercepts_ptr: torch.Tensor,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    local_sumexp_ptr: torch.Tensor,
    local_sumexp_stride: int,
    idx_mapping_ptr: torch.Tensor,
    idx_mapping_stride: int,
    step_ptr: torch.Tensor,
    num_tokens: int,
    vocab_num_blocks: int,
    per_token_step: bool,
    NUM_SPECULATIVE_STEPS: int,
    MAX_LOG_ODDS: float,
    PADDED_VOCAB_NUM_BLOCKS: int,
) -> None:
    rows = min(grid_dim(grid, 0), num_tokens)
    if rows <= 0:
        return
    _predict_kernel[(_geometry.programs(local_max_ptr.device, rows),)](
        features_ptr,
        features_stride,
        pred_ptr,
        pred_stride,
        conf_ptr,
        conf_stride,
        slope_ptr,
        intercepts_ptr,
        local_max_ptr,
        local_max_stride,
        local_sumexp_ptr,
        local_sumexp_stride,
        idx_mapping_ptr,
        idx_mapping_stride,
        step_ptr,
        rows,
        vocab_num_blocks,
        PER_TOKEN_STEP=per_token_step,
        NUM_SPECULATIVE_STEPS=NUM_SPECULATIVE_STEPS,
        MAX_LOG_ODDS=MAX_LOG_ODDS,
        PADDED=PADDED_VOCAB_NUM_BLOCKS,
    )
