"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.spec_decode_ngram`.

Scan: one program per vector core walks the ``(request, block)`` pairs of vLLM's 2-D grid grid-stride. A
block's start positions are swept in UB-bounded tiles, only up to the last position any n-gram can start
at (``total_len - MIN_N - 1``), so blocks past it, and ineligible requests, cost one store of 0. Each
tile keeps, per position, the score of the longest matching n (n ascending, so a longer match overwrites),
and the tiles' maxima give the block's score, as vLLM's one-program-per-block launch writes it.
Finalize: one program per core walks the requests, reduces the request's block scores and gathers the
drafts in tiles of ``K``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


@triton.jit
def _scan_kernel(
    token_ids_ptr,
    token_ids_stride,
    idx_mapping_ptr,
    total_len_ptr,
    num_sampled_ptr,
    scratch_ptr,
    scratch_stride,
    scale,
    num_reqs,
    num_blocks,
    MIN_N: tl.constexpr,
    MAX_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, num_reqs * num_blocks, programs):
        req = item // num_blocks
        blk = item - req * num_blocks
        state = tl.load(idx_mapping_ptr + req).to(tl.int64)
        seq_len = tl.load(total_len_ptr + state).to(tl.int64)
        sampled = tl.load(num_sampled_ptr + req)
        # One past the last start position any n-gram can match at (none for ineligible requests).
        stop = tl.where((sampled > 0) & (seq_len >= MIN_N), seq_len - MIN_N, 0)
        block_start = tl.cast(blk, tl.int64) * BLOCK_L
        stop = tl.minimum(stop, block_start + BLOCK_L)
        row = token_ids_ptr + state * token_ids_stride
        best = tl.zeros([TILE], dtype=tl.int64)
        for first in range(block_start, stop, TILE):
            pos = first + tl.arange(0, TILE).to(tl.int64)
            score = tl.zeros([TILE], dtype=tl.int64)
            for n in tl.static_range(MIN_N, MAX_N + 1):
                match = pos < seq_len - n
                for j in tl.static_range(0, n):
                    # The j-th token of the length-n suffix (address clamped: no match reads it when n >= seq_len).
                    want = tl.load(row + tl.maximum(seq_len - n + j, 0)).to(tl.int32)
                    got = tl.load(row + pos + j, mask=match, other=0).to(tl.int32)
                    match = match & (got == want)
                score = tl.where(match, n * tl.cast(scale, tl.int64) + pos + 1, score)
            best = tl.maximum(best, score)
        tl.store(scratch_ptr + tl.cast(req, tl.int64) * scratch_stride + blk, tl.max(best, axis=0))


def ngram_scan(
    grid: Grid,
    token_ids_ptr: torch.Tensor,
    token_ids_stride: int,
    idx_mapping_ptr: torch.Tensor,
    total_len_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    scratch_ptr: torch.Tensor,
    scratch_stride: int,
    L: int,
    MIN_N: int,
    MAX_N: int,
    MAX_N_PO2: int,
    BLOCK_L: int,
) -> None:
    num_reqs, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or num_blocks == 0:
        return
    device = scratch_ptr.device
    # The tile holds the positions, their score and the running best, and a token row per compare.
    tile = min(ub_cap(device, BLOCK_L, live_tiles=8), next_power_of_2(BLOCK_L))
    _scan_kernel[(_geometry.programs(device, num_reqs * num_blocks),)](
        token_ids_ptr,
        token_ids_stride,
        idx_mapping_ptr,
        total_len_ptr,
        num_sampled_ptr,
        scratch_ptr,
        scratch_stride,
        int(L) + 1,
        num_reqs,
        num_blocks,
        MIN_N=MIN_N,
        MAX_N=MAX_N,
        BLOCK_L=BLOCK_L,
        TILE=tile,
    )


@triton.jit
def _finalize_kernel(
    token_ids_ptr,
    token_ids_stride,
    idx_mapping_ptr,
    total_len_ptr,
    num_sampled_ptr,
    last_sampled_ptr,
    scratch_ptr,
    scratch_stride,
    drafts_ptr,
    L,
    num_reqs,
    num_blocks,
    K: tl.constexpr,
    K_TILE: tl.constexpr,
    BLOCK_TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    scale = tl.cast(L, tl.int64) + 1
    for req in range(pid, num_reqs, programs):
        row64 = tl.cast(req, tl.int64)
        best = tl.zeros([BLOCK_TILE], dtype=tl.int64)
        for first in range(0, num_blocks, BLOCK_TILE):
            blocks = first + tl.arange(0, BLOCK_TILE)
            scores = tl.load(scratch_ptr + row64 * scratch_stride + blocks, mask=blocks < num_blocks, other=0)
            best = tl.maximum(best, scores.to(tl.int64))
        score = tl.max(best, axis=0)
        state = tl.load(idx_mapping_ptr + req).to(tl.int64)
        seq_len = tl.load(total_len_ptr + state).to(tl.int64)
        sampled = tl.load(num_sampled_ptr + req)
        last_token = tl.load(last_sampled_ptr + state).to(tl.int64)
        has_match = score > 0
        matched = tl.maximum(score - 1, 0)
        best_n = matched // scale
        draft_start = tl.where(has_match, matched - best_n * scale + best_n, 0)
        available = tl.where(has_match & (sampled > 0), tl.maximum(seq_len - draft_start, 0), 0)
        row = token_ids_ptr + state * token_ids_stride
        for k0 in range(0, K, K_TILE):
            k = k0 + tl.arange(0, K_TILE)
            take = k < available
            source = tl.minimum(draft_start + k, L - 1)
            tokens = tl.load(row + source, mask=take, other=0).to(tl.int64)
            out = tl.where(take, tokens, last_token)
            tl.store(drafts_ptr + row64 * K + k, out.to(drafts_ptr.dtype.element_ty), mask=k < K)


def ngram_finalize(
    grid: Grid,
    token_ids_ptr: torch.Tensor,
    token_ids_stride: int,
    idx_mapping_ptr: torch.Tensor,
    total_len_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    scratch_ptr: torch.Tensor,
    scratch_stride: int,
    drafts_ptr: torch.Tensor,
    L: int,
    N_BLOCKS: int,
    K: int,
    K_PO2: int,
    N_BLOCKS_PO2: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0 or K <= 0:
        return
    device = drafts_ptr.device
    _finalize_kernel[(_geometry.programs(device, num_reqs),)](
        token_ids_ptr,
        token_ids_stride,
        idx_mapping_ptr,
        total_len_ptr,
        num_sampled_ptr,
        last_sampled_ptr,
        scratch_ptr,
        scratch_stride,
        drafts_ptr,
        L,
        num_reqs,
        N_BLOCKS,
        K=K,
        K_TILE=min(next_power_of_2(K), ub_cap(device, 1024)),
        BLOCK_TILE=min(next_power_of_2(max(N_BLOCKS, 1)), ub_cap(device, 1024)),
    )
