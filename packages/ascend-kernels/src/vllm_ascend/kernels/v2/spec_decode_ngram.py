"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/spec_decode/ngram/speculator.py`` (the GPU
n-gram speculator: a blocked scan for the longest, rightmost earlier match of each request's suffix, then
the drafts copied from after that match)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.spec_decode.ngram.speculator"


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """The memory from ``tensor``'s first element to the end of its storage, as a flat view (what the
    kernel's ``ptr + offset`` addresses)."""
    numel = tensor.untyped_storage().nbytes() // tensor.element_size() - tensor.storage_offset()
    return tensor.as_strided((numel,), (1,))


def _position_scores(row: torch.Tensor, min_n: int, max_n: int, scale: int) -> torch.Tensor:
    """Per start position ``p`` of ``row`` (a request's ``seq_len`` tokens, int32): ``n * scale + p + 1`` for
    the longest ``n`` in ``[min_n, max_n]`` whose ``row[p:p + n]`` equals the last ``n`` tokens, with
    ``p + n < seq_len`` (the match is followed by a token); 0 where none."""
    seq_len = row.numel()
    scores = torch.zeros(seq_len, dtype=torch.int64, device=row.device)
    for n in range(min_n, max_n + 1):
        count = seq_len - n  # start positions p <= seq_len - n - 1
        if count <= 0:
            break
        match = (row.unfold(0, n, 1)[:count] == row[seq_len - n :]).all(dim=1)
        candidate = n * scale + torch.arange(1, count + 1, device=row.device)
        scores[:count] = torch.where(match, candidate, scores[:count])
    return scores


def ngram_scan_torch(
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
    """Reference of :func:`ngram_scan`."""
    num_reqs, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or num_blocks == 0:
        return
    tokens, scratch = _flat(token_ids_ptr), _flat(scratch_ptr)
    states = [int(s) for s in idx_mapping_ptr[:num_reqs].tolist()]
    sampled = [int(s) for s in num_sampled_ptr[:num_reqs].tolist()]
    span = num_blocks * BLOCK_L
    for batch, state in enumerate(states):
        seq_len = int(total_len_ptr[state])
        best = torch.zeros(span, dtype=torch.int64, device=scratch.device)
        if sampled[batch] > 0 and seq_len >= MIN_N:
            start = state * token_ids_stride
            row = tokens[start : start + seq_len].to(torch.int32)
            scores = _position_scores(row, MIN_N, MAX_N, int(L) + 1)[:span]
            best[: scores.numel()] = scores
        offset = batch * scratch_stride
        scratch[offset : offset + num_blocks] = best.view(num_blocks, BLOCK_L).amax(dim=1).to(scratch.dtype)


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
    """Blocked n-gram match scan, for ``grid = (num_reqs, num_blocks)``: ``scratch[b, blk]`` = the best
    ``n * (L + 1) + p + 1`` over start positions ``p`` in block ``blk`` (``BLOCK_L`` positions) where the
    ``n``-token window at ``p`` (``MIN_N <= n <= MAX_N``, ``p + n < total_len``) equals the last ``n`` tokens
    of request ``b``'s row (state ``idx_mapping[b]``); 0 without a match, and for requests that sampled
    nothing or are shorter than ``MIN_N``. The maximum ranks longest ``n`` first, then rightmost ``p``."""
    impl = dispatch_v2("spec_decode_ngram", "ngram_scan", ngram_scan_torch, scratch_ptr.device)
    impl(
        grid,
        token_ids_ptr,
        token_ids_stride,
        idx_mapping_ptr,
        total_len_ptr,
        num_sampled_ptr,
        scratch_ptr,
        scratch_stride,
        L,
        MIN_N,
        MAX_N,
        MAX_N_PO2,
        BLOCK_L,
    )


def ngram_finalize_torch(
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
    """Reference of :func:`ngram_finalize`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0 or K <= 0:
        return
    device = drafts_ptr.device
    scale = int(L) + 1
    batch = torch.arange(num_reqs, device=device)
    states = idx_mapping_ptr[:num_reqs].long()
    if N_BLOCKS > 0:
        cells = (batch * scratch_stride)[:, None] + torch.arange(N_BLOCKS, device=device)
        score = _flat(scratch_ptr)[cells].long().amax(dim=1)
    else:
        score = torch.zeros(num_reqs, dtype=torch.int64, device=device)
    has_match = score > 0
    s1 = score - 1
    best_n = torch.where(has_match, torch.div(s1, scale, rounding_mode="floor"), 0)
    best_pos = torch.where(has_match, s1 - best_n * scale, 0)
    draft_start = torch.where(has_match, best_pos + best_n, 0)
    seq_len = total_len_ptr[states].long()
    tokens_avail = torch.clamp_min(seq_len - draft_start, 0)
    write_ok = (num_sampled_ptr[:num_reqs] > 0) & has_match
    k = torch.arange(K, device=device)
    gather = torch.clamp_max(draft_start[:, None] + k, int(L) - 1)
    valid = (k < tokens_avail[:, None]) & write_ok[:, None]
    cells = (states * token_ids_stride)[:, None] + torch.where(valid, gather, 0)
    gathered = _flat(token_ids_ptr)[cells].long()
    last = _flat(last_sampled_ptr)[states].long()
    out = torch.where(valid, gathered, last[:, None])
    _flat(drafts_ptr)[(batch * K)[:, None] + k] = out.to(drafts_ptr.dtype)


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
    """Drafts of ``grid[0]`` requests from the scan: the best score over ``scratch[b, :N_BLOCKS]`` decodes to
    the match ``(n, p)``; ``drafts[b, k]`` (row stride ``K``) = ``token_ids[state, min(p + n + k, L - 1)]``
    for ``k < total_len - (p + n)``, else (and for requests without a match or sample) ``last_sampled[state]``."""
    impl = dispatch_v2("spec_decode_ngram", "ngram_finalize", ngram_finalize_torch, drafts_ptr.device)
    impl(
        grid,
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
        N_BLOCKS,
        K,
        K_PO2,
        N_BLOCKS_PO2,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._ngram_scan_kernel": ngram_scan,
    f"{_VLLM}._ngram_finalize_kernel": ngram_finalize,
}
