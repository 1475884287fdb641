"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/penalties.py`` (repetition,
frequency and presence penalties, and the prompt / output token statistics they read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.penalties"


def _rows(t: torch.Tensor, rows: int, stride: int, width: int) -> torch.Tensor:
    """The ``[rows, width]`` view a kernel addresses as ``ptr + row * stride + col``."""
    return t.as_strided((rows, width), (stride, 1), t.storage_offset())


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """``[..., 32 * W]`` bools -> ``[..., W]`` int32 words, bit ``i`` of word ``w`` = ``bits[32 w + i]``
    (bit 31 is the sign bit)."""
    words = bits.reshape(*bits.shape[:-1], -1, 32).long() << torch.arange(32, device=bits.device)
    words = words.sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_bits(words: torch.Tensor, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``width`` bits of ``words`` (int32) as bools."""
    bits = (words.to(torch.int32)[..., None] >> torch.arange(32, dtype=torch.int32, device=words.device)) & 1
    return bits.reshape(*words.shape[:-1], -1)[..., :width].bool()


def bincount_torch(
    grid: Grid,
    expanded_idx_mapping_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    prompt_len_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    prompt_bin_mask_ptr: torch.Tensor,
    prompt_bin_mask_stride: int,
    output_bin_counts_ptr: torch.Tensor,
    output_bin_counts_stride: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`bincount`."""
    num_tokens, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_tokens == 0 or num_blocks == 0:
        return
    device = all_token_ids_ptr.device
    req = expanded_idx_mapping_ptr[:num_tokens].long()
    prompt_len = prompt_len_ptr[req].long()[:, None]
    prefill_len = prefill_len_ptr[req].long()[:, None]
    # Positions of the launched blocks that any row reads (loads past them are masked).
    width = min(num_blocks * BLOCK_SIZE, int(torch.maximum(prompt_len, prefill_len).max()))
    if width <= 0:
        return
    pos = torch.arange(width, device=device)[None, :]
    block_live = (pos // BLOCK_SIZE) * BLOCK_SIZE < prefill_len
    in_prompt = block_live & (pos < prompt_len)
    in_output = (pos >= prompt_len) & (pos < prefill_len)
    rows = torch.arange(num_tokens, device=device)[:, None].expand(-1, width)
    tokens = torch.zeros(num_tokens, width, dtype=torch.int64, device=device)
    readable = in_prompt | in_output
    token_rows = all_token_ids_ptr.as_strided(
        (all_token_ids_ptr.shape[0], width), (all_token_ids_stride, 1), all_token_ids_ptr.storage_offset()
    )
    tokens[readable] = token_rows[
        req[:, None].expand(-1, width)[readable], pos.expand(num_tokens, -1)[readable]
    ].long()

    if bool(in_prompt.any()):
        # Atomic OR: idempotent, so rows of one request are merged before the OR.
        states, row_state = torch.unique(req, return_inverse=True)
        words = prompt_bin_mask_ptr.shape[1]
        present = torch.zeros(states.numel(), words * 32, dtype=torch.bool, device=device)
        present[row_state[:, None].expand(-1, width)[in_prompt], tokens[in_prompt]] = True
        masks = prompt_bin_mask_ptr.as_strided(
            (prompt_bin_mask_ptr.shape[0], words),
            (prompt_bin_mask_stride, 1),
            prompt_bin_mask_ptr.storage_offset(),
        )
        masks[states] = masks[states] | pack_bits(present)
    if bool(in_output.any()):
        counts = output_bin_counts_ptr.as_strided(
            (output_bin_counts_ptr.shape[0], output_bin_counts_ptr.shape[1]),
            (output_bin_counts_stride, 1),
            output_bin_counts_ptr.storage_offset(),
        )
        ones = torch.ones(int(in_output.sum()), dtype=counts.dtype, device=device)
        counts.index_put_((req[rows[in_output]], tokens[in_output]), ones, accumulate=True)


def bincount(
    grid: Grid,
    expanded_idx_mapping_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    prompt_len_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    prompt_bin_mask_ptr: torch.Tensor,
    prompt_bin_mask_stride: int,
    output_bin_counts_ptr: torch.Tensor,
    output_bin_counts_stride: int,
    BLOCK_SIZE: int,
) -> None:
    """Token statistics of new penalised requests, accumulated in place: for each ``t < grid[0]``
    (state row ``req = expanded_idx_mapping_ptr[t]``), over the first ``grid[1] * BLOCK_SIZE``
    positions of ``all_token_ids[req]``: the prompt tokens (``pos < prompt_len``, in blocks starting
    before ``prefill_len``) set their bit in ``prompt_bin_mask[req]`` (bit ``tok % 32`` of int32 word
    ``tok // 32``, OR), the tokens in ``prompt_len <= pos < prefill_len`` add 1 to
    ``output_bin_counts[req, tok]``. (vLLM zeroes both rows before the launch.)"""
    impl = dispatch_v2("sample_penalties", "bincount", bincount_torch, all_token_ids_ptr.device)
    impl(
        grid,
        expanded_idx_mapping_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        prompt_len_ptr,
        prefill_len_ptr,
        prompt_bin_mask_ptr,
        prompt_bin_mask_stride,
        output_bin_counts_ptr,
        output_bin_counts_stride,
        BLOCK_SIZE,
    )


def penalties_torch(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    token_ids_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    repetition_penalty_ptr: torch.Tensor,
    frequency_penalty_ptr: torch.Tensor,
    presence_penalty_ptr: torch.Tensor,
    prompt_bin_mask_ptr: torch.Tensor,
    prompt_bin_mask_stride: int,
    output_bin_counts_ptr: torch.Tensor,
    output_bin_counts_stride: int,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`penalties`."""
    num_tokens = grid_dim(grid, 0)
    width = min(vocab_size, grid_dim(grid, 1) * BLOCK_SIZE)
    if num_tokens == 0 or width <= 0:
        return
    device = logits_ptr.device
    req_all = expanded_idx_mapping_ptr[:num_tokens].long()
    rep_all = repetition_penalty_ptr[req_all].float()
    freq_all = frequency_penalty_ptr[req_all].float()
    pres_all = presence_penalty_ptr[req_all].float()
    active = ((rep_all != 1.0) | (freq_all != 0.0) | (pres_all != 0.0)).nonzero().flatten()
    if active.numel() == 0:
        return
    req, rep, freq, pres = (
        req_all[active],
        rep_all[active, None],
        freq_all[active, None],
        pres_all[active, None],
    )

    logits_rows = _rows(logits_ptr, num_tokens, logits_stride, width)
    logits = logits_rows[active].float()
    counts = _rows(output_bin_counts_ptr, output_bin_counts_ptr.shape[0], output_bin_counts_stride, width)[
        req
    ]
    counts = counts.to(torch.int32).clone()
    # Draft tokens of the same request before this position count as output.
    pos = expanded_local_pos_ptr[:num_tokens].long()[active]
    first = active - pos
    for k in range(int(pos.max()) if pos.numel() else 0):
        rows = (pos > k).nonzero().flatten()
        prev = token_ids_ptr[first[rows] + k + 1].long()
        hit = (prev >= 0) & (prev < width)
        counts.index_put_(
            (rows[hit], prev[hit]),
            torch.ones(int(hit.sum()), dtype=torch.int32, device=device),
            accumulate=True,
        )
    in_output = counts > 0

    use_rep = rep != 1.0
    if bool(use_rep.any()):
        words = (width + 31) // 32
        packed = _rows(prompt_bin_mask_ptr, prompt_bin_mask_ptr.shape[0], prompt_bin_mask_stride, words)[req]
        in_prompt = unpack_bits(packed, width)
        scale = torch.where(in_prompt | in_output, rep, torch.ones((), device=device))
        factor = torch.where(logits > 0, 1.0 / scale, scale)
        logits = torch.where(use_rep, logits * factor, logits)
    logits = logits - freq * counts.float()
    logits = logits - pres * in_output.float()
    logits_rows[active] = logits.to(logits_rows.dtype)


def penalties(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    token_ids_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    repetition_penalty_ptr: torch.Tensor,
    frequency_penalty_ptr: torch.Tensor,
    presence_penalty_ptr: torch.Tensor,
    prompt_bin_mask_ptr: torch.Tensor,
    prompt_bin_mask_stride: int,
    output_bin_counts_ptr: torch.Tensor,
    output_bin_counts_stride: int,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Applies the penalties of each token ``t < grid[0]``'s request ``req`` to its logits in place
    (the first ``min(vocab_size, grid[1] * BLOCK_SIZE)`` columns; rows without penalties untouched).
    A token's output count is ``output_bin_counts[req]`` plus the draft tokens before it
    (``token_ids[t - pos + 1 .. t]``, ``pos = expanded_local_pos[t]``); repetition (tokens in the
    prompt bitmask or output): positive logits times ``1 / rep``, the others times ``rep``; then
    ``- freq * count - pres * (count > 0)``, in float32."""
    impl = dispatch_v2("sample_penalties", "penalties", penalties_torch, logits_ptr.device)
    impl(
        grid,
        logits_ptr,
        logits_stride,
        expanded_idx_mapping_ptr,
        token_ids_ptr,
        expanded_local_pos_ptr,
        repetition_penalty_ptr,
        frequency_penalty_ptr,
        presence_penalty_ptr,
        prompt_bin_mask_ptr,
        prompt_bin_mask_stride,
        output_bin_counts_ptr,
        output_bin_counts_stride,
        vocab_size,
        BLOCK_SIZE,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._bincount_kernel": bincount,
    f"{_VLLM}._penalties_kernel": penalties,
}
