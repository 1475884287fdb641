"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/bad_words.py`` (bad-words masking)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.bad_words"


def bad_words_torch(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    bad_word_token_ids_ptr: torch.Tensor,
    bad_word_token_ids_stride: int,
    bad_word_offsets_ptr: torch.Tensor,
    bad_word_offsets_stride: int,
    num_bad_words_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    prompt_len_ptr: torch.Tensor,
    total_len_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
) -> None:
    """Reference of :func:`bad_words`."""
    num_tokens, max_words = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_tokens == 0 or max_words == 0:
        return
    device = logits_ptr.device
    req_all = expanded_idx_mapping_ptr[:num_tokens].long()
    words = torch.arange(max_words, device=device)
    pairs = (words[None, :] < num_bad_words_ptr[req_all].long()[:, None]).nonzero()
    if pairs.numel() == 0:
        return
    token, word = pairs[:, 0], pairs[:, 1]
    req = req_all[token]
    pos = expanded_local_pos_ptr[token].long()
    prompt_len = prompt_len_ptr[req].long()
    output_len = total_len_ptr[req].long() - prompt_len
    effective_len = output_len + pos
    # The launch's tables are whole [rows, stride] tensors: indexed by row and column.
    start = bad_word_offsets_ptr[req, word].long()
    end = bad_word_offsets_ptr[req, word + 1].long()
    prefix_len = end - start - 1

    def column(table: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        return col.clamp(0, table.shape[1] - 1)

    match = prefix_len <= effective_len
    for i in range(int(prefix_len[match].max()) if bool(match.any()) else 0):
        check = match & (i < prefix_len)
        at = effective_len - prefix_len + i  # position in the output (drafts past output_len)
        from_draft = at >= output_len
        # input_ids[t - pos] is the last committed token; the drafts follow it.
        draft_index = (token - pos + at - output_len + 1).clamp(0, input_ids_ptr.numel() - 1)
        committed = all_token_ids_ptr[req, column(all_token_ids_ptr, prompt_len + at)]
        actual = torch.where(from_draft, input_ids_ptr[draft_index].long(), committed.long())
        expected = bad_word_token_ids_ptr[req, column(bad_word_token_ids_ptr, start + i)].long()
        match = match & ~(check & (expected != actual))
    last = bad_word_token_ids_ptr[req[match], end[match] - 1].long()
    logits_ptr[token[match], last] = float("-inf")


def bad_words(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    bad_word_token_ids_ptr: torch.Tensor,
    bad_word_token_ids_stride: int,
    bad_word_offsets_ptr: torch.Tensor,
    bad_word_offsets_stride: int,
    num_bad_words_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    prompt_len_ptr: torch.Tensor,
    total_len_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
) -> None:
    """Bad-words masking in place: for token ``t < grid[0]`` (request ``req``, draft position ``pos``)
    and bad word ``w < min(grid[1], num_bad_words[req])`` (tokens ``offsets[w] .. offsets[w + 1]`` of
    ``bad_word_token_ids[req]``), when the word's prefix equals the last tokens generated before ``t``
    (the committed output ``all_token_ids[req, prompt_len:total_len]`` followed by the drafts
    ``input_ids[t - pos + 1 .. t]``), ``logits[t, last token of w] = -inf``."""
    impl = dispatch_v2("sample_bad_words", "bad_words", bad_words_torch, logits_ptr.device)
    impl(
        grid,
        logits_ptr,
        logits_stride,
        expanded_idx_mapping_ptr,
        bad_word_token_ids_ptr,
        bad_word_token_ids_stride,
        bad_word_offsets_ptr,
        bad_word_offsets_stride,
        num_bad_words_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        prompt_len_ptr,
        total_len_ptr,
        input_ids_ptr,
        expanded_local_pos_ptr,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._bad_words_kernel": bad_words,
}
