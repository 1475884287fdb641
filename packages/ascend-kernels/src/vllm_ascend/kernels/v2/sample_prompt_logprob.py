"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/prompt_logprob.py`` (the target token
ids of prompt logprobs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.prompt_logprob"


def prompt_logprobs_token_ids_torch(
    grid: Grid,
    prompt_logprobs_token_ids_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`prompt_logprobs_token_ids`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = all_token_ids_ptr.device
    qsl = query_start_loc_ptr[: num_reqs + 1].long()
    query_lens = (qsl[1:] - qsl[:-1]).clamp_min(0)
    total = int(query_lens.sum())
    if total == 0:
        return
    req = idx_mapping_ptr[:num_reqs].long()
    owner = torch.repeat_interleave(torch.arange(num_reqs, device=device), query_lens)
    offset = torch.arange(total, device=device) - torch.repeat_interleave(
        torch.cumsum(query_lens, 0) - query_lens, query_lens
    )
    target = num_computed_tokens_ptr[req].long()[owner] + 1 + offset
    flat = all_token_ids_ptr.as_strided(
        (all_token_ids_ptr.numel(),), (1,), all_token_ids_ptr.storage_offset()
    )
    tokens = flat[req[owner] * all_token_ids_stride + target]
    prompt_logprobs_token_ids_ptr[qsl[:-1][owner] + offset] = tokens.to(prompt_logprobs_token_ids_ptr.dtype)


def prompt_logprobs_token_ids(
    grid: Grid,
    prompt_logprobs_token_ids_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    BLOCK_SIZE: int,
) -> None:
    """For each request ``i < grid[0]`` (state row ``req = idx_mapping_ptr[i]``), its scheduled tokens
    ``query_start_loc[i] + j`` get the id of the next prompt token:
    ``out[query_start_loc[i] + j] = all_token_ids[req, num_computed_tokens[req] + 1 + j]``."""
    impl = dispatch_v2(
        "sample_prompt_logprob",
        "prompt_logprobs_token_ids",
        prompt_logprobs_token_ids_torch,
        all_token_ids_ptr.device,
    )
    impl(
        grid,
        prompt_logprobs_token_ids_ptr,
        query_start_loc_ptr,
        idx_mapping_ptr,
        num_computed_tokens_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        BLOCK_SIZE,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._prompt_logprobs_token_ids_kernel": prompt_logprobs_token_ids,
}
