"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_thinking_budget`.

One program per vector core walks the requests (marker cache) or the logits rows (budget) grid-stride.
Marker searches test a tile of candidate positions at once (vLLM's warm scan and its draft-prefix scans
test one position per iteration); the cold scan keeps vLLM's backward ``BLOCK``-token walk, each block
swept in tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2

_TILE = 4 if IS_INTERPRETED else 256


@triton.jit
def _committed_matches(row_ptr, offs, total, live, pattern_ptr, LENGTH: tl.constexpr):
    """``live`` positions ``offs`` where the committed row holds ``pattern`` (within ``total``)."""
    found = live & (offs + LENGTH <= total)
    for j in tl.static_range(LENGTH):
        actual = tl.load(row_ptr + offs + j, mask=found, other=-1)
        found = found & (actual == tl.load(pattern_ptr + j))
    return found


@triton.jit
def _marker_cache_kernel(
    req_ids_ptr,
    thinking_token_budget_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    total_len_ptr,
    cached_last_start_ptr,
    cached_last_end_ptr,
    cached_scan_pos_ptr,
    start_ids_ptr,
    end_ids_ptr,
    num_reqs,
    START_LEN: tl.constexpr,
    NATURAL_END_LEN: tl.constexpr,
    MAX_LEN: tl.constexpr,
    BLOCK: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for p in range(pid, num_reqs, programs):
        state = tl.load(req_ids_ptr + p).to(tl.int64)
        if tl.load(thinking_token_budget_ptr + state) >= 0:
            total = tl.load(total_len_ptr + state)
            scan = tl.load(cached_scan_pos_ptr + state)
            last_start = tl.load(cached_last_start_ptr + state)
            last_end = tl.load(cached_last_end_ptr + state)
            reset = scan > total
            scan = tl.where(reset, 0, scan)
            last_start = tl.where(reset, -1, last_start)
            last_end = tl.where(reset, -1, last_end)
            row = all_token_ids_ptr + state * all_token_ids_stride
            if (scan == 0) & (last_start < 0) & (last_end < 0):
                # Cold: blocks downwards from total_len, up to the first one holding a marker.
                hi = total
                while (hi > 0) & (last_start < 0) & (last_end < 0):
                    lo = tl.maximum(hi - BLOCK, 0)
                    for t0 in range(lo, hi, TILE):
                        offs = t0 + tl.arange(0, TILE)
                        live = offs < hi
                        starts = _committed_matches(row, offs, total, live, start_ids_ptr, START_LEN)
                        ends = _committed_matches(row, offs, total, live, end_ids_ptr, NATURAL_END_LEN)
                        last_start = tl.maximum(last_start, tl.max(tl.where(starts, offs, -1), axis=0))
                        last_end = tl.maximum(last_end, tl.max(tl.where(ends, offs, -1), axis=0))
                    hi = lo
            else:
                for t0 in range(scan, total, TILE):
                    offs = t0 + tl.arange(0, TILE)
                    live = offs < total
                    starts = _committed_matches(row, offs, total, live, start_ids_ptr, START_LEN)
                    ends = _committed_matches(row, offs, total, live, end_ids_ptr, NATURAL_END_LEN)
                    found_start = tl.max(tl.where(starts, offs, -1), axis=0)
                    found_end = tl.max(tl.where(ends, offs, -1), axis=0)
                    last_start = tl.where(found_start >= 0, found_start, last_start)
                    last_end = tl.where(found_end >= 0, found_end, last_end)
            tl.store(cached_last_start_ptr + state, last_start)
            tl.store(cached_last_end_ptr + state, last_end)
            tl.store(cached_scan_pos_ptr + state, tl.maximum(total - (MAX_LEN - 1), 0))


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
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    programs = _geometry.programs(all_token_ids_ptr.device, num_reqs)
    _marker_cache_kernel[(programs,)](
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
        num_reqs,
        START_LEN=START_LEN,
        NATURAL_END_LEN=NATURAL_END_LEN,
        MAX_LEN=MAX_LEN,
        BLOCK=BLOCK,
        TILE=min(_TILE, next_power_of_2(BLOCK)),
    )


@triton.jit
def _effective_tokens(row_ptr, input_ids_ptr, first, total, pos, live):
    """Tokens at effective positions ``pos``: committed below ``total``, then the draft prefix
    (``input_ids`` from the row's local position 1)."""
    committed = tl.load(row_ptr + pos, mask=live & (pos < total), other=-1)
    drafted = tl.load(input_ids_ptr + first + pos - total + 1, mask=live & (pos >= total), other=-1)
    return tl.where(pos < total, committed, drafted.to(committed.dtype))


@triton.jit
def _last_effective_match(
    row_ptr, input_ids_ptr, first, total, lo, hi, pattern_ptr, last, LENGTH: tl.constexpr, TILE: tl.constexpr
):
    """The last position in ``[lo, hi)`` where the effective sequence holds ``pattern``, else ``last``."""
    for t0 in range(lo, hi, TILE):
        offs = t0 + tl.arange(0, TILE)
        found = offs < hi
        for j in tl.static_range(LENGTH):
            actual = _effective_tokens(row_ptr, input_ids_ptr, first, total, offs + j, found)
            found = found & (actual == tl.load(pattern_ptr + j))
        hit = tl.max(tl.where(found, offs, -1), axis=0)
        last = tl.where(hit >= 0, hit, last)
    return last


@triton.jit
def _budget_kernel(
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
    start_ids_ptr,
    natural_end_ids_ptr,
    end_ids_ptr,
    num_tokens,
    START_LEN: tl.constexpr,
    NATURAL_END_LEN: tl.constexpr,
    END_LEN: tl.constexpr,
    END_BLOCK: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for t in range(pid, num_tokens, programs):
        state = tl.load(expanded_idx_mapping_ptr + t).to(tl.int64)
        budget = tl.load(thinking_token_budget_ptr + state)
        if budget >= 0:
            local_pos = tl.load(expanded_local_pos_ptr + t)
            first = t - local_pos
            total = tl.load(total_len_ptr + state)
            effective = total + local_pos
            row = all_token_ids_ptr + state * all_token_ids_stride
            last_start = _last_effective_match(
                row,
                input_ids_ptr,
                first,
                total,
                tl.maximum(total - START_LEN + 1, 0),
                effective - START_LEN + 1,
                start_ids_ptr,
                tl.load(cached_last_start_ptr + state),
                START_LEN,
                TILE,
            )
            last_end = _last_effective_match(
                row,
                input_ids_ptr,
                first,
                total,
                tl.maximum(total - NATURAL_END_LEN + 1, 0),
                effective - NATURAL_END_LEN + 1,
                natural_end_ids_ptr,
                tl.load(cached_last_end_ptr + state),
                NATURAL_END_LEN,
                TILE,
            )
            if (last_start >= 0) & (last_start > last_end) & (effective - (last_start + START_LEN) >= budget):
                # The longest proper prefix of the end sequence the effective sequence ends with.
                prefix_len = tl.full([], 0, tl.int32)
                j = tl.arange(0, END_BLOCK)
                for p in tl.static_range(1, END_LEN):
                    in_prefix = (j < p) & (j * 0 + p <= effective)
                    actual = _effective_tokens(row, input_ids_ptr, first, total, effective - p + j, in_prefix)
                    expected = tl.load(end_ids_ptr + j, mask=in_prefix, other=-1)
                    mismatches = tl.sum(tl.where(in_prefix & (actual != expected), 1, 0), axis=0)
                    prefix_len = tl.where((p <= effective) & (mismatches == 0), p, prefix_len)
                force = tl.load(end_ids_ptr + prefix_len).to(tl.int64)
                value = tl.full([], 1.0e9, tl.float32).to(logits_ptr.dtype.element_ty)
                tl.store(logits_ptr + tl.cast(t, tl.int64) * logits_stride + force, value)


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
    num_tokens = grid_dim(grid, 0)
    if num_tokens == 0:
        return
    programs = _geometry.programs(logits_ptr.device, num_tokens)
    _budget_kernel[(programs,)](
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
        num_tokens,
        START_LEN=START_LEN,
        NATURAL_END_LEN=NATURAL_END_LEN,
        END_LEN=END_LEN,
        END_BLOCK=next_power_of_2(max(END_LEN, 2)),
        TILE=_TILE,
    )
