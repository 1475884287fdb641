"""Triton :func:`vllm_ascend.kernels.apply_min_p`: per-chunk maxima, then threshold and mask."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from vllm_ascend.kernels._triton.common import check_logits, vocab_block


@triton.jit
def _chunk_max_kernel(logits_ptr, row_stride, minp_ptr, part_ptr, vocab, num_chunks, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    limit = tl.where(tl.load(minp_ptr + row) > 0, vocab, 0)
    x = tl.load(logits_ptr + row.to(tl.int64) * row_stride + offs, mask=offs < limit, other=float("-inf"))
    tl.store(part_ptr + row * num_chunks + chunk, tl.max(x.to(tl.float32), 0))


@triton.jit
def _min_p_mask_kernel(
    logits_ptr, row_stride, minp_ptr, part_ptr, vocab, num_chunks, BLOCK: tl.constexpr, CHUNKS: tl.constexpr
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    mp = tl.load(minp_ptr + row)
    c = tl.arange(0, CHUNKS)
    row_max = tl.max(tl.load(part_ptr + row * num_chunks + c, mask=c < num_chunks, other=float("-inf")), 0)
    threshold = row_max + tl.log(tl.where(mp > 0, mp, 1.0))
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    ptr = logits_ptr + row.to(tl.int64) * row_stride + offs
    mask = offs < tl.where(mp > 0, vocab, 0)
    x = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr, tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty), mask=mask & (x < threshold))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    if rows == 0:
        return logits
    block = vocab_block(vocab, 4096)
    chunks = triton.cdiv(vocab, block)
    mp = min_p.to(torch.float32)
    part = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    grid = (rows, chunks)
    _chunk_max_kernel[grid](logits, logits.stride(0), mp, part, vocab, chunks, BLOCK=block, num_warps=8)
    _min_p_mask_kernel[grid](
        logits, logits.stride(0), mp, part, vocab, chunks, BLOCK=block, CHUNKS=triton.next_power_of_2(chunks),
        num_warps=8,
    )
    return logits
