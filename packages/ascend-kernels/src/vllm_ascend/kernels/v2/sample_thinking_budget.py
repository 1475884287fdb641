"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/thinking_budget.py`` (per-request
thinking-token budgets: the cached positions of the last reasoning start / natural end markers, and the
forced end-of-reasoning token once a budget is spent)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.thinking_budget"


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view from ``t``'s first element to the end of its storage: what ``ptr + offset`` addresses."""
    offset = t.storage_offset()
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size() - offset,), (1,), offset)


def _match_starts(tokens: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """``m[i]`` for ``i < len(tokens)``: ``tokens[i : i + len(pattern)] == pattern`` (within ``tokens``)."""
    total, length = tokens.shape[0], pattern.shape[0]
    found = torch.zeros(total, dtype=torch.bool, device=tokens.device)
    if length == 0:
        return ~found
    if total >= length:
        found[: total - length + 1] = (tokens.unfold(0, length, 1) == pattern[None, :]).all(dim=1)
    return found


def _last(mask: torch.Tensor, offset: int = 0) -> int:
    """The largest index of ``mask`` that is set, plus ``offset``; -1 when none is."""
    hits = mask.nonzero()
    return int(hits[-1]) + offset if hits.numel() else -1


def update_committed_marker_cache_torch(
    grid: Grid,
    req_ids_ptr: torch.Tensor,
    thinking_token_budget_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    total_len_ptr: torch.Tensor,
    cached_last_start_ptr: torch.Tensor,
    cached_last_end_ptr: torch.Tensor,
    cached_scan_pos_ptr: torch.Tensor,
    reasoning_start_token_ids_ptr: torch.Tensor,
    natural_reasoning_end_token_ids_ptr: torch.Tensor,
    START_LEN: int,
    NATURAL_END_LEN: int,
    MAX_LEN: int,
    BLOCK: int,
) -> None:
    """Reference of :func:`update_committed_marker_cache`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    start_ids = reasoning_start_token_ids_ptr[:START_LEN]
    end_ids = natural_reasoning_end_token_ids_ptr[:NATURAL_END_LEN]
    states = req_ids_ptr[:num_reqs].long().tolist()
    for s in states:
        if int(thinking_token_budget_ptr[s]) < 0:
            continue
        total = int(total_len_ptr[s])
        scan = int(cached_scan_pos_ptr[s])
        last_start = int(cached_last_start_ptr[s])
        last_end = int(cached_last_end_ptr[s])
        if scan > total:
            scan, last_start, last_end = 0, -1, -1
        offset = s * all_token_ids_stride
        tokens = _flat(all_token_ids_ptr)[offset : offset + max(total, 0)]
        if scan == 0 and last_start < 0 and last_end < 0:
            # Cold scan: vLLM walks blocks [total - (k + 1) * BLOCK, total - k * BLOCK) (clipped at 0)
            # downwards and keeps the last markers of the first block holding either marker.
            starts, ends = _match_starts(tokens, start_ids), _match_starts(tokens, end_ids)
            newest = _last(starts | ends)
            if newest >= 0:
                k = (total - 1 - newest) // BLOCK
                lo, hi = max(total - (k + 1) * BLOCK, 0), total - k * BLOCK
                last_start = _last(starts[lo:hi], lo)
                last_end = _last(ends[lo:hi], lo)
        elif scan < total:
            window = tokens[scan:]
            found = _last(_match_starts(window, start_ids), scan)
            if found >= 0:
                last_start = found
            found = _last(_match_starts(window, end_ids), scan)
            if found >= 0:
                last_end = found
        cached_last_start_ptr[s] = last_start
        cached_last_end_ptr[s] = last_end
        cached_scan_pos_ptr[s] = max(total - (MAX_LEN - 1), 0)


def update_committed_marker_cache(
    grid: Grid,
    req_ids_ptr: torch.Tensor,
    thinking_token_budget_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    total_len_ptr: torch.Tensor,
    cached_last_start_ptr: torch.Tensor,
    cached_last_end_ptr: torch.Tensor,
    cached_scan_pos_ptr: torch.Tensor,
    reasoning_start_token_ids_ptr: torch.Tensor,
    natural_reasoning_end_token_ids_ptr: torch.Tensor,
    START_LEN: int,
    NATURAL_END_LEN: int,
    MAX_LEN: int,
    BLOCK: int,
) -> None:
    """Updates, in place, the cached positions of the last reasoning-start and natural-end markers in
    the committed tokens of request ``req_ids[p]`` (``p < grid[0]``, budgeted requests only): from
    ``cached_scan_pos`` to ``total_len`` (a marker found replaces the cached one), or, on a cold cache
    (``scan_pos == 0``, both -1; also after ``scan_pos > total_len`` reset it), vLLM's backward scan in
    ``BLOCK``-token blocks that stops at the first block holding either marker (the last of each marker
    in that block, -1 for one it lacks). ``cached_scan_pos = max(total_len - (MAX_LEN - 1), 0)``."""
    impl = dispatch_v2(
        "sample_thinking_budget",
        "update_committed_marker_cache",
        update_committed_marker_cache_torch,
        all_token_ids_ptr.device,
    )
    impl(
        grid,
        req_ids_ptr,
        thinking_token_budget_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        total_len_ptr,
        cached_last_start_ptr,
        cached_last_end_ptr,
        cached_scan_pos_ptr,
        reasoning_start_token_ids_ptr,
        natural_reasoning_end_token_ids_ptr,
        START_LEN,
        NATURAL_END_LEN,
        MAX_LEN,
        BLOCK,
    )


def thinking_budget_torch(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    thinking_token_budget_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    total_len_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    cached_last_start_ptr: torch.Tensor,
    cached_last_end_ptr: torch.Tensor,
    reasoning_start_token_ids_ptr: torch.Tensor,
    natural_reasoning_end_token_ids_ptr: torch.Tensor,
    reasoning_end_token_ids_ptr: torch.Tensor,
    START_LEN: int,
    NATURAL_END_LEN: int,
    END_LEN: int,
) -> None:
    """Reference of :func:`thinking_budget`."""
    num_tokens = grid_dim(grid, 0)
    if num_tokens == 0:
        return
    device = logits_ptr.device
    token = torch.arange(num_tokens, device=device)
    state = expanded_idx_mapping_ptr[:num_tokens].long()
    budget = thinking_token_budget_ptr[state].long()
    live = budget >= 0
    if not bool(live.any()):
        return
    token, state, budget = token[live], state[live], budget[live]
    local_pos = expanded_local_pos_ptr[token].long()
    total = total_len_ptr[state].long()
    effective = total + local_pos
    first = token - local_pos

    # The effective tokens of each row at positions effective - width + c: committed tokens below
    # total_len, then the row's draft prefix (input_ids from local position 1).
    width = max(START_LEN, NATURAL_END_LEN, END_LEN) + int(local_pos.max()) + 1
    q = effective[:, None] - width + torch.arange(width, device=device)[None, :]
    committed = (q >= 0) & (q < total[:, None])
    flat_tokens = _flat(all_token_ids_ptr)
    from_committed = flat_tokens[(state[:, None] * all_token_ids_stride + q.clamp_min(0)) * committed]
    inputs = _flat(input_ids_ptr)
    draft = ((first + 1 - total)[:, None] + q).clamp(0, max(inputs.numel() - 1, 0))
    tokens = torch.where(committed, from_committed.long(), inputs[draft].long())
    valid = q >= 0

    def last_match(pattern: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
        length = pattern.shape[0]
        lo = (total - length + 1).clamp_min(0)
        hit = (q >= lo[:, None]) & (q + length <= effective[:, None])
        for j in range(length):
            shifted = torch.full_like(tokens, -1)
            shifted_valid = torch.zeros_like(valid)
            shifted[:, : width - j] = tokens[:, j:]
            shifted_valid[:, : width - j] = valid[:, j:]
            hit &= shifted_valid & (shifted == int(pattern[j]))
        found = torch.where(hit, q, -1).amax(dim=1)
        return torch.where(found >= 0, found, cached)

    last_start = last_match(reasoning_start_token_ids_ptr[:START_LEN], cached_last_start_ptr[state].long())
    last_end = last_match(
        natural_reasoning_end_token_ids_ptr[:NATURAL_END_LEN], cached_last_end_ptr[state].long()
    )
    forced = (last_start >= 0) & (last_start > last_end) & (effective - (last_start + START_LEN) >= budget)
    if not bool(forced.any()):
        return

    # The longest proper prefix of the end sequence the effective tokens already end with.
    end_ids = reasoning_end_token_ids_ptr[:END_LEN].long()
    prefix_len = torch.zeros_like(effective)
    for p in range(1, END_LEN):
        tail = tokens[:, width - p :]
        match = (effective >= p) & (tail == end_ids[:p][None, :]).all(dim=1)
        prefix_len = torch.where(match, p, prefix_len)
    force_id = end_ids[prefix_len]
    rows, ids = token[forced], force_id[forced]
    _flat(logits_ptr)[rows * logits_stride + ids] = torch.tensor(1.0e9, dtype=logits_ptr.dtype)


def thinking_budget(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    thinking_token_budget_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    total_len_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    cached_last_start_ptr: torch.Tensor,
    cached_last_end_ptr: torch.Tensor,
    reasoning_start_token_ids_ptr: torch.Tensor,
    natural_reasoning_end_token_ids_ptr: torch.Tensor,
    reasoning_end_token_ids_ptr: torch.Tensor,
    START_LEN: int,
    NATURAL_END_LEN: int,
    END_LEN: int,
) -> None:
    """Forces the end of reasoning once a budget is spent, in place. Logits row ``t < grid[0]`` of a
    budgeted request (state ``s``, local position ``k``) sees the effective sequence: the committed
    tokens, then its draft prefix ``input_ids[t - k + 1 ..]`` (``total_len + k`` tokens). The last
    start / natural-end markers are the cached ones, unless one ends in the uncommitted part. When the
    last start follows the last end and at least ``budget`` tokens follow it, ``logits[t, id] = 1e9``
    for ``id`` the end sequence's token after the longest proper prefix of it the effective sequence
    ends with (its first token when none)."""
    impl = dispatch_v2("sample_thinking_budget", "thinking_budget", thinking_budget_torch, logits_ptr.device)
    impl(
        grid,
        logits_ptr,
        logits_stride,
        expanded_idx_mapping_ptr,
        thinking_token_budget_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        total_len_ptr,
        input_ids_ptr,
        expanded_local_pos_ptr,
        cached_last_start_ptr,
        cached_last_end_ptr,
        reasoning_start_token_ids_ptr,
        natural_reasoning_end_token_ids_ptr,
        reasoning_end_token_ids_ptr,
        START_LEN,
        NATURAL_END_LEN,
        END_LEN,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._update_committed_marker_cache_kernel": update_committed_marker_cache,
    f"{_VLLM}._thinking_budget_kernel": thinking_budget,
}
