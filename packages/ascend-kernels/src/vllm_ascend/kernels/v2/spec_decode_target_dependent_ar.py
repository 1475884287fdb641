"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py``
(EAGLE / MTP drafting: the draft model's first-step inputs from the target batch, its decode-step inputs,
and the per-step bookkeeping after each draft sample)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"


def _ints(tensor: torch.Tensor, n: int) -> list[int]:
    return [int(v) for v in tensor[:n].tolist()]


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """The memory from ``tensor``'s first element to the end of its storage, as a flat view: what the
    kernel's ``ptr + offset`` addresses (strides are the launch's, not the view's)."""
    numel = tensor.untyped_storage().nbytes() // tensor.element_size() - tensor.storage_offset()
    return tensor.as_strided((numel,), (1,))


def prepare_prefill_inputs_torch(
    grid: Grid,
    last_token_indices_ptr: torch.Tensor,
    draft_current_step_ptr: torch.Tensor,
    draft_input_ids_ptr: torch.Tensor,
    draft_positions_ptr: torch.Tensor,
    draft_query_start_loc_ptr: torch.Tensor,
    draft_seq_lens_ptr: torch.Tensor,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`prepare_prefill_inputs`."""
    n = grid_dim(grid, 0)
    if n == 0:
        return
    qsl = _ints(query_start_loc_ptr, n + 1)
    states = idx_mapping_ptr[:n].long()
    query_lens = torch.tensor(qsl[1:], dtype=torch.int64) - torch.tensor(qsl[:-1], dtype=torch.int64)
    valid = (query_lens - num_rejected_ptr[:n].cpu().long()).tolist()
    sampled = num_sampled_ptr[:n] > 0
    last = _flat(last_sampled_ptr)[states].to(torch.int32)
    chunk = _flat(next_prefill_tokens_ptr)[states].to(torch.int32)
    next_tokens = torch.where(sampled, last, chunk)
    ids, positions = _flat(draft_input_ids_ptr), _flat(draft_positions_ptr)
    target_ids, target_pos = _flat(target_input_ids_ptr), _flat(target_positions_ptr)
    for batch in range(n):
        start, length = qsl[batch], valid[batch]
        if length > 1:
            ids[start : start + length - 1] = target_ids[start + 1 : start + length].to(ids.dtype)
        if length > 0:
            positions[start : start + length] = target_pos[start : start + length].to(positions.dtype)
    last_index = torch.tensor(qsl[:-1], dtype=torch.int64) + torch.tensor(valid, dtype=torch.int64) - 1
    last_index = last_index.to(ids.device)
    last_token_indices_ptr[:n] = last_index.to(last_token_indices_ptr.dtype)
    ids[last_index] = next_tokens.to(ids.dtype)
    draft_query_start_loc_ptr[:n] = query_start_loc_ptr[:n].to(draft_query_start_loc_ptr.dtype)
    draft_seq_lens_ptr[:n] = seq_lens_ptr[:n].to(draft_seq_lens_ptr.dtype)
    _flat(draft_current_step_ptr)[0] = 0
    draft_query_start_loc_ptr[n : max_num_reqs + 1] = qsl[n]
    draft_seq_lens_ptr[n:max_num_reqs] = 0
    last_token_indices_ptr[n:max_num_reqs] = 0


def prepare_prefill_inputs(
    grid: Grid,
    last_token_indices_ptr: torch.Tensor,
    draft_current_step_ptr: torch.Tensor,
    draft_input_ids_ptr: torch.Tensor,
    draft_positions_ptr: torch.Tensor,
    draft_query_start_loc_ptr: torch.Tensor,
    draft_seq_lens_ptr: torch.Tensor,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    """The draft model's first-step inputs from the target batch, in place, for ``grid[0]`` requests.

    Request ``i`` (state ``s``) keeps ``v = query_len - num_rejected`` of its target tokens: the draft input
    ids are the target ids shifted left by one (``draft[qs + j - 1] = target[qs + j]``, ``0 < j < v``) and
    ``draft[qs + v - 1]`` is the next token (``last_sampled[s]`` when it sampled, else the chunked prompt's
    ``next_prefill_tokens[s]``); positions are the target's (``v`` of them); ``last_token_indices[i] =
    qs + v - 1``; query start and sequence length copied. The last request resets the draft step to 0 and
    pads ``query_start_loc[n:max_num_reqs + 1]`` with the last query end, ``seq_lens`` and
    ``last_token_indices`` ``[n:max_num_reqs]`` with 0."""
    impl = dispatch_v2(
        "spec_decode_target_dependent_ar",
        "prepare_prefill_inputs",
        prepare_prefill_inputs_torch,
        draft_input_ids_ptr.device,
    )
    impl(
        grid,
        last_token_indices_ptr,
        draft_current_step_ptr,
        draft_input_ids_ptr,
        draft_positions_ptr,
        draft_query_start_loc_ptr,
        draft_seq_lens_ptr,
        target_input_ids_ptr,
        target_positions_ptr,
        idx_mapping_ptr,
        last_sampled_ptr,
        next_prefill_tokens_ptr,
        num_sampled_ptr,
        num_rejected_ptr,
        query_start_loc_ptr,
        seq_lens_ptr,
        max_num_reqs,
        BLOCK_SIZE,
    )


def prepare_decode_inputs_torch(
    grid: Grid,
    draft_tokens_ptr: torch.Tensor,
    draft_tokens_stride: int,
    target_seq_lens_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    sample_src_positions_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    max_model_len: int,
    max_num_reqs: int,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    """Reference of :func:`prepare_decode_inputs`."""
    programs = grid_dim(grid, 0)
    if programs == 0:
        return
    n = programs - 1
    device = input_ids_ptr.device
    if n:
        rows = torch.arange(n, device=device) * draft_tokens_stride
        input_ids_ptr[:n] = _flat(draft_tokens_ptr)[rows].to(input_ids_ptr.dtype)
        sample_src_positions_ptr[:n] += 1
        seq_len = target_seq_lens_ptr[:n].long() - num_rejected_ptr[:n].long()
        if ADVANCE_DRAFT_POSITIONS:
            advanced = torch.clamp_max(positions_ptr[:n].long() + 1, max_model_len - 1)
            positions_ptr[:n] = advanced.to(positions_ptr.dtype)
            seq_len = torch.clamp_max(seq_len + 1, max_model_len)
        seq_lens_ptr[:n] = seq_len.to(seq_lens_ptr.dtype)
    slots = torch.arange(max_num_reqs + 1, device=query_start_loc_ptr.device)
    query_start_loc_ptr[: max_num_reqs + 1] = torch.clamp_max(slots, n).to(query_start_loc_ptr.dtype)
    seq_lens_ptr[n:max_num_reqs] = 0


def prepare_decode_inputs(
    grid: Grid,
    draft_tokens_ptr: torch.Tensor,
    draft_tokens_stride: int,
    target_seq_lens_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    sample_src_positions_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    max_model_len: int,
    max_num_reqs: int,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    """Inputs of a one-token draft decode step, in place, for ``n = grid[0] - 1`` requests: ``input_ids[i] =
    draft_tokens[i, 0]``, ``sample_src_positions[i] += 1``, ``seq_lens[i] = target_seq_lens[i] -
    num_rejected[i]``; with ``ADVANCE_DRAFT_POSITIONS`` the position and that length advance by one, clamped
    to ``max_model_len - 1`` / ``max_model_len``. The extra program writes ``query_start_loc[j] = min(j, n)``
    for ``j <= max_num_reqs`` and zeroes ``seq_lens[n:max_num_reqs]``."""
    impl = dispatch_v2(
        "spec_decode_target_dependent_ar",
        "prepare_decode_inputs",
        prepare_decode_inputs_torch,
        input_ids_ptr.device,
    )
    impl(
        grid,
        draft_tokens_ptr,
        draft_tokens_stride,
        target_seq_lens_ptr,
        num_rejected_ptr,
        input_ids_ptr,
        positions_ptr,
        sample_src_positions_ptr,
        query_start_loc_ptr,
        seq_lens_ptr,
        max_model_len,
        max_num_reqs,
        BLOCK_SIZE,
        ADVANCE_DRAFT_POSITIONS,
    )


def update_draft_inputs_torch(
    grid: Grid,
    output_draft_tokens_ptr: torch.Tensor,
    output_draft_tokens_stride: int,
    next_input_hidden_states_ptr: torch.Tensor,
    next_input_hidden_states_stride: int,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    sample_src_positions_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    current_draft_step_ptr: torch.Tensor,
    hidden_states_ptr: torch.Tensor,
    hidden_states_stride: int,
    hidden_size: int,
    max_model_len: int,
    num_speculative_steps: int,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    """Reference of :func:`update_draft_inputs`."""
    n = grid_dim(grid, 0)
    if n == 0:
        return
    device = draft_tokens_ptr.device
    step = int(_flat(current_draft_step_ptr)[0])
    tokens = draft_tokens_ptr[:n]
    rows = torch.arange(n, device=device)
    _flat(output_draft_tokens_ptr)[rows * output_draft_tokens_stride + step] = tokens.to(
        output_draft_tokens_ptr.dtype
    )
    if step >= num_speculative_steps - 1:
        return
    sample_src_positions_ptr[:n] += 1
    input_ids_ptr[:n] = tokens.to(input_ids_ptr.dtype)
    if hidden_size > 0:
        source = _flat(hidden_states_ptr)
        target = _flat(next_input_hidden_states_ptr)
        cols = torch.arange(hidden_size, device=device)
        gathered = source[(rows * hidden_states_stride)[:, None] + cols]
        target[(rows * next_input_hidden_states_stride)[:, None] + cols] = gathered.to(target.dtype)
    if ADVANCE_DRAFT_POSITIONS:
        positions_ptr[:n] = torch.clamp_max(positions_ptr[:n].long() + 1, max_model_len - 1).to(
            positions_ptr.dtype
        )
        seq_lens_ptr[:n] = torch.clamp_max(seq_lens_ptr[:n].long() + 1, max_model_len).to(seq_lens_ptr.dtype)


def update_draft_inputs(
    grid: Grid,
    output_draft_tokens_ptr: torch.Tensor,
    output_draft_tokens_stride: int,
    next_input_hidden_states_ptr: torch.Tensor,
    next_input_hidden_states_stride: int,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    sample_src_positions_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    current_draft_step_ptr: torch.Tensor,
    hidden_states_ptr: torch.Tensor,
    hidden_states_stride: int,
    hidden_size: int,
    max_model_len: int,
    num_speculative_steps: int,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    """After draft step ``step = current_draft_step``, for ``grid[0]`` requests, in place:
    ``output_draft_tokens[i, step] = draft_tokens[i]``; unless it was the last step, also
    ``sample_src_positions[i] += 1``, ``input_ids[i] = draft_tokens[i]``, ``next_input_hidden_states[i] =
    hidden_states[i]`` (``hidden_size`` columns) and, with ``ADVANCE_DRAFT_POSITIONS``, position and sequence
    length advanced by one (clamped to ``max_model_len - 1`` / ``max_model_len``)."""
    impl = dispatch_v2(
        "spec_decode_target_dependent_ar",
        "update_draft_inputs",
        update_draft_inputs_torch,
        draft_tokens_ptr.device,
    )
    impl(
        grid,
        output_draft_tokens_ptr,
        output_draft_tokens_stride,
        next_input_hidden_states_ptr,
        next_input_hidden_states_stride,
        input_ids_ptr,
        positions_ptr,
        sample_src_positions_ptr,
        seq_lens_ptr,
        draft_tokens_ptr,
        current_draft_step_ptr,
        hidden_states_ptr,
        hidden_states_stride,
        hidden_size,
        max_model_len,
        num_speculative_steps,
        BLOCK_SIZE,
        ADVANCE_DRAFT_POSITIONS,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._prepare_prefill_inputs_kernel": prepare_prefill_inputs,
    f"{_VLLM}._prepare_decode_inputs_kernel": prepare_decode_inputs,
    f"{_VLLM}._update_draft_inputs_kernel": update_draft_inputs,
}
