"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/spec_decode/multi_module_mtp/speculator.py``
(multi-module MTP drafting: first-module inputs with the re-prefill of the tokens whose later-module KV
went stale, trailing slot padding, the per-request input cache, and the in-place input shifts between
modules)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator"


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """The memory from ``tensor``'s first element to the end of its storage, as a flat view (what the
    kernel's ``ptr + offset`` addresses, with the launch's strides)."""
    numel = tensor.untyped_storage().nbytes() // tensor.element_size() - tensor.storage_offset()
    return tensor.as_strided((numel,), (1,))


def _ints(tensor: torch.Tensor, n: int) -> list[int]:
    return [int(v) for v in tensor[:n].tolist()]


def _copy_rows(
    dst: torch.Tensor, dst_offsets: torch.Tensor, src: torch.Tensor, src_offsets: torch.Tensor, width: int
) -> None:
    """``dst[dst_offsets[r] + c] = src[src_offsets[r] + c]`` for ``c < width`` (flat views; every source
    element read before any is written, so overlapping in-place moves act as ``memmove``)."""
    if width <= 0 or dst_offsets.numel() == 0:
        return
    cols = torch.arange(width, device=dst.device)
    values = src[src_offsets.to(dst.device)[:, None] + cols]
    dst[dst_offsets.to(dst.device)[:, None] + cols] = values.to(dst.dtype)


def _rejection_split(num_rejected: list[int], query_lens: list[int]) -> tuple[list[int], list[int]]:
    """Per request: the re-prefilled tokens ``max(0, rejected - 1)`` and the kept inputs ``query_len -
    rejected``."""
    reprefill = [max(0, r - 1) for r in num_rejected]
    kept = [q - r for q, r in zip(query_lens, num_rejected, strict=True)]
    return reprefill, kept


def prepare_input_buffers_torch(
    grid: Grid,
    last_token_indices_ptr: torch.Tensor,
    draft_input_ids_ptr: torch.Tensor,
    draft_positions_ptr: torch.Tensor,
    draft_seq_lens_ptr: torch.Tensor,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    cached_draft_input_ids_ptr: torch.Tensor | None,
    cached_draft_input_ids_stride0: int,
    draft_input_id_overrides_ptr: torch.Tensor,
    draft_input_id_overrides_stride0: int,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    next_prefill_tokens_stride0: int,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    target_seq_lens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    max_num_reqs: int,
    num_speculative_steps: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`prepare_input_buffers`."""
    n = grid_dim(grid, 0)
    if n == 0:
        return
    device = draft_input_ids_ptr.device
    qsl = _ints(query_start_loc_ptr, n + 1)
    states = _ints(idx_mapping_ptr, n)
    reprefill, kept = _rejection_split(
        _ints(num_rejected_ptr, n), [b - a for a, b in itertools.pairwise(qsl)]
    )
    sampled = num_sampled_ptr[:n] > 0
    state_index = torch.tensor(states, dtype=torch.int64, device=device)
    next_prefill = _flat(next_prefill_tokens_ptr)

    seq_lens = target_seq_lens_ptr[:n].long() - torch.tensor(reprefill, device=device)
    draft_seq_lens_ptr[:n] = seq_lens.to(draft_seq_lens_ptr.dtype)
    last = _flat(last_sampled_ptr)[state_index].to(torch.int32)
    next_tokens = torch.where(sampled, last, next_prefill[state_index].to(torch.int32))
    if num_speculative_steps > 1:
        future = torch.arange(1, num_speculative_steps, device=device)
        upcoming = next_prefill[(future * next_prefill_tokens_stride0)[None, :] + state_index[:, None]].long()
        overrides = torch.where(sampled[:, None], torch.full_like(upcoming, -1), upcoming)
        rows = torch.arange(n, device=device) * draft_input_id_overrides_stride0
        _flat(draft_input_id_overrides_ptr)[rows[:, None] + future - 1] = overrides.to(
            draft_input_id_overrides_ptr.dtype
        )

    ids, positions = _flat(draft_input_ids_ptr), _flat(draft_positions_ptr)
    target_ids, target_pos = _flat(target_input_ids_ptr), _flat(target_positions_ptr)
    cached = None if cached_draft_input_ids_ptr is None else _flat(cached_draft_input_ids_ptr)
    next_ids = next_tokens.to(ids.dtype)
    for batch, state in enumerate(states):
        start, gap, count = qsl[batch], reprefill[batch], kept[batch]
        if count > 1:
            ids[start + gap : start + gap + count - 1] = target_ids[start + 1 : start + count].to(ids.dtype)
        ids[start + gap + count - 1] = next_ids[batch]
        if count > 0:
            positions[start + gap : start + gap + count] = target_pos[start : start + count].to(
                positions.dtype
            )
        if gap > 0:
            assert cached is not None
            base = state * cached_draft_input_ids_stride0 + num_speculative_steps - 1 - gap
            ids[start : start + gap] = cached[base : base + gap].to(ids.dtype)
            first = int(target_pos[start])
            positions[start : start + gap] = torch.arange(first - gap, first, device=device).to(
                positions.dtype
            )
    last_index = [start + gap + count - 1 for start, gap, count in zip(qsl[:n], reprefill, kept, strict=True)]
    last_token_indices_ptr[:n] = torch.tensor(last_index, dtype=last_token_indices_ptr.dtype, device=device)
    query_start_loc_ptr[n : max_num_reqs + 1] = qsl[n]
    draft_seq_lens_ptr[n:max_num_reqs] = 0
    last_token_indices_ptr[n:max_num_reqs] = 0


def prepare_input_buffers(
    grid: Grid,
    last_token_indices_ptr: torch.Tensor,
    draft_input_ids_ptr: torch.Tensor,
    draft_positions_ptr: torch.Tensor,
    draft_seq_lens_ptr: torch.Tensor,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    cached_draft_input_ids_ptr: torch.Tensor | None,
    cached_draft_input_ids_stride0: int,
    draft_input_id_overrides_ptr: torch.Tensor,
    draft_input_id_overrides_stride0: int,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    next_prefill_tokens_stride0: int,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    target_seq_lens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    max_num_reqs: int,
    num_speculative_steps: int,
    BLOCK_SIZE: int,
) -> None:
    """First-MTP-module token inputs, in place, for ``n = grid[0]`` requests.

    Request ``i`` (state ``s``, query ``qs .. qe``, ``rej`` rejected, ``g = max(0, rej - 1)`` re-prefilled,
    ``v = qe - qs - rej`` kept): ``draft_seq_lens[i] = target_seq_lens[i] - g``; ``overrides[i, k - 1]`` for
    ``0 < k < num_speculative_steps`` = -1 when it sampled, else ``next_prefill_tokens[k, s]``; the draft
    ids are ``g`` cached ids (``cached_draft_input_ids[s, steps - 1 - g:]``), then the target ids shifted
    left by one, then the next token (``last_sampled[s]`` or ``next_prefill_tokens[0, s]``) at
    ``last_token_indices[i] = qs + g + v - 1``; positions are the ``g`` positions before the target's first,
    then the target's ``v``. The last request pads ``query_start_loc[n:max_num_reqs + 1]`` with its query
    end and zeroes ``draft_seq_lens`` and ``last_token_indices`` ``[n:max_num_reqs]``."""
    impl = dispatch_v2(
        "spec_decode_multi_module_mtp",
        "prepare_input_buffers",
        prepare_input_buffers_torch,
        draft_input_ids_ptr.device,
    )
    impl(
        grid,
        last_token_indices_ptr,
        draft_input_ids_ptr,
        draft_positions_ptr,
        draft_seq_lens_ptr,
        target_input_ids_ptr,
        target_positions_ptr,
        cached_draft_input_ids_ptr,
        cached_draft_input_ids_stride0,
        draft_input_id_overrides_ptr,
        draft_input_id_overrides_stride0,
        idx_mapping_ptr,
        last_sampled_ptr,
        next_prefill_tokens_ptr,
        next_prefill_tokens_stride0,
        num_sampled_ptr,
        num_rejected_ptr,
        target_seq_lens_ptr,
        query_start_loc_ptr,
        max_num_reqs,
        num_speculative_steps,
        BLOCK_SIZE,
    )


def prepare_input_hidden_states_and_embeddings_torch(
    grid: Grid,
    draft_input_hidden_states_ptr: torch.Tensor,
    draft_input_hidden_states_stride0: int,
    target_hidden_states_ptr: torch.Tensor,
    target_hidden_states_stride0: int,
    cached_target_hidden_states_ptr: torch.Tensor | None,
    cached_target_hidden_states_stride0: int,
    cached_target_hidden_states_stride1: int,
    input_embeds_ptr: torch.Tensor | None,
    input_embeds_stride0: int,
    cached_draft_input_embeds_ptr: torch.Tensor | None,
    cached_draft_input_embeds_stride0: int,
    cached_draft_input_embeds_stride1: int,
    idx_mapping_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_speculative_steps: int,
    hidden_size: int,
    BLOCK_SIZE_Q: int,
    BLOCK_SIZE_H: int,
    USE_INPUT_EMBEDS: bool,
) -> None:
    """Reference of :func:`prepare_input_hidden_states_and_embeddings`."""
    n, query_blocks, dim_blocks = grid_dim(grid, 0), grid_dim(grid, 1), grid_dim(grid, 2)
    width = min(hidden_size, dim_blocks * BLOCK_SIZE_H)
    if n == 0 or query_blocks == 0 or width <= 0:
        return
    device = draft_input_hidden_states_ptr.device
    qsl = _ints(query_start_loc_ptr, n + 1)
    reprefill, kept = _rejection_split(
        _ints(num_rejected_ptr, n), [b - a for a, b in itertools.pairwise(qsl)]
    )
    states = _ints(idx_mapping_ptr, n)
    draft = _flat(draft_input_hidden_states_ptr)
    target = _flat(target_hidden_states_ptr)
    for batch, state in enumerate(states):
        start, gap = qsl[batch], reprefill[batch]
        rows = torch.arange(max(0, min(kept[batch], query_blocks * BLOCK_SIZE_Q)), device=device)
        _copy_rows(
            draft,
            (start + gap + rows) * draft_input_hidden_states_stride0,
            target,
            (start + rows) * target_hidden_states_stride0,
            width,
        )
        if gap <= 0:
            continue
        gap_rows = torch.arange(gap, device=device)
        slots = num_speculative_steps - 1 - gap + gap_rows
        assert cached_target_hidden_states_ptr is not None
        _copy_rows(
            draft,
            (start + gap_rows) * draft_input_hidden_states_stride0,
            _flat(cached_target_hidden_states_ptr),
            state * cached_target_hidden_states_stride0 + slots * cached_target_hidden_states_stride1,
            width,
        )
        if USE_INPUT_EMBEDS:
            assert input_embeds_ptr is not None and cached_draft_input_embeds_ptr is not None
            _copy_rows(
                _flat(input_embeds_ptr),
                (start + gap_rows) * input_embeds_stride0,
                _flat(cached_draft_input_embeds_ptr),
                state * cached_draft_input_embeds_stride0 + slots * cached_draft_input_embeds_stride1,
                width,
            )


def prepare_input_hidden_states_and_embeddings(
    grid: Grid,
    draft_input_hidden_states_ptr: torch.Tensor,
    draft_input_hidden_states_stride0: int,
    target_hidden_states_ptr: torch.Tensor,
    target_hidden_states_stride0: int,
    cached_target_hidden_states_ptr: torch.Tensor | None,
    cached_target_hidden_states_stride0: int,
    cached_target_hidden_states_stride1: int,
    input_embeds_ptr: torch.Tensor | None,
    input_embeds_stride0: int,
    cached_draft_input_embeds_ptr: torch.Tensor | None,
    cached_draft_input_embeds_stride0: int,
    cached_draft_input_embeds_stride1: int,
    idx_mapping_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_speculative_steps: int,
    hidden_size: int,
    BLOCK_SIZE_Q: int,
    BLOCK_SIZE_H: int,
    USE_INPUT_EMBEDS: bool,
) -> None:
    """First-MTP-module hidden-state (and embedding) inputs, in place, for ``grid = (n, query blocks, dim
    blocks)``: request ``i``'s ``v`` kept target hidden states go to draft rows ``qs + g + q`` (``g`` re-
    prefilled, as :func:`prepare_input_buffers`), and its ``g`` gap rows ``qs + j`` get the cached target
    hidden states (and, with ``USE_INPUT_EMBEDS``, the cached embeddings into ``input_embeds``) of slots
    ``steps - 1 - g + j``. The grid bounds the copy: ``q < grid[1] * BLOCK_SIZE_Q`` rows and
    ``grid[2] * BLOCK_SIZE_H`` columns (of ``hidden_size``)."""
    impl = dispatch_v2(
        "spec_decode_multi_module_mtp",
        "prepare_input_hidden_states_and_embeddings",
        prepare_input_hidden_states_and_embeddings_torch,
        draft_input_hidden_states_ptr.device,
    )
    impl(
        grid,
        draft_input_hidden_states_ptr,
        draft_input_hidden_states_stride0,
        target_hidden_states_ptr,
        target_hidden_states_stride0,
        cached_target_hidden_states_ptr,
        cached_target_hidden_states_stride0,
        cached_target_hidden_states_stride1,
        input_embeds_ptr,
        input_embeds_stride0,
        cached_draft_input_embeds_ptr,
        cached_draft_input_embeds_stride0,
        cached_draft_input_embeds_stride1,
        idx_mapping_ptr,
        num_rejected_ptr,
        query_start_loc_ptr,
        num_speculative_steps,
        hidden_size,
        BLOCK_SIZE_Q,
        BLOCK_SIZE_H,
        USE_INPUT_EMBEDS,
    )


def pad_trailing_draft_slots_torch(
    grid: Grid,
    slot_mappings_ptr: torch.Tensor,
    slot_mappings_stride0: int,
    query_start_loc_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    PAD_ID: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`pad_trailing_draft_slots`."""
    groups, n = grid_dim(grid, 0), grid_dim(grid, 1)
    if groups == 0 or n == 0:
        return
    device = slot_mappings_ptr.device
    starts = last_token_indices_ptr[:n].long().to(device) + 1
    ends = query_start_loc_ptr[1 : n + 1].long().to(device)
    counts = torch.clamp_min(ends - starts, 0)
    total = int(counts.sum())
    if total == 0:
        return
    slots = torch.arange(total, device=device) - torch.repeat_interleave(
        torch.cumsum(counts, 0) - counts, counts
    )
    slots = slots + torch.repeat_interleave(starts, counts)
    cells = (torch.arange(groups, device=device) * slot_mappings_stride0)[:, None] + slots
    _flat(slot_mappings_ptr)[cells] = torch.tensor(PAD_ID, dtype=slot_mappings_ptr.dtype, device=device)


def pad_trailing_draft_slots(
    grid: Grid,
    slot_mappings_ptr: torch.Tensor,
    slot_mappings_stride0: int,
    query_start_loc_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    PAD_ID: int,
    BLOCK_SIZE: int,
) -> None:
    """For ``grid = (groups, n)``: ``slot_mappings[g, last_token_indices[i] + 1 : query_start_loc[i + 1]] =
    PAD_ID``, in place (the stale trailing slots of each request, in every KV-cache group)."""
    impl = dispatch_v2(
        "spec_decode_multi_module_mtp",
        "pad_trailing_draft_slots",
        pad_trailing_draft_slots_torch,
        slot_mappings_ptr.device,
    )
    impl(
        grid,
        slot_mappings_ptr,
        slot_mappings_stride0,
        query_start_loc_ptr,
        last_token_indices_ptr,
        PAD_ID,
        BLOCK_SIZE,
    )


def cache_inputs_torch(
    grid: Grid,
    draft_input_ids_ptr: torch.Tensor,
    draft_input_embeds_ptr: torch.Tensor | None,
    draft_input_embeds_stride0: int,
    draft_input_hidden_states_ptr: torch.Tensor,
    draft_input_hidden_states_stride0: int,
    cached_draft_input_ids_ptr: torch.Tensor,
    cached_draft_input_ids_stride0: int,
    cached_draft_input_embeds_ptr: torch.Tensor | None,
    cached_draft_input_embeds_stride0: int,
    cached_draft_input_embeds_stride1: int,
    cached_target_hidden_states_ptr: torch.Tensor,
    cached_target_hidden_states_stride0: int,
    cached_target_hidden_states_stride1: int,
    idx_mapping_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_speculative_steps: int,
    hidden_size: int,
    BLOCK_SIZE: int,
    USE_INPUT_EMBEDS: bool,
) -> None:
    """Reference of :func:`cache_inputs`."""
    n, dim_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if n == 0 or dim_blocks == 0:
        return
    device = draft_input_hidden_states_ptr.device
    width = min(hidden_size, dim_blocks * BLOCK_SIZE)
    window = num_speculative_steps - 1
    ids, cached_ids = _flat(draft_input_ids_ptr), _flat(cached_draft_input_ids_ptr)
    for batch, state in enumerate(_ints(idx_mapping_ptr, n)):
        if state < 0:
            continue
        start = int(query_start_loc_ptr[batch])
        last = int(last_token_indices_ptr[batch])
        window_start = last - window + 1
        first = max(window_start, start)
        if first > last:
            continue
        tokens = torch.arange(first, last + 1, device=device)
        slots = tokens - window_start
        cached_ids[state * cached_draft_input_ids_stride0 + slots] = ids[tokens].to(cached_ids.dtype)
        if USE_INPUT_EMBEDS:
            assert draft_input_embeds_ptr is not None and cached_draft_input_embeds_ptr is not None
            _copy_rows(
                _flat(cached_draft_input_embeds_ptr),
                state * cached_draft_input_embeds_stride0 + slots * cached_draft_input_embeds_stride1,
                _flat(draft_input_embeds_ptr),
                tokens * draft_input_embeds_stride0,
                width,
            )
        _copy_rows(
            _flat(cached_target_hidden_states_ptr),
            state * cached_target_hidden_states_stride0 + slots * cached_target_hidden_states_stride1,
            _flat(draft_input_hidden_states_ptr),
            tokens * draft_input_hidden_states_stride0,
            width,
        )


def cache_inputs(
    grid: Grid,
    draft_input_ids_ptr: torch.Tensor,
    draft_input_embeds_ptr: torch.Tensor | None,
    draft_input_embeds_stride0: int,
    draft_input_hidden_states_ptr: torch.Tensor,
    draft_input_hidden_states_stride0: int,
    cached_draft_input_ids_ptr: torch.Tensor,
    cached_draft_input_ids_stride0: int,
    cached_draft_input_embeds_ptr: torch.Tensor | None,
    cached_draft_input_embeds_stride0: int,
    cached_draft_input_embeds_stride1: int,
    cached_target_hidden_states_ptr: torch.Tensor,
    cached_target_hidden_states_stride0: int,
    cached_target_hidden_states_stride1: int,
    idx_mapping_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_speculative_steps: int,
    hidden_size: int,
    BLOCK_SIZE: int,
    USE_INPUT_EMBEDS: bool,
) -> None:
    """Snapshot of each request's last ``num_speculative_steps - 1`` draft inputs, for ``grid = (n, dim
    blocks)``, in place: for request ``i`` (state ``s >= 0``; negative states are padding, skipped) and tokens
    ``t`` in ``[max(w, query_start), last_token_index]``, ``w = last_token_index - steps + 2``: slot ``t - w``
    of ``s`` gets the draft input id, hidden state (and, with ``USE_INPUT_EMBEDS``, embedding) of ``t``; the
    rows are bounded by ``grid[1] * BLOCK_SIZE`` columns (of ``hidden_size``)."""
    impl = dispatch_v2(
        "spec_decode_multi_module_mtp",
        "cache_inputs",
        cache_inputs_torch,
        draft_input_hidden_states_ptr.device,
    )
    impl(
        grid,
        draft_input_ids_ptr,
        draft_input_embeds_ptr,
        draft_input_embeds_stride0,
        draft_input_hidden_states_ptr,
        draft_input_hidden_states_stride0,
        cached_draft_input_ids_ptr,
        cached_draft_input_ids_stride0,
        cached_draft_input_embeds_ptr,
        cached_draft_input_embeds_stride0,
        cached_draft_input_embeds_stride1,
        cached_target_hidden_states_ptr,
        cached_target_hidden_states_stride0,
        cached_target_hidden_states_stride1,
        idx_mapping_ptr,
        last_token_indices_ptr,
        query_start_loc_ptr,
        num_speculative_steps,
        hidden_size,
        BLOCK_SIZE,
        USE_INPUT_EMBEDS,
    )


def shift_input_ids_torch(
    grid: Grid,
    input_ids_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`shift_input_ids`."""
    n = grid_dim(grid, 0)
    ids = _flat(input_ids_ptr)
    for batch, state in enumerate(_ints(idx_mapping_ptr, n)):
        if state < 0:
            continue
        start = int(query_start_loc_ptr[batch])
        last = int(last_token_indices_ptr[batch])
        if last > start:
            ids[start:last] = ids[start + 1 : last + 1].clone()
        ids[last] = draft_tokens_ptr[batch].to(ids.dtype)


def shift_input_ids(
    grid: Grid,
    input_ids_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    BLOCK_SIZE: int,
) -> None:
    """Between MTP modules, for ``grid[0]`` requests (negative states skipped), in place: the input ids
    ``query_start .. last_token_index`` shifted left by one and ``draft_tokens[i]`` written at
    ``last_token_index``."""
    impl = dispatch_v2(
        "spec_decode_multi_module_mtp", "shift_input_ids", shift_input_ids_torch, input_ids_ptr.device
    )
    impl(
        grid,
        input_ids_ptr,
        idx_mapping_ptr,
        query_start_loc_ptr,
        last_token_indices_ptr,
        draft_tokens_ptr,
        BLOCK_SIZE,
    )


def shift_input_embeds_torch(
    grid: Grid,
    input_embeds_ptr: torch.Tensor,
    input_embeds_stride0: int,
    draft_embeds_ptr: torch.Tensor,
    draft_embeds_stride0: int,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    hidden_size: int,
    BLOCK_SIZE_Q: int,
    BLOCK_SIZE_H: int,
) -> None:
    """Reference of :func:`shift_input_embeds`."""
    n, dim_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    width = min(hidden_size, dim_blocks * BLOCK_SIZE_H)
    if n == 0 or width <= 0:
        return
    device = input_embeds_ptr.device
    embeds, drafts = _flat(input_embeds_ptr), _flat(draft_embeds_ptr)
    for batch, state in enumerate(_ints(idx_mapping_ptr, n)):
        if state < 0:
            continue
        start = int(query_start_loc_ptr[batch])
        last = int(last_token_indices_ptr[batch])
        rows = torch.arange(start, last, device=device)
        _copy_rows(embeds, rows * input_embeds_stride0, embeds, (rows + 1) * input_embeds_stride0, width)
        _copy_rows(
            embeds,
            torch.tensor([last * input_embeds_stride0], device=device),
            drafts,
            torch.tensor([batch * draft_embeds_stride0], device=device),
            width,
        )


def shift_input_embeds(
    grid: Grid,
    input_embeds_ptr: torch.Tensor,
    input_embeds_stride0: int,
    draft_embeds_ptr: torch.Tensor,
    draft_embeds_stride0: int,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    hidden_size: int,
    BLOCK_SIZE_Q: int,
    BLOCK_SIZE_H: int,
) -> None:
    """The embedding counterpart of :func:`shift_input_ids`, for ``grid = (n, dim blocks)``: rows
    ``query_start .. last_token_index`` shifted up by one and ``draft_embeds[i]`` written at
    ``last_token_index``, over ``grid[1] * BLOCK_SIZE_H`` columns (of ``hidden_size``)."""
    impl = dispatch_v2(
        "spec_decode_multi_module_mtp",
        "shift_input_embeds",
        shift_input_embeds_torch,
        input_embeds_ptr.device,
    )
    impl(
        grid,
        input_embeds_ptr,
        input_embeds_stride0,
        draft_embeds_ptr,
        draft_embeds_stride0,
        idx_mapping_ptr,
        query_start_loc_ptr,
        last_token_indices_ptr,
        hidden_size,
        BLOCK_SIZE_Q,
        BLOCK_SIZE_H,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._prepare_input_buffers_kernel": prepare_input_buffers,
    f"{_VLLM}._prepare_input_hidden_states_and_embeddings_kernel": prepare_input_hidden_states_and_embeddings,
    f"{_VLLM}._pad_trailing_draft_slots_kernel": pad_trailing_draft_slots,
    f"{_VLLM}._cache_inputs_kernel": cache_inputs,
    f"{_VLLM}._shift_input_ids_kernel": shift_input_ids,
    f"{_VLLM}._shift_input_embeds_kernel": shift_input_embeds,
}
