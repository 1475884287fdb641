"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py``
(draft-model speculation: the draft's expanded step-0 inputs, one correction-token slot per request)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator"


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """The memory from ``tensor``'s first element to the end of its storage, as a flat view (what the
    kernel's ``ptr + offset`` addresses)."""
    numel = tensor.untyped_storage().nbytes() // tensor.element_size() - tensor.storage_offset()
    return tensor.as_strided((numel,), (1,))


def prepare_prefill_inputs_torch(
    grid: Grid,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    out_input_ids_ptr: torch.Tensor,
    out_positions_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    out_query_start_loc_ptr: torch.Tensor,
    out_seq_lens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    max_num_reqs: int,
    max_model_len: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`prepare_prefill_inputs`."""
    n = grid_dim(grid, 0)
    if n == 0:
        return
    qsl = query_start_loc_ptr[: n + 1].long()
    q_start = qsl[:-1]
    total_out = qsl[1:] - q_start + 1
    num_valid = total_out - 1 - num_rejected_ptr[:n].long()
    out_start = q_start + torch.arange(n, device=qsl.device)
    states = idx_mapping_ptr[:n].long()
    correction = _flat(last_sampled_ptr)[states].to(torch.int32).long()
    target_ids = _flat(target_input_ids_ptr)
    target_pos = _flat(target_positions_ptr)
    start_pos = target_pos[q_start].long()

    # Every output slot j < total_out of request i: (request, j) flattened.
    owner = torch.repeat_interleave(torch.arange(n, device=qsl.device), total_out)
    j = torch.arange(int(total_out.sum()), device=qsl.device) - torch.repeat_interleave(
        torch.cumsum(total_out, 0) - total_out, total_out
    )
    valid = j < num_valid[owner]
    source = torch.where(valid, q_start[owner] + j, torch.zeros_like(j))
    ids = torch.where(valid, target_ids[source].long(), torch.zeros_like(j))
    ids = torch.where(j == num_valid[owner], correction[owner], ids)
    positions = torch.clamp_max(start_pos[owner] + j, max_model_len - 1)
    out = out_start[owner] + j
    _flat(out_input_ids_ptr)[out] = ids.to(out_input_ids_ptr.dtype)
    _flat(out_positions_ptr)[out] = positions.to(out_positions_ptr.dtype)

    last_token_indices_ptr[:n] = (out_start + num_valid).to(last_token_indices_ptr.dtype)
    out_query_start_loc_ptr[:n] = out_start.to(out_query_start_loc_ptr.dtype)
    seq_lens = torch.clamp_max(seq_lens_ptr[:n].long() + 1, max_model_len)
    out_seq_lens_ptr[:n] = seq_lens.to(out_seq_lens_ptr.dtype)
    total_expanded = int(out_start[-1] + total_out[-1])
    out_query_start_loc_ptr[n : max_num_reqs + 1] = total_expanded
    out_seq_lens_ptr[n:max_num_reqs] = 0
    last_token_indices_ptr[n:max_num_reqs] = 0


def prepare_prefill_inputs(
    grid: Grid,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    out_input_ids_ptr: torch.Tensor,
    out_positions_ptr: torch.Tensor,
    last_token_indices_ptr: torch.Tensor,
    out_query_start_loc_ptr: torch.Tensor,
    out_seq_lens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    max_num_reqs: int,
    max_model_len: int,
    BLOCK_SIZE: int,
) -> None:
    """The draft model's expanded step-0 inputs, in place, for ``n = grid[0]`` requests.

    Request ``i`` (query ``qs .. qe``, ``v = qe - qs - num_rejected[i]`` accepted tokens) owns output slots
    ``o + j``, ``o = qs + i``, ``j <= qe - qs``: its ``v`` accepted target ids, then the correction token
    ``last_sampled[idx_mapping[i]]`` (as int32), then 0 for the rejected slots; positions ``min(
    target_positions[qs] + j, max_model_len - 1)`` for all of them. ``last_token_indices[i] = o + v``,
    ``out_query_start_loc[i] = o``, ``out_seq_lens[i] = min(seq_lens[i] + 1, max_model_len)``. The last
    request pads ``out_query_start_loc[n:max_num_reqs + 1]`` with the expanded total and zeroes
    ``out_seq_lens`` and ``last_token_indices`` ``[n:max_num_reqs]``."""
    impl = dispatch_v2(
        "spec_decode_standalone_ar",
        "prepare_prefill_inputs",
        prepare_prefill_inputs_torch,
        out_input_ids_ptr.device,
    )
    impl(
        grid,
        target_input_ids_ptr,
        target_positions_ptr,
        last_sampled_ptr,
        idx_mapping_ptr,
        out_input_ids_ptr,
        out_positions_ptr,
        last_token_indices_ptr,
        out_query_start_loc_ptr,
        out_seq_lens_ptr,
        query_start_loc_ptr,
        seq_lens_ptr,
        num_rejected_ptr,
        max_num_reqs,
        max_model_len,
        BLOCK_SIZE,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._prepare_prefill_inputs_kernel": prepare_prefill_inputs,
}
