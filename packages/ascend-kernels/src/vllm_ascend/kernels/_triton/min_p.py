"""Triton :func:`vllm_ascend.kernels.apply_min_p`: row max, then a masking pass.

Large batches: one program per row does both passes (``phase`` 0). Small batches split each row into
chunks so that every multiprocessor streams: a first launch writes per-chunk maxima (``phase`` 1),
a second one reduces the row's few partials and masks its chunk (``phase`` 2). The phase is a
runtime argument, so every batch size runs the same compiled kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._triton.common import ROW_WARPS, check_logits, row_block, row_split, scratch

COMBINE_BLOCK = 128


@triton.jit(do_not_specialize=["num_chunks", "phase"])
def _min_p_kernel(
    logits_ptr,
    row_stride,
    minp_ptr,
    part_ptr,
    vocab,
    chunk,
    num_chunks,
    phase,
    BLOCK: tl.constexpr,
    CB: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    mp = tl.load(minp_ptr + row)
    begin = part * chunk
    end = tl.where(mp > 0, tl.minimum(begin + chunk, vocab), begin)
    top = tl.full([], float("-inf"), tl.float32)
    if phase != 2:
        row_max = tl.full([BLOCK], float("-inf"), tl.float32)
        offs = begin + tl.arange(0, BLOCK)
        nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
        for start in range(begin, end, BLOCK):
            x = nxt.to(tl.float32)
            offs = start + BLOCK + tl.arange(0, BLOCK)
            nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
            row_max = tl.maximum(row_max, x)
        top = tl.max(row_max, 0)
        if phase == 1:
            tl.store(part_ptr + row * num_chunks + part, top)
    else:
        for c0 in range(0, num_chunks, CB):
            c = c0 + tl.arange(0, CB)
            v = tl.load(part_ptr + row * num_chunks + c, mask=c < num_chunks, other=float("-inf"))
            top = tl.maximum(top, tl.max(v, 0))
    if phase != 1:
        threshold = top + tl.log(tl.where(mp > 0, mp, 1.0))
        offs = begin + tl.arange(0, BLOCK)
        nxt = tl.load(row_ptr + offs, mask=offs < end, other=0.0)
        for start in range(begin, end, BLOCK):
            x = nxt.to(tl.float32)
            offs = start + tl.arange(0, BLOCK)
            nxt = tl.load(row_ptr + offs + BLOCK, mask=offs + BLOCK < end, other=0.0)
            tl.store(
                row_ptr + offs,
                tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty),
                mask=(offs < end) & (x < threshold),
            )


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    if not rows:
        return logits
    block = row_block(vocab)
    chunks, chunk = row_split(rows, vocab, block, logits.device)
    mp = min_p.to(torch.float32)
    part = scratch("min_p", rows * chunks, torch.float32, logits.device)
    args = (logits, logits.stride(0), mp, part, vocab, chunk, chunks)
    for phase in (0,) if chunks == 1 else (1, 2):
        _min_p_kernel[(rows, chunks)](*args, phase, BLOCK=block, CB=COMBINE_BLOCK, num_warps=ROW_WARPS)
    return logits
