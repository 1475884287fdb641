"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/model_states/prompt_embeds.py`` (user-given
prompt embeddings overlaid onto ``inputs_embeds``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim, tensor_at

_VLLM = "vllm.v1.worker.gpu.model_states.prompt_embeds"


def apply_prompt_embeds_torch(
    grid: Grid,
    inputs_embeds_ptr: torch.Tensor,
    inputs_embeds_stride: int,
    embeds_ptrs_ptr: torch.Tensor,
    mask_ptrs_ptr: torch.Tensor,
    embeds_lens_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    hidden_size: int,
    TOKEN_BLOCK: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`apply_prompt_embeds` (reads the embeddings through their raw addresses)."""
    num_reqs = grid_dim(grid, 0)
    covered = grid_dim(grid, 1) * TOKEN_BLOCK
    if num_reqs == 0 or covered == 0:
        return
    device = inputs_embeds_ptr.device
    states = idx_mapping_ptr[:num_reqs].long()
    lens = embeds_lens_ptr[states].long().tolist()
    computed = num_computed_tokens_ptr[states].long().tolist()
    qsl = query_start_loc_ptr[: num_reqs + 1].long().tolist()
    addresses = embeds_ptrs_ptr[states].tolist()
    mask_addresses = mask_ptrs_ptr[states].tolist()
    for b in range(num_reqs):
        start_row = computed[b]
        if start_row >= lens[b]:
            continue
        rows = min(qsl[b + 1] - qsl[b], lens[b] - start_row, covered)
        if rows <= 0:
            continue
        end_row = start_row + rows
        src = tensor_at(int(addresses[b]), inputs_embeds_ptr.dtype, end_row * hidden_size, device)
        src = src.view(end_row, hidden_size)[start_row:]
        dst_rows = torch.arange(qsl[b], qsl[b] + rows, device=device)
        if int(mask_addresses[b]) != 0:
            is_token_id = tensor_at(int(mask_addresses[b]), torch.int8, end_row, device)[start_row:]
            keep = is_token_id == 0
            src, dst_rows = src[keep], dst_rows[keep]
        dst = inputs_embeds_ptr.as_strided(
            (qsl[b] + rows, hidden_size), (inputs_embeds_stride, 1), inputs_embeds_ptr.storage_offset()
        )
        dst[dst_rows] = src


def apply_prompt_embeds(
    grid: Grid,
    inputs_embeds_ptr: torch.Tensor,
    inputs_embeds_stride: int,
    embeds_ptrs_ptr: torch.Tensor,
    mask_ptrs_ptr: torch.Tensor,
    embeds_lens_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    hidden_size: int,
    TOKEN_BLOCK: int,
    BLOCK_SIZE: int,
) -> None:
    """Overlays the prompt embeddings of the scheduled tokens onto ``inputs_embeds``, in place.

    Request ``b < grid[0]`` (state ``s = idx_mapping[b]``) with ``num_computed < embeds_lens[s]``:
    its first ``min(query_len, embeds_lens[s] - num_computed, grid[1] * TOKEN_BLOCK)`` tokens get rows
    ``num_computed + t`` of the ``[embeds_len, hidden_size]`` embeddings at address ``embeds_ptrs[s]``
    (of ``inputs_embeds``' dtype), except the rows the int8 mask at ``mask_ptrs[s]`` (when non-zero)
    flags as token ids; every other row is left as it is."""
    impl = dispatch_v2(
        "model_states_prompt_embeds",
        "apply_prompt_embeds",
        apply_prompt_embeds_torch,
        inputs_embeds_ptr.device,
    )
    impl(
        grid,
        inputs_embeds_ptr,
        inputs_embeds_stride,
        embeds_ptrs_ptr,
        mask_ptrs_ptr,
        embeds_lens_ptr,
        idx_mapping_ptr,
        query_start_loc_ptr,
        num_computed_tokens_ptr,
        hidden_size,
        TOKEN_BLOCK,
        BLOCK_SIZE,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._apply_prompt_embeds_kernel": apply_prompt_embeds,
}
