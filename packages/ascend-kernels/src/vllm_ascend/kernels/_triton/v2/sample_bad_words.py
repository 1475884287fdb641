"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_bad_words`: one program per vector
core walks the ``(token, bad word)`` pairs grid-stride, comparing the word's prefix with the tokens
before the position (scalar loads: bad words are short)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels.v2._launch import Grid, grid_dim


@triton.jit
def _bad_words_kernel(
    logits_ptr,
    logits_stride,
    idx_mapping_ptr,
    words_ptr,
    words_stride,
    offsets_ptr,
    offsets_stride,
    num_words_ptr,
    history_ptr,
    history_stride,
    prompt_len_ptr,
    total_len_ptr,
    input_ids_ptr,
    local_pos_ptr,
    num_tokens,
    max_words,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, num_tokens * max_words, programs):
        token = item // max_words
        word = item - token * max_words
        state = tl.load(idx_mapping_ptr + token).to(tl.int64)
        if word < tl.load(num_words_ptr + state):
            pos = tl.load(local_pos_ptr + token)
            prompt_len = tl.load(prompt_len_ptr + state)
            output_len = tl.load(total_len_ptr + state) - prompt_len
            effective_len = output_len + pos
            start = tl.load(offsets_ptr + state * offsets_stride + word)
            end = tl.load(offsets_ptr + state * offsets_stride + word + 1)
            prefix_len = end - start - 1
            if prefix_len <= effective_len:
                words_row = words_ptr + state * words_stride
                drafts = input_ids_ptr + tl.cast(token, tl.int64) - pos + 1 - output_len
                output = history_ptr + state * history_stride + prompt_len
                mismatches = 0
                for i in range(0, prefix_len):
                    at = effective_len - prefix_len + i
                    if at >= output_len:
                        actual = tl.load(drafts + at)  # input_ids[token - pos] is the last committed token
                    else:
                        actual = tl.load(output + at)
                    mismatches += (tl.load(words_row + start + i) != actual).to(tl.int32)
                if mismatches == 0:
                    last = tl.load(words_row + end - 1)
                    row = logits_ptr + tl.cast(token, tl.int64) * logits_stride
                    tl.store(
                        row + last, tl.full([], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty)
                    )


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
    num_tokens, max_words = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_tokens == 0 or max_words == 0:
        return
    programs = _geometry.programs(logits_ptr.device, num_tokens * max_words)
    _bad_words_kernel[(programs,)](
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
        num_tokens,
        max_words,
    )
