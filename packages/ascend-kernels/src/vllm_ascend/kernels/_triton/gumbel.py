"""Triton :func:`vllm_ascend.kernels.gumbel_sample`: per-chunk arg-max of noisy logits, then per-row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from vllm_ascend.kernels._triton.common import check_logits, hash32, vocab_block


@triton.jit
def _gumbel_chunk_kernel(
    logits_ptr, row_stride, temp_ptr, seed_ptr, pos_ptr, part_val_ptr, part_idx_ptr, vocab, num_chunks,
    APPLY_TEMPERATURE: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * row_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
    t = tl.load(temp_ptr + row)
    random_row = t > 0
    if APPLY_TEMPERATURE:
        x = x / tl.where(random_row, t, 1.0)
    seed = tl.load(seed_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    key = hash32(hash32((seed & 0xFFFFFFFF).to(tl.uint32)) ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    key = hash32(key ^ (pos & 0xFFFFFFFF).to(tl.uint32))
    h = hash32(key ^ hash32(offs.to(tl.uint32)))
    u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    noise = -tl.log(-tl.log(u))
    x = x + noise * tl.where(random_row, 1.0, 0.0)
    x = tl.where(mask, x, float("-inf"))
    best = tl.argmax(x, 0)
    out = row * num_chunks + chunk
    tl.store(part_val_ptr + out, tl.max(x, 0))
    tl.store(part_idx_ptr + out, chunk * BLOCK + best)


@triton.jit
def _argmax_partials_kernel(part_val_ptr, part_idx_ptr, out_ptr, num_chunks, CHUNKS: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS)
    vals = tl.load(part_val_ptr + row * num_chunks + c, mask=c < num_chunks, other=float("-inf"))
    best = tl.argmax(vals, 0)
    tl.store(out_ptr + row, tl.load(part_idx_ptr + row * num_chunks + best).to(tl.int64))


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
    block = vocab_block(vocab, 4096)
    chunks = triton.cdiv(vocab, block)
    part_val = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(rows, chunks, dtype=torch.int32, device=logits.device)
    _gumbel_chunk_kernel[(rows, chunks)](
        logits, logits.stride(0), temperature.to(torch.float32), seeds, positions, part_val, part_idx, vocab, chunks,
        APPLY_TEMPERATURE=apply_temperature, BLOCK=block, num_warps=8,
    )
    _argmax_partials_kernel[(rows,)](part_val, part_idx, out, chunks, CHUNKS=triton.next_power_of_2(chunks))
    return out
