"""Triton :func:`vllm_ascend.kernels.gumbel_sample`: the two-level race of :mod:`..gumbel`.

One program per row chunk. A tile is ``[A, NG, V]``: ``NG`` groups of ``GROUP = A * V`` consecutive
tokens, each group held by one thread (``V`` contiguous elements per 16-byte load, ``A`` loads), so
the group's max, its exponential sum and its noise are computed once, by its own thread, without
shuffles or barriers; per token the work is a max, a multiply-add, one exponential and an add.
bfloat16 rows are read as int32 words of two tokens, which widen to float32 with one shift or mask
each (the group's order does not matter to its max and sum). ``PREFETCH`` tiles are in flight while
one is raced (the loop is unrolled by ``PREFETCH``, so no tile is copied between registers). Each
thread keeps its best group score. With one chunk per row the program then runs the token race inside
the row's best group (lowest index on ties) and writes the token; split rows write their chunk's
``(score, group)`` and the row's last program to finish (:func:`.common.last_chunk`) picks the best
group and runs the token race: one launch either way.
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
    ub_cap,
    vector,
)

# H200 sweep of 4/8/16 warps x 2-48 programs per SM: 8 at 4 per SM within 7 % of the best everywhere;
# H100 (2026-12-06): 4 warps ran from 1 % faster to 41 % slower than 8 at B >= 256.
WARPS = 8
GROUPS_PER_TILE = 8 if IS_INTERPRETED else 32 * WARPS  # one group per thread per tile
PER_SM = 4  # batches of fewer rows than multiprocessors: split for this many programs per multiprocessor
#: Tiles in flight while one is raced, per logits dtype: two for 16-bit logits (their tiles take half
#: the registers), one for float32 (two would leave one program per multiprocessor)...
PREFETCH = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 2}
#: ... in row chunks of at least this many tiles: a long stream gains from the deeper pipeline, a short
#: one pays its registers (H100, bf16: 256 x 151936 41.8 µs with two, 43.4 with one; 256 x 32000 14.4
#: with two, 13.8 with one).
DEEP_PREFETCH_TILES = 8
COMBINE_BLOCK = 128
TOKEN_MIX = tl.constexpr(ref.TOKEN_MIX)
TOKEN_KEY = tl.constexpr(ref.TOKEN_KEY)
NO_INDEX = tl.constexpr(2**31 - 1)
NEG_INF_PAIR = tl.constexpr(-8323200)  # the int32 word of two bfloat16 -inf (0xFF80FF80)
LOG2_SPLIT = tl.constexpr(ref.LOG2_SPLIT)
Q0, Q1, Q2, Q3, Q4, Q5, Q6, Q7 = (tl.constexpr(c) for c in ref.LOG2_POLY)


@triton.jit
def _log2(x):
    """:func:`..gumbel.log2_torch`: positive normal float32 ``x`` only."""
    bits = x.to(tl.int32, bitcast=True)
    e = (bits - LOG2_SPLIT) >> 23
    t = (bits - (e << 23)).to(tl.float32, bitcast=True) - 1.0
    q = Q7 * t + Q6
    q = q * t + Q5
    q = q * t + Q4
    q = q * t + Q3
    q = q * t + Q2
    q = q * t + Q1
    q = q * t + Q0
    return e.to(tl.float32) + t * q


@triton.jit
def _noise(key, index):
    """``-log2(-log2(u))`` of ``index`` (uint32) under ``key``; u from 23 hash bits, built from the bits
    (``f = 1 + k / 2**23``, so ``u = (k + 0.5) / 2**23 = (f - 1) + 2**-24`` exactly)."""
    h = hash32(key ^ (index * TOKEN_MIX))
    f = ((h >> 9) | 0x3F800000).to(tl.float32, bitcast=True)  # tensor first: triton-ascend needs it
    return -_log2(-_log2((f - 1.0) + 1.0 / 16777216.0))


@triton.jit
def _row_key(seed_ptr, pos_ptr, row):
    """The row's 32-bit key from its int64 seed and position (see :mod:`..gumbel`)."""
    seed = tl.load(seed_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    key = hash32(hash32((seed & 0xFFFFFFFF).to(tl.uint32)) ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    return hash32(key ^ (pos & 0xFFFFFFFF).to(tl.uint32))


@triton.jit
def _token_race(row_ptr, row, won, vocab, key, t, c, out_ptr, G: tl.constexpr):
    """Write the row's drawn token: the token race inside group ``won`` (greedy rows: its first
    largest logit)."""
    tokens = won * G + tl.arange(0, G)
    inside = tokens < vocab
    xt = tl.load(row_ptr + tokens, mask=inside, other=float("-inf")).to(tl.float32)
    noisy = xt * c + _noise(hash32(key ^ TOKEN_KEY), tokens.to(tl.uint32))
    s = tl.where(inside, tl.where(t > 0, noisy, xt), float("-inf"))
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


@triton.jit
def _load_tile(tile_ptr, offs, end, WORDS: tl.constexpr):
    """A tile at element offsets ``offs`` (words of two tokens with ``WORDS``), ``-inf`` past ``end``."""
    if WORDS:
        return tl.load(tile_ptr + offs, mask=offs < end, other=NEG_INF_PAIR)
    else:
        return tl.load(tile_ptr + offs, mask=offs < end, other=float("-inf"))


@triton.jit
def _mass(x, mc, c):
    """Each group's ``sum(2^(x * c - m * c))`` over a ``[A, NG, V]`` float32 tile."""
    return tl.sum(tl.sum(tl.math.exp2(x * c - mc[None, :, None]), 2), 0)


@triton.jit
def _group_scores(tile, grp, c, key, random_row, WORDS: tl.constexpr):
    """The group race's scores of one tile (greedy rows: each group's max)."""
    if WORDS:
        lo = (tile << 16).to(tl.float32, bitcast=True)
        hi = (tile & -65536).to(tl.float32, bitcast=True)
        m = tl.maximum(tl.max(tl.max(lo, 2), 0), tl.max(tl.max(hi, 2), 0))
        mc = tl.where(m > float("-inf"), m, 0.0) * c
        mass = _mass(lo, mc, c) + _mass(hi, mc, c)
    else:
        x = tile.to(tl.float32)
        m = tl.max(tl.max(x, 2), 0)
        mc = tl.where(m > float("-inf"), m, 0.0) * c
        mass = _mass(x, mc, c)
    log_mass = _log2(tl.where(mass > 0, mass, 1.0))  # an empty group scores -inf through m
    return tl.where(random_row, m * c + log_mass + _noise(key, grp.to(tl.uint32)), m)


@triton.jit(do_not_specialize=["num_chunks"])
def _gumbel_kernel(
    logits_ptr,
    row_stride,
    tile_ptr,
    tile_stride,
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
    WORDS: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """The group race over one row chunk; the row's last chunk to finish (the only one, unsplit) then
    runs the token race in the row's best group. ``tile_ptr`` is the row data the group race reads:
    the logits, or with ``WORDS`` the same bytes as int32 words (``V`` words per load, ``2 V`` tokens)."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    tiles_ptr = tile_ptr + row.to(tl.int64) * tile_stride
    t = tl.load(temp_ptr + row)
    random_row = t > 0
    scale = tl.full([], 1.0, tl.float32)
    if APPLY_TEMPERATURE:
        scale = tl.where(random_row, 1.0 / tl.where(random_row, t, 1.0), 1.0)
    key = _row_key(seed_ptr, pos_ptr, row)
    c = scale * LOG2E  # log2(e) / T: exp(x / T) = 2^(x * c)
    W: tl.constexpr = 2 if WORDS else 1  # tokens per element of the tile
    G: tl.constexpr = A * V * W
    TILE: tl.constexpr = NG * A * V  # elements (words with WORDS) per tile
    begin = part * chunk // W
    end = tl.minimum(part * chunk + chunk, vocab) // W
    lane = tl.arange(0, NG)
    local = (lane[None, :, None] * A + tl.arange(0, A)[:, None, None]) * V + tl.arange(0, V)[None, None, :]
    best = tl.full([NG], float("-inf"), tl.float32)
    best_grp = begin // (A * V) + lane
    nxt = _load_tile(tiles_ptr, begin + local, end, WORDS)
    if PREFETCH == 2:
        nxt2 = _load_tile(tiles_ptr, begin + TILE + local, end, WORDS)
    STEP: tl.constexpr = TILE * PREFETCH
    # Unrolled by PREFETCH, each buffer reloaded once raced (no register moves): PREFETCH tiles in flight.
    for start in range(begin, end, STEP):
        tile = nxt
        nxt = _load_tile(tiles_ptr, start + STEP + local, end, WORDS)
        grp = start // (A * V) + lane
        score = _group_scores(tile, grp, c, key, random_row, WORDS)
        better = score > best
        best = tl.where(better, score, best)
        best_grp = tl.where(better, grp, best_grp)
        if PREFETCH == 2:
            tile = nxt2
            nxt2 = _load_tile(tiles_ptr, start + TILE + STEP + local, end, WORDS)
            if start + TILE < end:
                grp = (start + TILE) // (A * V) + lane
                score = _group_scores(tile, grp, c, key, random_row, WORDS)
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
            _token_race(row_ptr, row, won, vocab, key, t, c, out_ptr, G)
    else:
        _token_race(row_ptr, row, won, vocab, key, t, c, out_ptr, G)


def _as_words(logits: torch.Tensor) -> torch.Tensor | None:
    """bfloat16 logits as int32 words of two tokens (the same bytes), when every row starts on a word."""
    if logits.dtype != torch.bfloat16 or logits.shape[1] % 2 or logits.stride(0) % 2:
        return None
    if logits.storage_offset() % 2 or logits.data_ptr() % 4:
        return None
    return logits.view(torch.int32)


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
    words = _as_words(logits)
    tiles = logits if words is None else words
    per_element = 1 if words is None else 2  # tokens per tile element
    v = vector(tiles.dtype)
    ng = ub_cap(logits.device, GROUPS_PER_TILE * ref.GROUP, live_tiles=2 + max(PREFETCH.values()))
    ng //= ref.GROUP
    temp = temperature.to(torch.float32)
    chunks, chunk = 1, vocab
    # Batches of one row per multiprocessor and more run unsplit (H200: 256 x 32000 ran 21.2 µs unsplit,
    # 24.4 split 3 ways; H100: 256-row batches split in 2 ran 18-32 % slower than unsplit).
    if rows < cores(logits.device):
        chunks, chunk = row_split(rows, vocab, ng * ref.GROUP, logits.device, PER_SM)
    prefetch = PREFETCH[logits.dtype] if chunk >= DEEP_PREFETCH_TILES * ng * ref.GROUP else 1
    part_val = scratch("gumbel_val", rows * chunks, torch.float32, logits.device)
    part_idx = scratch("gumbel_idx", rows * chunks, torch.int32, logits.device)
    _gumbel_kernel[(rows, chunks)](
        logits,
        logits.stride(0),
        tiles,
        tiles.stride(0),
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
        A=ref.GROUP // (v * per_element),
        NG=ng,
        V=v,
        WORDS=words is not None,
        PREFETCH=prefetch,
        **launch(logits.device, WARPS),
    )
    return out
