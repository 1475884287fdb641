"""Triton :func:`vllm_ascend.kernels.gumbel_sample`: one program per row, one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._triton.common import ROW_WARPS, check_logits, hash32, row_block


@triton.jit
def _gumbel_kernel(
    logits_ptr,
    row_stride,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    out_ptr,
    vocab,
    APPLY_TEMPERATURE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    t = tl.load(temp_ptr + row)
    random_row = t > 0
    noise_scale = tl.where(random_row, 1.0, 0.0)
    seed = tl.load(seed_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    key = hash32(hash32((seed & 0xFFFFFFFF).to(tl.uint32)) ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    key = hash32(key ^ (pos & 0xFFFFFFFF).to(tl.uint32))
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    offs = tl.arange(0, BLOCK)
    nxt = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf"))
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < vocab
        x = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + offs + BLOCK, mask=offs + BLOCK < vocab, other=float("-inf"))
        if APPLY_TEMPERATURE:
            x = x / tl.where(random_row, t, 1.0)
        h = hash32(key ^ (offs.to(tl.uint32) * 0x9E3779B9))
        u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
        x = x + noise_scale * -tl.log(-tl.log(u))
        x = tl.where(mask, x, float("-inf"))
        better = x > best_val
        best_val = tl.where(better, x, best_val)
        best_idx = tl.where(better, offs, best_idx)
    top = tl.max(best_val, 0)
    winner = tl.min(tl.where(best_val == top, best_idx, vocab), 0)
    tl.store(out_ptr + row, winner.to(tl.int64))


def gumbel_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    apply_temperature: bool = True,
) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    _gumbel_kernel[(rows,)](
        logits,
        logits.stride(0),
        temperature.to(torch.float32),
        seeds,
        positions,
        out,
        vocab,
        APPLY_TEMPERATURE=apply_temperature,
        BLOCK=row_block(vocab),
        num_warps=ROW_WARPS,
    )
    return out
