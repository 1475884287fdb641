"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/logprob.py`` (logprobs of chosen
token ids, sampled-token ranks, and the logprob token-id table)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.logprob"


def _rows(t: torch.Tensor, rows: int, stride: int, width: int) -> torch.Tensor:
    """The ``[rows, width]`` view a kernel addresses as ``ptr + row * stride + col``."""
    return t.as_strided((rows, width), (stride, 1), t.storage_offset())


def topk_log_softmax_torch(
    grid: Grid,
    output_ptr: torch.Tensor,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    topk_ids_ptr: torch.Tensor,
    topk_ids_stride: int,
    topk: int,
    vocab_size: int,
    BLOCK_SIZE: int,
    TOPK_BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`topk_log_softmax`."""
    batch = grid_dim(grid, 0)
    if batch == 0 or topk <= 0:
        return
    logits = _rows(logits_ptr, batch, logits_stride, vocab_size).float()
    # NaN is no maximum (Triton's max ignores it).
    row_max = logits.masked_fill(logits.isnan(), float("-inf")).amax(dim=-1, keepdim=True)
    lse = torch.log(torch.exp(logits - row_max).sum(dim=-1, keepdim=True))
    ids = _rows(topk_ids_ptr, batch, topk_ids_stride, topk).long()
    chosen = _rows(logits_ptr, batch, logits_stride, vocab_size).gather(-1, ids).float()
    output_ptr.reshape(-1)[: batch * topk] = (chosen - row_max - lse).reshape(-1).to(output_ptr.dtype)


def topk_log_softmax(
    grid: Grid,
    output_ptr: torch.Tensor,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    topk_ids_ptr: torch.Tensor,
    topk_ids_stride: int,
    topk: int,
    vocab_size: int,
    BLOCK_SIZE: int,
    TOPK_BLOCK_SIZE: int,
) -> None:
    """Log-softmax at chosen ids: for row ``r < grid[0]``,
    ``output[r * topk + k] = logits[r, ids[r, k]] - max - log(sum(exp(logits[r] - max)))`` (float32,
    over ``logits[r, :vocab_size]``), ``k < topk``."""
    impl = dispatch_v2("sample_logprob", "topk_log_softmax", topk_log_softmax_torch, logits_ptr.device)
    impl(
        grid,
        output_ptr,
        logits_ptr,
        logits_stride,
        topk_ids_ptr,
        topk_ids_stride,
        topk,
        vocab_size,
        BLOCK_SIZE,
        TOPK_BLOCK_SIZE,
    )


def ranks_torch(
    grid: Grid,
    output_ptr: torch.Tensor,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    token_ids_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`ranks`."""
    batch = grid_dim(grid, 0)
    if batch == 0:
        return
    logits = _rows(logits_ptr, batch, logits_stride, vocab_size)
    chosen = logits.gather(-1, token_ids_ptr[:batch].long()[:, None])
    output_ptr[:batch] = (logits >= chosen).sum(dim=-1).to(output_ptr.dtype)


def ranks(
    grid: Grid,
    output_ptr: torch.Tensor,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    token_ids_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Rank of each row's token: ``output[r]`` = the number of ``logits[r, :vocab_size]`` at least
    ``logits[r, token_ids[r]]``, for ``r < grid[0]``."""
    impl = dispatch_v2("sample_logprob", "ranks", ranks_torch, logits_ptr.device)
    impl(grid, output_ptr, logits_ptr, logits_stride, token_ids_ptr, vocab_size, BLOCK_SIZE)


def fill_logprob_token_ids_torch(
    grid: Grid,
    out_token_ids_ptr: torch.Tensor,
    out_token_ids_stride: int,
    out_valid_mask_ptr: torch.Tensor,
    out_valid_mask_stride: int,
    sampled_token_ids_ptr: torch.Tensor,
    topk_indices_ptr: torch.Tensor,
    topk_indices_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    num_per_req_token_ids_ptr: torch.Tensor,
    per_req_token_ids_ptr: torch.Tensor,
    per_req_token_ids_stride: int,
    NUM_TOPK: int,
    PADDED_COLS: int,
) -> None:
    """Reference of :func:`fill_logprob_token_ids`."""
    batch = grid_dim(grid, 0)
    if batch == 0:
        return
    device = out_token_ids_ptr.device
    out_ids = out_token_ids_ptr.as_strided(
        (batch, out_token_ids_ptr.shape[1]), (out_token_ids_stride, 1), out_token_ids_ptr.storage_offset()
    )
    out_valid = out_valid_mask_ptr.as_strided(
        (batch, out_valid_mask_ptr.shape[1]), (out_valid_mask_stride, 1), out_valid_mask_ptr.storage_offset()
    )
    out_ids[:, 0] = sampled_token_ids_ptr[:batch].to(out_ids.dtype)
    out_valid[:, 0] = True
    num_custom = num_per_req_token_ids_ptr[expanded_idx_mapping_ptr[:batch].long()].long()
    custom = num_custom > 0
    count = torch.where(custom, num_custom, torch.full_like(num_custom, NUM_TOPK)).clamp(max=PADDED_COLS)
    width = int(count.max())
    if width <= 0:
        return
    cols = torch.arange(width, device=device)
    live = cols[None, :] < count[:, None]
    tokens = torch.zeros(batch, width, dtype=torch.int64, device=device)
    if bool(custom.any()):
        rows = custom.nonzero().flatten()
        custom_width = int(count[rows].max())
        table = _rows(
            per_req_token_ids_ptr, per_req_token_ids_ptr.shape[0], per_req_token_ids_stride, custom_width
        )
        tokens[rows, :custom_width] = table[expanded_idx_mapping_ptr[rows].long()].long()
    if NUM_TOPK > 0 and bool((~custom).any()):
        rows = (~custom).nonzero().flatten()
        topk_width = min(width, NUM_TOPK)
        tokens[rows, :topk_width] = _rows(topk_indices_ptr, batch, topk_indices_stride, topk_width)[
            rows
        ].long()
    out_ids[:, 1 : 1 + width][live] = tokens[live].to(out_ids.dtype)
    out_valid[:, 1 : 1 + width][live] = True


def fill_logprob_token_ids(
    grid: Grid,
    out_token_ids_ptr: torch.Tensor,
    out_token_ids_stride: int,
    out_valid_mask_ptr: torch.Tensor,
    out_valid_mask_stride: int,
    sampled_token_ids_ptr: torch.Tensor,
    topk_indices_ptr: torch.Tensor,
    topk_indices_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    num_per_req_token_ids_ptr: torch.Tensor,
    per_req_token_ids_ptr: torch.Tensor,
    per_req_token_ids_stride: int,
    NUM_TOPK: int,
    PADDED_COLS: int,
) -> None:
    """The logprob token-id table, row ``b < grid[0]``: column 0 the sampled token, then the request's
    own ``logprob_token_ids`` if it has any, else the ``NUM_TOPK`` top-k ids (at most ``PADDED_COLS``
    columns); ``out_valid_mask`` set where written (the rest left as it is)."""
    impl = dispatch_v2(
        "sample_logprob", "fill_logprob_token_ids", fill_logprob_token_ids_torch, out_token_ids_ptr.device
    )
    impl(
        grid,
        out_token_ids_ptr,
        out_token_ids_stride,
        out_valid_mask_ptr,
        out_valid_mask_stride,
        sampled_token_ids_ptr,
        topk_indices_ptr,
        topk_indices_stride,
        expanded_idx_mapping_ptr,
        num_per_req_token_ids_ptr,
        per_req_token_ids_ptr,
        per_req_token_ids_stride,
        NUM_TOPK,
        PADDED_COLS,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._topk_log_softmax_kernel": topk_log_softmax,
    f"{_VLLM}._ranks_kernel": ranks,
    f"{_VLLM}._fill_logprob_token_ids_kernel": fill_logprob_token_ids,
}
