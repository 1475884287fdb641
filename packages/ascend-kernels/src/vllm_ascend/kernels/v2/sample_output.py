"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/output.py`` (the sampling-support
mask: kept token ids and their bitmask)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.output"


def compact_sampling_mask_torch(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_row_stride: int,
    logits_col_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    num_sampled_tokens_ptr: torch.Tensor,
    token_ids_ptr: torch.Tensor,
    token_ids_row_stride: int,
    packed_mask_ptr: torch.Tensor,
    packed_mask_row_stride: int,
    counts_ptr: torch.Tensor,
    vocab_size: int,
    max_num_kept: int,
    ROWS_PER_REQUEST: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`compact_sampling_mask`."""
    num_rows = grid_dim(grid, 0)
    if num_rows == 0:
        return
    device = logits_ptr.device
    rows = torch.arange(num_rows, device=device)
    req, slot = rows // ROWS_PER_REQUEST, rows % ROWS_PER_REQUEST
    live = slot < num_sampled_tokens_ptr[req].long()
    counts_ptr[:num_rows] = 0
    out = live.nonzero().flatten()
    if out.numel() == 0 or vocab_size <= 0:
        return
    source = cu_num_logits_ptr[req[out]].long() + slot[out]
    logits = logits_ptr.as_strided(
        (logits_ptr.shape[0], vocab_size), (logits_row_stride, logits_col_stride), logits_ptr.storage_offset()
    )[source]
    keep = torch.isfinite(logits)
    counts_ptr[out] = keep.sum(dim=-1).to(counts_ptr.dtype)

    # Kept ids in order, the first max_num_kept of each row.
    rank = torch.cumsum(keep.to(torch.int64), dim=-1) - 1
    stored = keep & (rank < max_num_kept)
    row_of = out[:, None].expand(-1, vocab_size)
    cols = torch.arange(vocab_size, device=device)[None, :].expand(out.numel(), -1)
    width = min(max_num_kept, vocab_size)
    if width > 0:
        ids = token_ids_ptr.as_strided(
            (num_rows, width), (token_ids_row_stride, 1), token_ids_ptr.storage_offset()
        )
        ids[row_of[stored], rank[stored]] = cols[stored].to(ids.dtype)

    # Little-endian bitmask bytes, the whole row (bits past vocab_size are 0).
    num_bytes = (vocab_size + 7) // 8
    bits = torch.zeros(out.numel(), num_bytes * 8, dtype=torch.int32, device=device)
    bits[:, :vocab_size] = keep.to(torch.int32)
    packed = (bits.reshape(out.numel(), num_bytes, 8) << torch.arange(8, device=device)).sum(-1)
    mask = packed_mask_ptr.as_strided(
        (num_rows, num_bytes), (packed_mask_row_stride, 1), packed_mask_ptr.storage_offset()
    )
    mask[out] = packed.to(mask.dtype)


def compact_sampling_mask(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_row_stride: int,
    logits_col_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    num_sampled_tokens_ptr: torch.Tensor,
    token_ids_ptr: torch.Tensor,
    token_ids_row_stride: int,
    packed_mask_ptr: torch.Tensor,
    packed_mask_row_stride: int,
    counts_ptr: torch.Tensor,
    vocab_size: int,
    max_num_kept: int,
    ROWS_PER_REQUEST: int,
    BLOCK_SIZE: int,
) -> None:
    """The sampling support of each output row ``r < grid[0]`` (request ``r // ROWS_PER_REQUEST``,
    slot ``r % ROWS_PER_REQUEST``, logits row ``cu_num_logits[req] + slot``): ``counts[r]`` = the
    number of finite logits, ``token_ids[r, :max_num_kept]`` the first of their ids (ascending),
    ``packed_mask[r]`` their little-endian bitmask bytes. Rows past ``num_sampled_tokens[req]`` only
    get ``counts[r] = 0``."""
    impl = dispatch_v2(
        "sample_output", "compact_sampling_mask", compact_sampling_mask_torch, logits_ptr.device
    )
    impl(
        grid,
        logits_ptr,
        logits_row_stride,
        logits_col_stride,
        cu_num_logits_ptr,
        num_sampled_tokens_ptr,
        token_ids_ptr,
        token_ids_row_stride,
        packed_mask_ptr,
        packed_mask_row_stride,
        counts_ptr,
        vocab_size,
        max_num_kept,
        ROWS_PER_REQUEST,
        BLOCK_SIZE,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._compact_sampling_mask_kernel": compact_sampling_mask,
}
