"""Triton :func:`vllm_ascend.kernels.apply_min_p`: row max, then a masking pass.

Batches of at least one row per multiprocessor: one program per row does both passes. Smaller
batches split each row into chunks so that every multiprocessor streams: a first launch writes
per-chunk maxima, a second one reduces the row's few partials and masks its chunk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._triton.common import ROW_WARPS, check_logits, row_block, row_split, scratch

COMBINE_BLOCK = 128
PER_SM = 1  # split only batches of fewer rows than multiprocessors (H200: B = 256 runs best unsplit)


@triton.jit
def _mask_below(row_ptr, begin, end, threshold, BLOCK: tl.constexpr):
    offs = begin + tl.arange(0, BLOCK)
    nxt = tl.load(row_ptr + offs, mask=offs < end, other=0.0)
    for start in range(begin, end, BLOCK):
        x = nxt.to(tl.float32)
        offs = start + tl.arange(0, BLOCK)
        nxt = tl.load(row_ptr + offs + BLOCK, mask=offs + BLOCK < end, other=0.0)
        tl.store(
            row_ptr + offs,
            tl.full([BLOCK], float("-inf"), row_ptr.dtype.element_ty),
            mask=(offs < end) & (x < threshold),
        )


@triton.jit
def _range_max(row_ptr, begin, end, BLOCK: tl.constexpr):
    run = tl.full([BLOCK], float("-inf"), tl.float32)
    offs = begin + tl.arange(0, BLOCK)
    nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
    for start in range(begin, end, BLOCK):
        x = nxt.to(tl.float32)
        offs = start + BLOCK + tl.arange(0, BLOCK)
        nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
        run = tl.maximum(run, x)
    return tl.max(run, 0)


@triton.jit
def _min_p_kernel(logits_ptr, row_stride, minp_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    mp = tl.load(minp_ptr + row)
    limit = tl.where(mp > 0, vocab, 0)
    threshold = _range_max(row_ptr, 0, limit, BLOCK) + tl.log(tl.where(mp > 0, mp, 1.0))
    _mask_below(row_ptr, 0, limit, threshold, BLOCK)


@triton.jit
def _chunk_max_kernel(
    logits_ptr, row_stride, minp_ptr, part_ptr, vocab, chunk, num_chunks, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    begin = part * chunk
    end = tl.where(tl.load(minp_ptr + row) > 0, tl.minimum(begin + chunk, vocab), begin)
    tl.store(part_ptr + row * num_chunks + part, _range_max(row_ptr, begin, end, BLOCK))


@triton.jit
def _chunk_mask_kernel(
    logits_ptr,
    row_stride,
    minp_ptr,
    part_ptr,
    vocab,
    chunk,
    num_chunks,
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
    for c0 in range(0, num_chunks, CB):
        c = c0 + tl.arange(0, CB)
        v = tl.load(part_ptr + row * num_chunks + c, mask=c < num_chunks, other=float("-inf"))
        top = tl.maximum(top, tl.max(v, 0))
    _mask_below(row_ptr, begin, end, top + tl.log(tl.where(mp > 0, mp, 1.0)), BLOCK)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    if not rows:
        return logits
    block = row_block(vocab)
    mp = min_p.to(torch.float32)
    chunks, chunk = row_split(rows, vocab, block, logits.device, PER_SM)
    if chunks == 1:
        _min_p_kernel[(rows,)](logits, logits.stride(0), mp, vocab, BLOCK=block, num_warps=ROW_WARPS)
        return logits
    part = scratch("min_p", rows * chunks, torch.float32, logits.device)
    args = (logits, logits.stride(0), mp, part, vocab, chunk, chunks)
    _chunk_max_kernel[(rows, chunks)](*args, BLOCK=block, num_warps=ROW_WARPS)
    _chunk_mask_kernel[(rows, chunks)](*args, BLOCK=block, CB=COMBINE_BLOCK, num_warps=ROW_WARPS)
    return logits
