"""Triton :func:`vllm_ascend.kernels.gumbel_sample`: rows split into chunks, then a tiny combine.

Each program takes one chunk of one row and keeps the best score ``x / T + g`` of its chunk, where
``g = -log(-log(u))`` is the reference's noise. The two logarithms dominate the cost (libdevice
``logf`` is ~30 instructions), so a tile computes them only when one of its elements can still beat
the chunk's best exact score ``b``: since ``g`` increases with ``u``, ``x + g(u) >= b`` needs
``u >= exp(-exp(x - b)) >= 1 - exp(x - b)``; the last bound costs one fast exponential. It is tested
with slack (a margin in score space, a few ulps in ``u``, and ``x * (1 / T)`` in place of the exact
division), so the filter never drops a possible winner and the result is exactly the reference's
argmax; after the first tiles of a chunk few tiles pass. A tile whose largest logit is more than
the largest possible noise below ``b`` is skipped before hashing. With one chunk per row the kernel
writes the token; otherwise per-chunk ``(score, index)`` partials go to a combine kernel (highest
score, lowest index on ties).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._triton.common import IS_INTERPRETED, check_logits, hash32, row_split, scratch

BLOCK = 256 if IS_INTERPRETED else 1024
WARPS = 4
PER_SM = 8
COMBINE_BLOCK = 128
MAX_NOISE = tl.constexpr(17.0)  # > -log(-log(1 - 2**-24)) ~ 16.64, the largest noise the 23-bit u can draw


@triton.jit
def _tile(
    raw,
    y,
    offs,
    end,
    key,
    t,
    random_row,
    noise_scale,
    best_val,
    best_idx,
    best,
    APPLY_TEMPERATURE: tl.constexpr,
):
    """Fold one tile into the chunk's running best (``y``: the filter's estimate of ``raw / T``)."""
    valid = (offs < end) & (raw > float("-inf"))
    h = hash32(key ^ (offs.to(tl.uint32) * 0x9E3779B9))
    # f = 1 + k / 2**23 for the 23 random bits k, built from the bits (no int-to-float conversion):
    # u = (k + 0.5) / 2**23 = (f - 1) + 2**-24 exactly.
    f = (0x3F800000 | (h >> 9)).to(tl.float32, bitcast=True)
    # Filter: y + g(u) >= best - margin needs u >= exp(-exp(z)) with z = y + margin - best, and
    # exp(-a) >= 1 - a, so u >= 1 - exp(z) holds for every possible winner: one exponential.
    # Slack: exp(z) taken 2**-16 larger, and 2**-19 (16 values of k) off the threshold.
    z = y + (1e-3 + 1e-5 * tl.abs(best) - best)
    f_min = (2.0 - 1.0 / 524288.0) - tl.exp(z) * (1.0 + 1.0 / 65536.0)
    cand = valid & tl.where(random_row, f >= f_min, z >= 0.0)
    if tl.max(cand.to(tl.int32), 0) > 0:
        x = raw
        if APPLY_TEMPERATURE:
            x = raw / tl.where(random_row, t, 1.0)  # the reference's rounding
        u = (f - 1.0) + 1.0 / 16777216.0
        s = x + noise_scale * -tl.log(-tl.log(u))
        s = tl.where(offs < end, s, float("-inf"))
        better = s > best_val
        best_val = tl.where(better, s, best_val)
        best_idx = tl.where(better, offs, best_idx)
        best = tl.max(best_val, 0)
    return best_val, best_idx, best


@triton.jit(do_not_specialize=["num_chunks"])
def _gumbel_kernel(
    logits_ptr,
    row_stride,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    part_val_ptr,
    part_idx_ptr,
    out_ptr,
    vocab,
    chunk,
    num_chunks,
    APPLY_TEMPERATURE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    t = tl.load(temp_ptr + row)
    random_row = t > 0
    noise_scale = tl.where(random_row, 1.0, 0.0)
    seed = tl.load(seed_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    key = hash32(hash32((seed & 0xFFFFFFFF).to(tl.uint32)) ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    key = hash32(key ^ (pos & 0xFFFFFFFF).to(tl.uint32))
    begin = part * chunk
    end = tl.minimum(begin + chunk, vocab)
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    best = tl.full([], float("-inf"), tl.float32)  # best exact score of this chunk so far
    offs = begin + tl.arange(0, BLOCK)
    nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
    inv_t = 1.0 / tl.where(random_row, t, 1.0)
    for start in range(begin, end, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        raw = nxt.to(tl.float32)
        nxt = tl.load(row_ptr + offs + BLOCK, mask=offs + BLOCK < end, other=float("-inf"))
        y = raw  # cheap estimate of the scaled logit for the filter (the exact division is slow)
        if APPLY_TEMPERATURE:
            y = raw * inv_t
        # The noise is at most MAX_NOISE: a tile whose largest y is that far below best cannot win.
        if tl.max(y, 0) + noise_scale * MAX_NOISE >= best - (1e-3 + 1e-5 * tl.abs(best)):
            best_val, best_idx, best = _tile(
                raw,
                y,
                offs,
                end,
                key,
                t,
                random_row,
                noise_scale,
                best_val,
                best_idx,
                best,
                APPLY_TEMPERATURE,
            )
    top = tl.max(best_val, 0)
    winner = tl.min(tl.where(best_val == top, best_idx, vocab), 0)
    if num_chunks == 1:
        tl.store(out_ptr + row, winner.to(tl.int64))
    else:
        tl.store(part_val_ptr + row * num_chunks + part, top)
        tl.store(part_idx_ptr + row * num_chunks + part, winner)


@triton.jit(do_not_specialize=["num_chunks"])
def _gumbel_combine_kernel(part_val_ptr, part_idx_ptr, out_ptr, num_chunks, vocab, CB: tl.constexpr):
    row = tl.program_id(0)
    best = tl.full([], float("-inf"), tl.float32)
    idx = tl.full([], 0, tl.int32) + vocab
    for c0 in range(0, num_chunks, CB):
        c = c0 + tl.arange(0, CB)
        m = c < num_chunks
        v = tl.load(part_val_ptr + row * num_chunks + c, mask=m, other=float("-inf"))
        i = tl.load(part_idx_ptr + row * num_chunks + c, mask=m, other=vocab)
        top = tl.max(v, 0)
        cand = tl.min(tl.where(m & (v == top), i, vocab), 0)
        idx = tl.where(top > best, cand, tl.where(top == best, tl.minimum(idx, cand), idx))
        best = tl.maximum(best, top)
    tl.store(out_ptr + row, idx.to(tl.int64))


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
    chunks, chunk = row_split(rows, vocab, BLOCK, logits.device, PER_SM)
    part_val = scratch("gumbel_val", rows * chunks, torch.float32, logits.device)
    part_idx = scratch("gumbel_idx", rows * chunks, torch.int32, logits.device)
    _gumbel_kernel[(rows, chunks)](
        logits,
        logits.stride(0),
        temperature.to(torch.float32),
        seeds,
        positions,
        part_val,
        part_idx,
        out,
        vocab,
        chunk,
        chunks,
        APPLY_TEMPERATURE=apply_temperature,
        BLOCK=BLOCK,
        num_warps=WARPS,
    )
    if chunks > 1:
        _gumbel_combine_kernel[(rows,)](part_val, part_idx, out, chunks, vocab, CB=COMBINE_BLOCK)
    return out
