"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/logit_bias.py`` (allowed token ids,
logit bias and min-tokens stop-token masking)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.logit_bias"


def _lists(ids: torch.Tensor, stride: int, rows: torch.Tensor, lengths: torch.Tensor, block: int):
    """``(row_index, token_id, live)`` of the first ``min(length, block)`` entries of each listed row
    (``row_index`` into ``rows``; ``live``: the ``[rows, width]`` mask of those entries)."""
    width = min(block, int(lengths.max()))
    table = ids.as_strided((ids.shape[0], width), (stride, 1), ids.storage_offset())[rows]
    live = torch.arange(width, device=ids.device)[None, :] < lengths[:, None]
    index = torch.arange(rows.numel(), device=ids.device)[:, None].expand(-1, width)
    return index[live], table[live].long(), live


def bias_torch(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    vocab_size: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    num_allowed_token_ids_ptr: torch.Tensor,
    allowed_token_ids_ptr: torch.Tensor,
    allowed_token_ids_stride: int,
    num_logit_bias_ptr: torch.Tensor,
    bias_token_ids_ptr: torch.Tensor,
    bias_token_ids_stride: int,
    bias_ptr: torch.Tensor,
    bias_stride: int,
    pos_ptr: torch.Tensor,
    min_lens_ptr: torch.Tensor,
    num_stop_token_ids_ptr: torch.Tensor,
    restore_when_all_masked_ptr: torch.Tensor,
    stop_token_ids_ptr: torch.Tensor,
    stop_token_ids_stride: int,
    BLOCK_SIZE: int,
    LOGITS_BLOCK_SIZE: int,
    CHECK_ALL_MASKED_ROWS: bool,
) -> None:
    """Reference of :func:`bias`."""
    num_tokens = grid_dim(grid, 0)
    if num_tokens == 0:
        return
    device = logits_ptr.device
    logits = logits_ptr.as_strided((num_tokens, vocab_size), (logits_stride, 1), logits_ptr.storage_offset())
    req = expanded_idx_mapping_ptr[:num_tokens].long()
    neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=device)

    # Allowed token ids: everything else -inf.
    num_allowed = num_allowed_token_ids_ptr[req].long()
    rows = (num_allowed > 0).nonzero().flatten()
    if rows.numel():
        index, tokens, _ = _lists(
            allowed_token_ids_ptr, allowed_token_ids_stride, req[rows], num_allowed[rows], BLOCK_SIZE
        )
        allowed = torch.zeros(rows.numel(), vocab_size, dtype=torch.bool, device=device)
        allowed[index, tokens] = True
        logits[rows] = torch.where(allowed, logits[rows], neg_inf)

    # Logit bias: a gather, a float32 add, a scatter (a repeated id is biased once: the last store wins).
    num_bias = num_logit_bias_ptr[req].long()
    rows = (num_bias > 0).nonzero().flatten()
    if rows.numel():
        index, tokens, live = _lists(
            bias_token_ids_ptr, bias_token_ids_stride, req[rows], num_bias[rows], BLOCK_SIZE
        )
        width = live.shape[1]
        bias = bias_ptr.as_strided((bias_ptr.shape[0], width), (bias_stride, 1), bias_ptr.storage_offset())
        bias = bias[req[rows]][live].float()
        target = rows[index]
        logits[target, tokens] = (logits[target, tokens].float() + bias).to(logits.dtype)

    # Min tokens: the stop tokens -inf before min_len (restored if that leaves no finite logit).
    num_stop = num_stop_token_ids_ptr[req].long()
    pos = pos_ptr[:num_tokens].long()
    min_len = min_lens_ptr[req].long()
    rows = ((num_stop > 0) & (pos + 1 < min_len)).nonzero().flatten()
    if rows.numel():
        index, tokens, _ = _lists(
            stop_token_ids_ptr, stop_token_ids_stride, req[rows], num_stop[rows], BLOCK_SIZE
        )
        target = rows[index]
        saved = logits[target, tokens].clone()
        logits[target, tokens] = neg_inf
        if CHECK_ALL_MASKED_ROWS:
            restore = restore_when_all_masked_ptr[req[rows]] != 0
            all_masked = ~(logits[rows] > float("-inf")).any(dim=-1)  # NaN is no maximum either
            back = (restore & all_masked)[index] & torch.isfinite(saved)
            logits[target[back], tokens[back]] = saved[back]


def bias(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    vocab_size: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    num_allowed_token_ids_ptr: torch.Tensor,
    allowed_token_ids_ptr: torch.Tensor,
    allowed_token_ids_stride: int,
    num_logit_bias_ptr: torch.Tensor,
    bias_token_ids_ptr: torch.Tensor,
    bias_token_ids_stride: int,
    bias_ptr: torch.Tensor,
    bias_stride: int,
    pos_ptr: torch.Tensor,
    min_lens_ptr: torch.Tensor,
    num_stop_token_ids_ptr: torch.Tensor,
    restore_when_all_masked_ptr: torch.Tensor,
    stop_token_ids_ptr: torch.Tensor,
    stop_token_ids_stride: int,
    BLOCK_SIZE: int,
    LOGITS_BLOCK_SIZE: int,
    CHECK_ALL_MASKED_ROWS: bool,
) -> None:
    """Per-request logit edits in place, for each token ``t < grid[0]`` (request ``req``), in order:
    with allowed token ids, every other logit becomes ``-inf``; the logit-bias ids get their bias
    added (float32); before ``min_lens[req]`` (``pos[t] + 1 < min_len``) the stop token ids become
    ``-inf`` — with ``CHECK_ALL_MASKED_ROWS`` and ``restore_when_all_masked[req]``, their finite values
    come back if that left the row without a finite logit. Each list holds its first
    ``min(count, BLOCK_SIZE)`` entries."""
    impl = dispatch_v2("sample_logit_bias", "bias", bias_torch, logits_ptr.device)
    impl(
        grid,
        logits_ptr,
        logits_stride,
        vocab_size,
        expanded_idx_mapping_ptr,
        num_allowed_token_ids_ptr,
        allowed_token_ids_ptr,
        allowed_token_ids_stride,
        num_logit_bias_ptr,
        bias_token_ids_ptr,
        bias_token_ids_stride,
        bias_ptr,
        bias_stride,
        pos_ptr,
        min_lens_ptr,
        num_stop_token_ids_ptr,
        restore_when_all_masked_ptr,
        stop_token_ids_ptr,
        stop_token_ids_stride,
        BLOCK_SIZE,
        LOGITS_BLOCK_SIZE,
        CHECK_ALL_MASKED_ROWS,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._bias_kernel": bias,
}
