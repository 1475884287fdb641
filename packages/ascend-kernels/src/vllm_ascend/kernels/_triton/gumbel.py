"""Triton :func:`vllm_ascend.kernels.gumbel_sample`: the two-level race of :mod:`..gumbel`.

One program per row chunk. A tile is ``[A, NG, V]``: ``NG`` groups of ``GROUP = A * V`` consecutive
tokens, each group held by one thread (``V`` contiguous elements per load, ``A`` loads), so the group's
max, its exponential sum and its noise are computed once, by its own thread, without shuffles or
barriers; per token the work is a multiply-add, one exponential and an add. Each thread keeps its
best group score. With one chunk per row the program then runs the token race inside the row's best
group (lowest index on ties) and writes the token; split rows write their chunk's ``(score, group)``
and the row's last program to finish (:func:`.common.last_chunk`) picks the best group and runs the
token race: one launch either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import gumbel as ref
from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels._triton.common import (
    IS_INTERPRETED,
    LOG2E,
    check_logits,
    cores,
    counters,
    hash32,
    last_chunk,
    row_split,
    scratch,
    vector,
)

WARPS = (
    8  # H200 sweep of 4/8/16 warps x 2-48 programs per SM: 8 at 4 per SM within 7 % of the best everywhere
)
GROUPS_PER_TILE = 8 if IS_INTERPRETED else 32 * WARPS  # one group per thread per tile
PER_SM = 4  # batches of fewer rows than multiprocessors: split for this many programs per multiprocessor
COMBINE_BLOCK = 128
TOKEN_MIX = tl.constexpr(ref.TOKEN_MIX)
TOKEN_KEY = tl.constexpr(ref.TOKEN_KEY)
NO_INDEX = tl.constexpr(2**31 - 1)


@triton.jit
def _noise(key, index):
    """``-log(-log(u))`` of ``index`` (uint32) under ``key``; u from 23 hash bits, built from the bits
    (``f = 1 + k / 2**23``, so ``u = (k + 0.5) / 2**23 = (f - 1) + 2**-24`` exactly)."""
    h = hash32(key ^ (index * TOKEN_MIX))
    f = ((h >> 9) | 0x3F800000).to(tl.float32, bitcast=True)  # tensor first: triton-ascend needs it
    return -tl.log(-tl.log((f - 1.0) + 1.0 / 16777216.0))


@triton.jit
def _row_key(seed_ptr, pos_ptr, row):
    """The row's 32-bit key from its int64 seed and position (see :mod:`..gumbel`)."""
    seed = tl.load(seed_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    key = hash32(hash32((seed & 0xFFFFFFFF).to(tl.uint32)) ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    return hash32(key ^ (pos & 0xFFFFFFFF).to(tl.uint32))


@triton.jit
def _token_race(row_ptr, row, won, vocab, key, t, out_ptr, APPLY_TEMPERATURE: tl.constexpr, G: tl.constexpr):
    """Write the row's drawn token: the token race inside group ``won`` (greedy rows: its first
    largest logit)."""
    random_row = t > 0
    tokens = won * G + tl.arange(0, G)
    inside = tokens < vocab
    xt = tl.load(row_ptr + tokens, mask=inside, other=float("-inf")).to(tl.float32)
    yt = xt
    if APPLY_TEMPERATURE:
        yt = xt / tl.where(random_row, t, 1.0)  # the reference's rounding
    noisy = yt + _noise(hash32(key ^ TOKEN_KEY), tokens.to(tl.uint32))
    s = tl.where(inside, tl.where(random_row, noisy, xt), float("-inf"))
    token = tl.min(tl.where(s == tl.max(s, 0), tokens, NO_INDEX), 0)
    tl.store(out_ptr + row, token.to(tl.int64))


@triton.jit
def _best_group(part_val_ptr, part_idx_ptr, row, num_chunks, CB: tl.constexpr):
    """The row's best group over its chunks' partials (highest score, lowest group on ties)."""
    best = tl.full([], float("-inf"), tl.float32)
    won = tl.full([], NO_INDEX, tl.int32)
    for c0 in range(0, num_chunks, CB):
        c = c0 + tl.arange(0, CB)
        m = c < num_chunks
        v = tl.load(part_val_ptr + row * num_chunks + c, mask=m, other=float("-inf"))
        i = tl.load(part_idx_ptr + row * num_chunks + c, mask=m, other=NO_INDEX)
        top = tl.max(v, 0)
        cand = tl.min(tl.where(m & (v == top), i, NO_INDEX), 0)
        won = tl.where(top > best, cand, tl.where(top == best, tl.minimum(won, cand), won))
        best = tl.maximum(best, top)
    return won


@triton.jit(do_not_specialize=["num_chunks"])
def _gumbel_kernel(
    logits_ptr,
    row_stride,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    part_val_ptr,
    part_idx_ptr,
    counter_ptr,
    out_ptr,
    vocab,
    chunk,
    num_chunks,
    APPLY_TEMPERATURE: tl.constexpr,
    CB: tl.constexpr,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
):
    """The group race over one row chunk; the row's last chunk to finish (the only one, unsplit) then
    runs the token race in the row's best group."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    t = tl.load(temp_ptr + row)
    random_row = t > 0
    scale = tl.full([], 1.0, tl.float32)
    if APPLY_TEMPERATURE:
        scale = tl.where(random_row, 1.0 / tl.where(random_row, t, 1.0), 1.0)
    key = _row_key(seed_ptr, pos_ptr, row)
    c = scale * LOG2E  # log2(e) / T
    G: tl.constexpr = A * V
    TILE: tl.constexpr = NG * G
    begin = part * chunk
    end = tl.minimum(begin + chunk, vocab)
    lane = tl.arange(0, NG)
    local = (lane[None, :, None] * A + tl.arange(0, A)[:, None, None]) * V + tl.arange(0, V)[None, None, :]
    best = tl.full([NG], float("-inf"), tl.float32)
    best_grp = begin // G + lane
    nxt = tl.load(row_ptr + begin + local, mask=begin + local < end, other=float("-inf"))
    for start in range(begin, end, TILE):  # the next tile is loaded before this one is raced
        x = nxt.to(tl.float32)
        offs = start + TILE + local
        nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
        m = tl.max(tl.max(x, 2), 0)
        # exp((x - m) / T) as exp2(x * c - m * c): one FMA and one exponential per token
        mc = tl.where(m > float("-inf"), m, 0.0) * c
        mass = tl.sum(tl.sum(tl.math.exp2(x * c - mc[None, :, None]), 2), 0)
        grp = start // G + lane
        log_mass = tl.log(tl.where(mass > 0, mass, 1.0))  # an empty group scores -inf through m
        score = tl.where(random_row, m * scale + log_mass + _noise(key, grp.to(tl.uint32)), m)
        better = score > best
        best = tl.where(better, score, best)
        best_grp = tl.where(better, grp, best_grp)
    top = tl.max(best, 0)
    won = tl.min(tl.where(best == top, best_grp, NO_INDEX), 0)
    if num_chunks > 1:
        tl.store(part_val_ptr + row * num_chunks + part, top)
        tl.store(part_idx_ptr + row * num_chunks + part, won)
        if last_chunk(counter_ptr, row, num_chunks):
            won = _best_group(part_val_ptr, part_idx_ptr, row, num_chunks, CB)
            _token_race(row_ptr, row, won, vocab, key, t, out_ptr, APPLY_TEMPERATURE, G)
    else:
        _token_race(row_ptr, row, won, vocab, key, t, out_ptr, APPLY_TEMPERATURE, G)


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
    v = vector(logits.dtype)
    temp = temperature.to(torch.float32)
    chunks, chunk = 1, vocab
    if rows < cores(logits.device):  # H200: 256 x 32000 ran 21.2 µs unsplit, 24.4 split 3 ways
        chunks, chunk = row_split(rows, vocab, GROUPS_PER_TILE * ref.GROUP, logits.device, PER_SM)
    part_val = scratch("gumbel_val", rows * chunks, torch.float32, logits.device)
    part_idx = scratch("gumbel_idx", rows * chunks, torch.int32, logits.device)
    _gumbel_kernel[(rows, chunks)](
        logits,
        logits.stride(0),
        temp,
        seeds,
        positions,
        part_val,
        part_idx,
        counters("gumbel_counter", rows, logits.device),
        out,
        vocab,
        chunk,
        chunks,
        APPLY_TEMPERATURE=apply_temperature,
        CB=COMBINE_BLOCK,
        A=ref.GROUP // v,
        NG=GROUPS_PER_TILE,
        V=v,
        **launch(logits.device, WARPS),
    )
    return out
