"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.spec_decode_dflash2`.

One program per vector core walks the rows (candidate walk) or the sampled steps (logits cache)
grid-stride; a step's ``top_k`` candidates are one vector. The walk's Gumbel noise reuses the murmur3
helpers of ``sample_gumbel``; fp64 walks run the torch reference (no fp64 on Ascend's vector units).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.v2.sample_gumbel import (
    gumbel_from_uniform,
    murmur3_prefix,
    murmur3_uniform_from_prefix,
)
from vllm_ascend.kernels.v2 import spec_decode_dflash2 as reference
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2

_SALT = tl.constexpr(reference.DRAFT_NOISE_SALT)


@triton.jit
def _walk_kernel(
    scores_ptr,
    candidate_ptr,
    sample_pos_ptr,
    req_state_ptr,
    temperature_ptr,
    seeds_ptr,
    tokens_ptr,
    realized_scores_ptr,
    num_rows,
    num_steps: tl.constexpr,
    top_k: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SAMPLE_PROBABILISTIC: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    k = tl.arange(0, BLOCK_K)
    in_k = k < top_k
    for row in range(pid, num_rows, programs):
        first = tl.cast(row, tl.int64) * num_steps
        req = tl.load(req_state_ptr + first).to(tl.int64)
        if req >= 0:
            if SAMPLE_PROBABILISTIC:
                temp = tl.load(temperature_ptr + req).to(tl.float32)
            else:
                temp = tl.full([], 0.0, tl.float32)
            seed = tl.load(seeds_ptr + req).to(tl.int64)
            previous = tl.full([], 0, tl.int64)
            for step in range(num_steps):
                flat = first + step
                scores = tl.load(
                    scores_ptr + (flat * top_k + previous) * top_k + k, mask=in_k, other=float("-inf")
                ).to(tl.float32)
                candidates = tl.load(candidate_ptr + flat * top_k + k, mask=in_k, other=0)
                tl.store(realized_scores_ptr + flat * top_k + k, scores, mask=in_k)
                values = scores
                if temp != 0.0:
                    pos = tl.load(sample_pos_ptr + flat).to(tl.int64) - 1 + _SALT
                    noise = gumbel_from_uniform(
                        murmur3_uniform_from_prefix(murmur3_prefix(seed, pos), candidates)
                    )
                    values = tl.where(in_k, scores / temp + noise, float("-inf"))
                _, index = tl.max(values, axis=0, return_indices=True)
                index = index.to(tl.int64)
                tl.store(
                    tokens_ptr + flat,
                    tl.load(candidate_ptr + flat * top_k + index).to(tokens_ptr.dtype.element_ty),
                )
                previous = index


def selector_walk(
    grid: Grid,
    scores_ptr: torch.Tensor,
    candidate_ptr: torch.Tensor,
    sample_pos_ptr: torch.Tensor,
    req_state_ptr: torch.Tensor,
    temperature_ptr: torch.Tensor,
    seeds_ptr: torch.Tensor,
    tokens_ptr: torch.Tensor,
    realized_scores_ptr: torch.Tensor,
    num_steps: int,
    top_k: int,
    BLOCK_K: int,
    SAMPLE_PROBABILISTIC: bool,
    USE_FP64: bool,
) -> None:
    if USE_FP64:
        # Ascend's vector units have no fp64: the opt-in fp64 walk runs as torch ops on the device.
        reference.selector_walk_torch(
            grid,
            scores_ptr,
            candidate_ptr,
            sample_pos_ptr,
            req_state_ptr,
            temperature_ptr,
            seeds_ptr,
            tokens_ptr,
            realized_scores_ptr,
            num_steps,
            top_k,
            BLOCK_K,
            SAMPLE_PROBABILISTIC,
            USE_FP64,
        )
        return
    rows = grid_dim(grid, 0)
    if rows == 0 or num_steps == 0 or top_k == 0:
        return
    programs = _geometry.programs(candidate_ptr.device, rows)
    _walk_kernel[(programs,)](
        scores_ptr,
        candidate_ptr,
        sample_pos_ptr,
        req_state_ptr,
        temperature_ptr,
        seeds_ptr,
        tokens_ptr,
        realized_scores_ptr,
        rows,
        num_steps=num_steps,
        top_k=min(top_k, BLOCK_K),
        BLOCK_K=next_power_of_2(min(top_k, BLOCK_K)),
        SAMPLE_PROBABILISTIC=SAMPLE_PROBABILISTIC,
    )


@triton.jit
def _cache_kernel(
    draft_logits_ptr,
    cached_candidate_ptr,
    candidate_ptr,
    scores_ptr,
    req_state_ptr,
    draft_logits_stride_0,
    draft_logits_stride_1,
    num_sample,
    num_steps: tl.constexpr,
    top_k: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    k = tl.arange(0, BLOCK_K)
    in_k = k < top_k
    for flat in range(pid, num_sample, programs):
        req = tl.load(req_state_ptr + flat).to(tl.int64)
        if req >= 0:
            step = flat % num_steps
            cache = cached_candidate_ptr + (req * num_steps + step) * top_k + k
            row = draft_logits_ptr + req * draft_logits_stride_0 + step * draft_logits_stride_1
            old = tl.load(cache, mask=in_k, other=0)
            minus_inf = tl.full([BLOCK_K], float("-inf"), tl.float32).to(draft_logits_ptr.dtype.element_ty)
            tl.store(row + old, minus_inf, mask=in_k)
            base = tl.cast(flat, tl.int64) * top_k
            token_ids = tl.load(candidate_ptr + base + k, mask=in_k, other=0)
            scores = tl.load(scores_ptr + base + k, mask=in_k, other=0.0)
            tl.store(row + token_ids, scores.to(draft_logits_ptr.dtype.element_ty), mask=in_k)
            tl.store(cache, token_ids.to(cached_candidate_ptr.dtype.element_ty), mask=in_k)


def cache_draft_logits(
    grid: Grid,
    draft_logits_ptr: torch.Tensor,
    cached_candidate_ptr: torch.Tensor,
    candidate_ptr: torch.Tensor,
    scores_ptr: torch.Tensor,
    req_state_ptr: torch.Tensor,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    num_steps: int,
    top_k: int,
    BLOCK_K: int,
) -> None:
    num_sample = grid_dim(grid, 0)
    if num_sample == 0 or num_steps == 0 or top_k == 0:
        return
    programs = _geometry.programs(draft_logits_ptr.device, num_sample)
    _cache_kernel[(programs,)](
        draft_logits_ptr,
        cached_candidate_ptr,
        candidate_ptr,
        scores_ptr,
        req_state_ptr,
        draft_logits_stride_0,
        draft_logits_stride_1,
        num_sample,
        num_steps=num_steps,
        top_k=min(top_k, BLOCK_K),
        BLOCK_K=next_power_of_2(min(top_k, BLOCK_K)),
    )
