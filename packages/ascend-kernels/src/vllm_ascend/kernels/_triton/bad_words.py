"""Triton :func:`vllm_ascend.kernels.apply_bad_words`: one program per bad word."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels._triton.common import check_logits

PREFIX_TILE = 16


@triton.jit
def _bad_words_kernel(
    logits_ptr,
    row_stride,
    hist_ptr,
    hist_stride,
    lens_ptr,
    tokens_ptr,
    offsets_ptr,
    rows_ptr,
    TILE: tl.constexpr,
):
    w = tl.program_id(0)
    row = tl.load(rows_ptr + w).to(tl.int64)
    start = tl.load(offsets_ptr + w).to(tl.int64)
    prefix_len = tl.load(offsets_ptr + w + 1).to(tl.int64) - 1 - start
    hist_len = tl.load(lens_ptr + row).to(tl.int64)
    mismatches = tl.where(prefix_len > hist_len, 1, 0)
    base = hist_len - prefix_len
    for j0 in range(0, prefix_len, TILE):
        j = j0 + tl.arange(0, TILE)
        m = j < tl.where(prefix_len <= hist_len, prefix_len, 0)
        want = tl.load(tokens_ptr + start + j, mask=m, other=0).to(tl.int64)
        have = tl.load(hist_ptr + row * hist_stride + base + j, mask=m, other=0).to(tl.int64)
        mismatches += tl.sum((m & (want != have)).to(tl.int32), 0)
    last = tl.load(tokens_ptr + start + prefix_len).to(tl.int64)
    tl.store(logits_ptr + row * row_stride + last, float("-inf"), mask=mismatches == 0)


def apply_bad_words(
    logits: torch.Tensor,
    token_history: torch.Tensor,
    history_lens: torch.Tensor,
    bad_word_tokens: torch.Tensor,
    bad_word_offsets: torch.Tensor,
    bad_word_rows: torch.Tensor,
) -> torch.Tensor:
    check_logits(logits)
    words = bad_word_rows.shape[0]
    if words == 0:
        return logits
    history = token_history if token_history.stride(-1) == 1 else token_history.contiguous()
    _bad_words_kernel[(words,)](
        logits,
        logits.stride(0),
        history,
        history.stride(0),
        history_lens,
        bad_word_tokens,
        bad_word_offsets,
        bad_word_rows,
        TILE=PREFIX_TILE,
        **launch(logits.device, 1),
    )
    return logits
