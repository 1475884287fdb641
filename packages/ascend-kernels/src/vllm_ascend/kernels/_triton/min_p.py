"""Triton :func:`vllm_ascend.kernels.apply_min_p`: one program per row (max pass, then mask pass)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._triton.common import ROW_WARPS, check_logits, row_block


@triton.jit
def _min_p_kernel(logits_ptr, row_stride, minp_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    mp = tl.load(minp_ptr + row)
    limit = tl.where(mp > 0, vocab, 0)
    row_max = tl.full([BLOCK], float("-inf"), tl.float32)
    offs = tl.arange(0, BLOCK)
    nxt = tl.load(row_ptr + offs, mask=offs < limit, other=float("-inf"))
    for start in range(0, limit, BLOCK):
        x = nxt.to(tl.float32)
        offs = start + BLOCK + tl.arange(0, BLOCK)
        nxt = tl.load(row_ptr + offs, mask=offs < limit, other=float("-inf"))
        row_max = tl.maximum(row_max, x)
    threshold = tl.max(row_max, 0) + tl.log(tl.where(mp > 0, mp, 1.0))
    offs = tl.arange(0, BLOCK)
    nxt = tl.load(row_ptr + offs, mask=offs < limit, other=0.0)
    for start in range(0, limit, BLOCK):
        x = nxt.to(tl.float32)
        offs = start + tl.arange(0, BLOCK)
        nxt = tl.load(row_ptr + offs + BLOCK, mask=offs + BLOCK < limit, other=0.0)
        tl.store(
            row_ptr + offs,
            tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty),
            mask=(offs < limit) & (x < threshold),
        )


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    if rows:
        _min_p_kernel[(rows,)](
            logits,
            logits.stride(0),
            min_p.to(torch.float32),
            vocab,
            BLOCK=row_block(vocab),
            num_warps=ROW_WARPS,
        )
    return logits
