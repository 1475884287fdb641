"""Triton :func:`vllm_ascend.kernels.apply_penalties`: sparse bincount, then claim-and-apply.

One program per row, one launch. Phase 1 scatters the row's history into a cached ``[B, V]`` int32
scratch that is all zeros between calls: output occurrences add 1, prompt occurrences set bit 30.
After a block barrier, phase 2 visits the same history entries; the first visitor of a token takes
the count with an atomic exchange against 0 (restoring the scratch), and only that visitor
rewrites the logit, so duplicates never apply twice. Cost ``O(B * (P + O))``; the logits are
touched only at history tokens. Calls must not run concurrently on two streams of one device
(they share the scratch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels._triton.common import check_logits

PROMPT_BIT = 1 << 30
_scratch: dict[torch.device, torch.Tensor] = {}


def _zeroed_scratch(numel: int, device: torch.device) -> torch.Tensor:
    buf = _scratch.get(device)
    if buf is None or buf.numel() < numel:
        buf = torch.zeros(numel, dtype=torch.int32, device=device)
        _scratch[device] = buf
    return buf


@triton.jit
def _history_entry(
    prompt_ptr, prompt_stride, prompt_len, output_ptr, output_stride, output_len, row, offs, vocab
):
    """Token ids at history positions ``offs`` (prompt first, then output), validity, is-output."""
    in_prompt = offs < prompt_len
    in_output = (offs >= prompt_len) & (offs < prompt_len + output_len)
    p_tok = tl.load(prompt_ptr + row * prompt_stride + offs, mask=in_prompt, other=-1).to(tl.int64)
    o_tok = tl.load(output_ptr + row * output_stride + (offs - prompt_len), mask=in_output, other=-1).to(
        tl.int64
    )
    tok = tl.where(in_prompt, p_tok, o_tok)
    valid = (in_prompt | in_output) & (tok >= 0) & (tok < vocab)
    return tok, valid, in_output


@triton.jit(do_not_specialize=["prompt_len", "output_len"])
def _penalties_kernel(
    logits_ptr,
    row_stride,
    prompt_ptr,
    prompt_stride,
    prompt_len,
    output_ptr,
    output_stride,
    output_len,
    counts_ptr,
    rep_ptr,
    freq_ptr,
    pres_ptr,
    vocab,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    counts_row = counts_ptr + row * vocab
    history = prompt_len + output_len
    for start in range(0, history, BLOCK):
        tok, valid, is_output = _history_entry(
            prompt_ptr,
            prompt_stride,
            prompt_len,
            output_ptr,
            output_stride,
            output_len,
            row,
            start + tl.arange(0, BLOCK),
            vocab,
        )
        tl.atomic_add(counts_row + tok, tl.full([BLOCK], 1, tl.int32), mask=valid & is_output)
        tl.atomic_or(counts_row + tok, tl.full([BLOCK], 1 << 30, tl.int32), mask=valid & (is_output == 0))
    tl.debug_barrier()
    rep = tl.load(rep_ptr + row)
    freq = tl.load(freq_ptr + row)
    pres = tl.load(pres_ptr + row)
    for start in range(0, history, BLOCK):
        tok, valid, _ = _history_entry(
            prompt_ptr,
            prompt_stride,
            prompt_len,
            output_ptr,
            output_stride,
            output_len,
            row,
            start + tl.arange(0, BLOCK),
            vocab,
        )
        claimed = tl.atomic_xchg(counts_row + tok, tl.zeros([BLOCK], tl.int32), mask=valid)
        owner = valid & (claimed != 0)
        count = (claimed & ((1 << 30) - 1)).to(tl.float32)
        ptr = logits_ptr + row * row_stride + tok
        x = tl.load(ptr, mask=owner, other=0.0).to(tl.float32)
        x = tl.where(x > 0, x / rep, x * rep)
        x = x - freq * count
        x = x - pres * (count > 0).to(tl.float32)
        tl.store(ptr, x.to(logits_ptr.dtype.element_ty), mask=owner)


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_token_ids: torch.Tensor,
    repetition_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    prompt = prompt_token_ids.reshape(rows, -1)
    output = output_token_ids.reshape(rows, -1)
    if prompt.shape[1] and prompt.stride(1) != 1:
        prompt = prompt.contiguous()
    if output.shape[1] and output.stride(1) != 1:
        output = output.contiguous()
    history = prompt.shape[1] + output.shape[1]
    if rows == 0 or history == 0:
        return logits
    counts = _zeroed_scratch(rows * vocab, logits.device)
    f32 = torch.float32
    _penalties_kernel[(rows,)](
        logits,
        logits.stride(0),
        prompt,
        prompt.stride(0),
        prompt.shape[1],
        output,
        output.stride(0),
        output.shape[1],
        counts,
        repetition_penalty.to(f32),
        frequency_penalty.to(f32),
        presence_penalty.to(f32),
        vocab,
        BLOCK=min(1024, triton.next_power_of_2(history)),
        **launch(logits.device, 4),
    )
    return logits
