"""Triton :func:`vllm_ascend.kernels.gumbel_sample`: the two-level race of :mod:`..gumbel`.

One program per row chunk (a whole number of 4096-token blocks). A block is loaded as an
``[RUNS, SLOTS, RUN]`` slot tile (:func:`.common.slots`): thread ``j`` holds group ``j`` whole, so the
group's max, exponential sum and noise are computed once, by its own thread, without shuffles or
barriers, while the loads stay coalesced; a token costs a multiply-add, one exponential and an add.
Each thread keeps its best group score; the chunk's best group (lowest index on ties) then runs the
token race. Greedy rows run a plain max / first-index loop instead. With one chunk per row the kernel
writes the token; otherwise per-chunk ``(score, token)`` partials go to a combine kernel (highest
score, lowest token on ties).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import gumbel as ref
from vllm_ascend.kernels._triton.common import check_logits, hash32, row_split, scratch, slots

WARPS = ref.SLOTS // 32  # one group per thread
PER_SM = 4
COMBINE_BLOCK = 128
TOKEN_MIX = tl.constexpr(ref.TOKEN_MIX)
TOKEN_KEY = tl.constexpr(ref.TOKEN_KEY)
NO_INDEX = tl.constexpr(2**31 - 1)


@triton.jit
def _noise(key, index):
    """``-log(-log(u))`` of ``index`` (uint32) under ``key``; u from 23 hash bits, built from the bits
    (``f = 1 + k / 2**23``, so ``u = (k + 0.5) / 2**23 = (f - 1) + 2**-24`` exactly)."""
    h = hash32(key ^ (index * TOKEN_MIX))
    f = (0x3F800000 | (h >> 9)).to(tl.float32, bitcast=True)
    return -tl.log(-tl.log((f - 1.0) + 1.0 / 16777216.0))


@triton.jit
def _greedy(row_ptr, begin, end, A: tl.constexpr, NG: tl.constexpr, V: tl.constexpr):
    """``(max, lowest token holding it)`` over ``[begin, end)``."""
    TILE: tl.constexpr = A * NG * V
    local = slots(A, NG, V)
    best = tl.full([NG], float("-inf"), tl.float32)
    best_tok = tl.zeros([NG], tl.int32) + begin  # a chunk of -inf only: its first token
    for start in range(begin, end, TILE):
        offs = start + local
        x = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
        m = tl.max(tl.max(x, 2), 0)
        first = tl.min(tl.min(tl.where((x == m[None, :, None]) & (offs < end), offs, NO_INDEX), 2), 0)
        better = m > best
        best = tl.where(better, m, best)
        best_tok = tl.where(better, first, best_tok)
    top = tl.max(best, 0)
    return top, tl.min(tl.where(best == top, best_tok, NO_INDEX), 0)


@triton.jit
def _race(
    row_ptr,
    begin,
    end,
    vocab,
    key,
    t,
    scale,
    APPLY_TEMPERATURE: tl.constexpr,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
):
    """``(best group score, drawn token)`` over ``[begin, end)``: the group race, then the token race
    inside the winning group."""
    TILE: tl.constexpr = A * NG * V
    local = slots(A, NG, V)
    lane = tl.arange(0, NG)
    c = scale * 1.4426950408889634  # log2(e) / T
    best = tl.full([NG], float("-inf"), tl.float32)
    best_grp = begin // TILE * NG + lane
    nxt = tl.load(row_ptr + begin + local, mask=begin + local < end, other=float("-inf"))
    for start in range(begin, end, TILE):  # the next block is loaded before this one is raced
        x = nxt.to(tl.float32)
        offs = start + TILE + local
        nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
        m = tl.max(tl.max(x, 2), 0)
        # exp((x - m) / T) as exp2(x * c - m * c): one FMA and one exponential per token
        mc = tl.where(m > float("-inf"), m, 0.0) * c
        mass = tl.sum(tl.sum(tl.math.exp2(x * c - mc[None, :, None]), 2), 0)
        log_mass = tl.log(tl.where(mass > 0, mass, 1.0))  # an empty group scores -inf through m
        grp = start // TILE * NG + lane
        score = m * scale + log_mass + _noise(key, grp.to(tl.uint32))
        better = score > best
        best = tl.where(better, score, best)
        best_grp = tl.where(better, grp, best_grp)
    top = tl.max(best, 0)
    won = tl.min(tl.where(best == top, best_grp, NO_INDEX), 0)
    tokens = won // NG * TILE + (tl.arange(0, A)[:, None] * NG + won % NG) * V + tl.arange(0, V)[None, :]
    inside = tokens < vocab
    xt = tl.load(row_ptr + tokens, mask=inside, other=float("-inf")).to(tl.float32)
    yt = xt
    if APPLY_TEMPERATURE:
        yt = xt / t  # the reference's rounding
    s = tl.where(inside, yt + _noise(hash32(key ^ TOKEN_KEY), tokens.to(tl.uint32)), float("-inf"))
    return top, tl.min(tl.min(tl.where(s == tl.max(tl.max(s, 1), 0), tokens, NO_INDEX), 1), 0)


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
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    t = tl.load(temp_ptr + row)
    begin = part * chunk
    end = tl.minimum(begin + chunk, vocab)
    if t > 0:
        seed = tl.load(seed_ptr + row).to(tl.int64)
        pos = tl.load(pos_ptr + row).to(tl.int64)
        key = hash32(hash32((seed & 0xFFFFFFFF).to(tl.uint32)) ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
        key = hash32(key ^ (pos & 0xFFFFFFFF).to(tl.uint32))
        scale = 1.0
        if APPLY_TEMPERATURE:
            scale = 1.0 / t
        top, token = _race(row_ptr, begin, end, vocab, key, t, scale, APPLY_TEMPERATURE, A, NG, V)
    else:
        top, token = _greedy(row_ptr, begin, end, A, NG, V)
    if num_chunks == 1:
        tl.store(out_ptr + row, token.to(tl.int64))
    else:
        tl.store(part_val_ptr + row * num_chunks + part, top)
        tl.store(part_idx_ptr + row * num_chunks + part, token)


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
    chunks, chunk = row_split(rows, vocab, ref.BLOCK_TOKENS, logits.device, PER_SM)
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
        A=ref.RUNS,
        NG=ref.SLOTS,
        V=ref.RUN,
        num_warps=WARPS,
    )
    if chunks > 1:
        _gumbel_combine_kernel[(rows,)](part_val, part_idx, out, chunks, vocab, CB=COMBINE_BLOCK)
    return out
