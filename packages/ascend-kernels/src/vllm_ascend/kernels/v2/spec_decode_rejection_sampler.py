"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``: the draft
tokens and positions of each logits row, and the sampled tokens flattened for logprobs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"


def flatten_sampled_torch(
    grid: Grid,
    flat_sampled_ptr: torch.Tensor,
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    num_sampled_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
) -> None:
    """Reference of :func:`flatten_sampled`."""
    n = grid_dim(grid, 0)
    starts = [int(v) for v in cu_num_logits_ptr[:n].tolist()]
    counts = [int(v) for v in num_sampled_ptr[:n].tolist()]
    rows = sampled_ptr.reshape(-1)
    for req, (start, count) in enumerate(zip(starts, counts, strict=True)):
        if count > 0:
            base = req * sampled_stride
            flat_sampled_ptr[start : start + count] = rows[base : base + count].to(flat_sampled_ptr.dtype)


def flatten_sampled(grid: Grid, **arguments: Any) -> None:
    """Request ``r``'s ``num_sampled[r]`` sampled tokens written from ``flat_sampled[cu_num_logits[r]]`` on."""
    device = arguments["flat_sampled_ptr"].device
    dispatch_v2("spec_decode_rejection_sampler", "flatten_sampled", flatten_sampled_torch, device)(
        grid, **arguments
    )


def gather_draft_sampled_torch(
    grid: Grid,
    draft_sampled_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    logits_indices_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    num_logits: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`gather_draft_sampled`."""
    n = min(num_logits, grid_dim(grid, 0) * BLOCK_SIZE)
    if n <= 0:
        return
    tokens = logits_indices_ptr[:n].to(torch.int64)
    token_ids = input_ids_ptr[tokens]
    pos = positions_ptr[tokens]
    local = expanded_local_pos_ptr[:n].to(torch.int64)
    prefill = prefill_len_ptr[expanded_idx_mapping_ptr[:n].to(torch.int64)].to(torch.int64)
    placeholder = (local > 0) & (pos.to(torch.int64) - local < prefill)
    draft_sampled_ptr[:n] = torch.where(placeholder, torch.full_like(token_ids, -1), token_ids).to(
        draft_sampled_ptr.dtype
    )
    pos_ptr[:n] = pos.to(pos_ptr.dtype)


def gather_draft_sampled(grid: Grid, **arguments: Any) -> None:
    """Per logits row: the input token at its index (-1 for a draft slot of a step that starts within the
    prompt: a placeholder the rejection kernels must reject) and its position."""
    device = arguments["draft_sampled_ptr"].device
    dispatch_v2("spec_decode_rejection_sampler", "gather_draft_sampled", gather_draft_sampled_torch, device)(
        grid, **arguments
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._flatten_sampled_kernel": flatten_sampled,
    f"{_VLLM}._gather_draft_sampled_kernel": gather_draft_sampled,
}
