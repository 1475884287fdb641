"""Triton :func:`vllm_ascend.kernels.apply_top_k_top_p`: thresholds found while the logits stream.

The kept set of a row is ``{x >= t}``. Every launch walks the rows in slot tiles (``[A, NG, V]``,
:func:`.common.slots`: slot ``g`` is one thread's ``A`` vectors of ``V`` elements), rows split into
chunks of whole tiles when the batch is small. A *unit* is one slot of one tile; the summary stores
each unit's max, and the mask launch reads only the units that reach ``t`` (it writes every one).

A row is served by what its ``k`` and ``p`` ask for:

* top-k (``0 < k < V``, ``k <= KCAP``), with or without top-p: the summary fills a candidate buffer
  per program (:mod:`.candidates`), so the row's last program has every element ``>= t_k`` at hand
  and finds ``t_k`` and then top-p over what it keeps exactly. The row is read once before the mask.
* top-p alone: the kept set can be a quarter of the row, beyond any buffer. Every program of the
  row reads the row's first tile as a sample, estimates the threshold and its standard error from it
  and places ``PIVOTS`` pivots around the estimate (:func:`_sample_pivots`: the same pivots in every
  program of the row); the summary adds up the mass of ``{x >= pivot}`` for each while it streams.
  The collect launch copies the elements of the bracket holding ``t`` (only units whose max reaches
  it are read) and the row's last program searches them exactly, the mass above the bracket as a
  base. A bracket too large to copy (the estimate missed) gets one round of pivots inside it instead
  and is copied by the same kernel's second stage.
* a larger ``k``, a buffer that overflowed (massive ties), pivots that cannot measure the row (a
  sample far below the row's max): the row's last program searches the whole row
  (:func:`.threshold_search._select`).

So a typical row is read once (top-k) or about one and a half times (top-p) and written once. Masses
are float32 sums of ``exp(x - ref)``, so a top-p threshold can differ from a float64 sort where the
cumulative mass is within rounding of ``p``. Scratch buffers are cached per device and shared:
calls must not run concurrently on two streams of one device.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels._triton import candidates as C
from vllm_ascend.kernels._triton import threshold_search as S
from vllm_ascend.kernels._triton.common import (
    IS_INTERPRETED,
    check_logits,
    counters,
    last_chunk,
    row_split,
    scratch,
    slots,
    ub_cap,
    vector,
)

KCAP = 16 if IS_INTERPRETED else 256  # the largest k served by the streaming candidate buffer
BUF = 64 if IS_INTERPRETED else 1024  # candidate buffer per program (entries)
CAP = 64 if IS_INTERPRETED else 16384  # copied bracket per program of a top-p row (entries)
PIVOTS = 8  # summary pivots of a top-p row
SPREAD = 2.0  # pivot spacing, in standard errors of the sample's threshold (outer ones 3.5x, 7.5x)
SAMPLE_PIVOTS = 8
SAMPLE_PASSES = 4
SAMPLE_RANGE = 40.0  # the sample's threshold is searched within this far below its max
CLAMP = 80.0  # exp(x - ref) is clamped here: a row whose max exceeds ref by more is searched whole
BOUND_PIVOTS = 16
BOUND_PASSES = 2
UNIT = 8  # elements per unit (A * V): the granularity the mask and the bracket copy skip by
WARPS = 4  # small programs: several fit a multiprocessor, so one's search overlaps the others' streaming
PER_SM = 4  # split rows for this many programs per multiprocessor
MAX_REGISTERS = 128  # per thread (CUDA): four 4-warp programs fit a multiprocessor's registers
MIN_CHUNK_TILES = 1 if IS_INTERPRETED else 8  # a split row's chunks: the last program merges one list each
CHUNK_BLOCK = 64  # chunk partials a row's program reads at once
LIVE_TILES = 4 + PIVOTS  # fp32 tiles the summary holds at once (its pivot masses per lane): UB bound


class Layout(NamedTuple):
    """Slot tiles and row split of one call (the same for every launch of it)."""

    a: int
    ng: int
    v: int
    warps: int
    chunks: int
    chunk: int
    n_units: int  # units per row (tiles * ng)

    @property
    def tile(self) -> int:
        return self.a * self.ng * self.v

    @property
    def shape(self) -> dict[str, int]:
        return dict(A=self.a, NG=self.ng, V=self.v)


def layout(rows: int, vocab: int, dtype: torch.dtype, device: torch.device) -> Layout:
    """``UNIT``-element units, one slot per thread (8 under the interpreter), tiles bounded by the UB
    on Ascend; rows split so that ``PER_SM`` programs per multiprocessor stream when the batch is small,
    in chunks of at least ``MIN_CHUNK_TILES`` tiles."""
    v = vector(dtype)
    ng = 8 if IS_INTERPRETED else 32 * WARPS
    a = max(1, UNIT // v)
    bound = ub_cap(device, a * ng * v, LIVE_TILES)
    while a * ng * v > bound and a > 1:
        a //= 2
    while a * ng * v > bound and ng > 1:
        ng //= 2
    tile = a * ng * v
    chunks, chunk = row_split(rows, vocab, MIN_CHUNK_TILES * tile, device, PER_SM)
    return Layout(a, ng, v, WARPS, chunks, chunk, triton.cdiv(vocab, tile) * ng)


def launch_kwargs(device: torch.device, warps: int) -> dict[str, int]:
    """Launch kwargs of the streaming kernels: ``warps`` and, on CUDA, at most ``MAX_REGISTERS`` per
    thread (a row's search code, run once per row, would otherwise claim registers that keep
    programs, and so the overlap of one's search with the others' streaming, off the multiprocessor)."""
    kw = launch(device, warps)
    return {**kw, "maxnreg": MAX_REGISTERS} if "num_warps" in kw else kw


def search_constexprs(warps: int) -> dict[str, int]:
    """Tiles and pivots of the exact searches a row's last program runs (one candidate per lane in
    the short tier, so no register spills)."""
    lanes = 32 if IS_INTERPRETED else 32 * warps
    return dict(
        S_NP=S.NUM_PIVOTS,
        BLOCK=128 if IS_INTERPRETED else 4 * lanes,
        NP_C=S.SCRATCH_PIVOTS,
        EXACT_BLOCK=lanes,
        WIDE=32 if IS_INTERPRETED else 4096,
        MAX_PASSES=S.MAX_PASSES,
    )


@triton.jit
def _params(k_ptr, p_ptr, row, vocab, HAS_K: tl.constexpr, HAS_P: tl.constexpr):
    """``(k, p, top-k on, top-p alone)`` of a row (``k = 0`` / ``p = 1`` when absent)."""
    k = tl.zeros([], tl.int32)
    p = tl.full([], 1.0, tl.float32)
    if HAS_K:
        k = tl.load(k_ptr + row).to(tl.int32)
    if HAS_P:
        p = tl.load(p_ptr + row).to(tl.float32)
    k_on = (k > 0) & (k < vocab)
    return k, p, k_on, (p < 1.0) & (k_on == 0)


@triton.jit
def _sample_pivots(
    row_ptr,
    vocab,
    p,
    T: tl.constexpr,
    NP: tl.constexpr,
    SNP: tl.constexpr,
    PASSES: tl.constexpr,
    RANGE: tl.constexpr,
    SPREAD: tl.constexpr,
):
    """``NP`` ascending pivots around the top-p threshold of the row's first ``T`` elements, and the
    sample's max (the reference of the masses). The sample's threshold ``ts`` is searched to
    ``RANGE / SNP**PASSES``; its standard error is taken as ``sd / sqrt(K + 1)`` (``sd``: the
    sample's standard deviation weighted by probability, ``K``: how many it keeps), and the pivots
    sit at ``ts ± SPREAD * err * (0.5, 1.5, 3.5, 7.5, ...)``."""
    offs = tl.arange(0, T)[None, :]
    x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
    ms = tl.max(tl.max(x, 1), 0)
    ref = tl.where(ms > float("-inf"), ms, 0.0)
    e = tl.exp(x - ref)
    z = tl.sum(tl.sum(e, 1), 0)
    target = p * z
    idx = tl.arange(0, SNP)
    lo = ref - RANGE
    top = ref
    for _ in tl.static_range(PASSES):
        piv = S._pivots(lo, top, SNP)
        mass = tl.sum(tl.where(x >= piv[:, None], e, 0.0), 1)
        j = tl.sum((mass >= target).to(tl.int32), 0)
        lo = tl.where(j == 0, lo, S._take(piv, idx, j - 1, 0.0))
        top = tl.where(j == SNP, top, S._take(piv, idx, j, 0.0))
    kept = tl.sum(tl.sum((x >= lo).to(tl.float32), 1), 0)
    d = tl.where(x > float("-inf"), x - lo, 0.0)
    mean = tl.sum(tl.sum(d * e, 1), 0) / z
    var = tl.maximum(tl.sum(tl.sum(d * d * e, 1), 0) / z - mean * mean, 0.0)
    step = tl.maximum(SPREAD * tl.sqrt(var / (kept + 1.0)), 1e-6 * (tl.abs(lo) + 1.0))
    i = tl.arange(0, NP)
    half = NP // 2
    h = tl.where(i < half, half - 1 - i, i - half).to(tl.float32)
    off = tl.where(i < half, -1.0, 1.0) * (tl.exp2(h) - 0.5)
    return lo + step * off, ms


@triton.jit
def _summary_top_p(
    row_ptr,
    r64,
    c,
    begin,
    end,
    vocab,
    p,
    n_chunks,
    umax_ptr,
    chunk_max_ptr,
    piv_ptr,
    ref_ptr,
    part_ptr,
    z_ptr,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
    NP: tl.constexpr,
    SAMPLE_NP: tl.constexpr,
    SAMPLE_PASSES: tl.constexpr,
    SAMPLE_RANGE: tl.constexpr,
    SPREAD: tl.constexpr,
    CLAMP: tl.constexpr,
):
    """Unit maxima, the chunk's max, and the mass of ``{x >= pivot}`` (and of the whole chunk) for the
    row's sample pivots, relative to the sample's max; program 0 of the row stores the pivots."""
    TILE: tl.constexpr = A * NG * V
    piv, ref = _sample_pivots(row_ptr, vocab, p, TILE, NP, SAMPLE_NP, SAMPLE_PASSES, SAMPLE_RANGE, SPREAD)
    i = tl.arange(0, NP)
    if c == 0:
        tl.store(piv_ptr + r64 * NP + i, piv)
        tl.store(ref_ptr + r64, ref)
    pv = piv[:, None, None, None]
    local = slots(A, NG, V)
    g = tl.arange(0, NG)
    acc = tl.zeros([NP, A, NG, V], tl.float32)
    zr = tl.zeros([A, NG, V], tl.float32)
    smax = tl.full([NG], float("-inf"), tl.float32)
    nxt = tl.load(row_ptr + begin + local, mask=begin + local < end, other=float("-inf"))
    for start in range(begin, end, TILE):
        x = nxt.to(tl.float32)
        offs = start + TILE + local
        nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
        umax = tl.max(tl.max(x, 2), 0)
        tl.store(umax_ptr + (start // TILE) * NG + g, umax.to(umax_ptr.dtype.element_ty))
        smax = tl.maximum(smax, umax)
        e = tl.exp(tl.minimum(x - ref, CLAMP))
        zr += e
        acc += (x[None] >= pv).to(tl.float32) * e[None]  # a set and a fused multiply-add per pivot
    tl.store(part_ptr + (r64 * n_chunks + c) * NP + i, tl.sum(tl.sum(tl.sum(acc, 3), 1), 1))
    tl.store(z_ptr + r64 * n_chunks + c, tl.sum(tl.sum(tl.sum(zr, 2), 0), 0))
    tl.store(chunk_max_ptr + r64 * n_chunks + c, tl.max(smax, 0))


@triton.jit
def _row_min_count(row_ptr, vocab, BLOCK: tl.constexpr):
    """Smallest finite element of a row and how many are finite (for the whole-row search)."""
    lane_min = tl.full([BLOCK], float("inf"), tl.float32)
    lane_cnt = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        ok = x > float("-inf")
        lane_min = tl.minimum(lane_min, tl.where(ok, x, float("inf")))
        lane_cnt += ok.to(tl.int32)
    return tl.min(lane_min, 0), tl.sum(lane_cnt, 0)


@triton.jit
def _whole_row(
    row_ptr,
    vocab,
    k,
    p,
    row_max,
    region,
    cap,
    HAS_K: tl.constexpr,
    HAS_P: tl.constexpr,
    S_NP: tl.constexpr,
    BLOCK: tl.constexpr,
    NP_C: tl.constexpr,
    EXACT_BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """The threshold of a row by one program over the whole row (top-k, then top-p over what it
    keeps); ``region``: ``cap`` entries of float32 scratch (used in the row's dtype)."""
    region = region.to(row_ptr.dtype)
    lo, finite = _row_min_count(row_ptr, vocab, BLOCK)
    t = tl.full([], float("-inf"), tl.float32)
    count = finite
    if HAS_K:
        if (k > 0) & (k < finite):
            t, count = S._select(
                row_ptr, vocab, region, cap, lo, finite, row_max, float("-inf"), k, 0.0, False,
                S_NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
            )  # fmt: skip
    if HAS_P:
        if (p < 1.0) & (finite > 0):
            lo = tl.maximum(t, lo)
            kept = S._pivot_pass(
                row_ptr, vocab, S._pivots(lo, row_max, S_NP), row_max, t, lo, True, S_NP, BLOCK, False
            )[2]
            t = S._select(
                row_ptr, vocab, region, cap, lo, count, row_max, t, 0, p * kept, True,
                S_NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
            )[0]  # fmt: skip
    return t


@triton.jit
def _finish_top_k(
    row_ptr,
    vocab,
    k,
    p,
    row_max,
    base,
    count_ptr,
    n_chunks,
    HAS_P: tl.constexpr,
    KCAP: tl.constexpr,
    BUF: tl.constexpr,
    S_NP: tl.constexpr,
    BLOCK: tl.constexpr,
    NP_C: tl.constexpr,
    EXACT_BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """The threshold of a top-k row from its chunks' candidate buffers (``base``: the row's
    ``n_chunks * BUF`` entries): ``t_k``, then top-p over ``{x >= t_k}``; the whole row when ``k``
    exceeds the buffer or a buffer overflowed."""
    n, ovf, vmin, vmax = C._merge(base, base, count_ptr, n_chunks, BUF, False, BUF)
    t = tl.full([], float("-inf"), tl.float32)
    if (ovf != 0) | (k > KCAP):
        t = _whole_row(
            row_ptr, vocab, k, p, row_max, base, n_chunks * BUF, True, HAS_P,
            S_NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
        )  # fmt: skip
    else:
        if n >= k:  # fewer finite elements than k: top-k keeps them all
            t = S._exact(
                base, n, vmin, vmax, n, row_max, float("-inf"), 0, 0.0, k, 0.0, False,
                S_NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
            )[0]  # fmt: skip
        if HAS_P:
            if (p < 1.0) & (n > 0):
                lo = tl.maximum(t, vmin)
                kept = S._pivot_pass(
                    base, n, S._pivots(lo, vmax, S_NP), row_max, t, lo, True, S_NP, BLOCK, False
                )[2]
                t = S._exact(
                    base, n, lo, vmax, n, row_max, t, 0, 0.0, 0, p * kept, True,
                    S_NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
                )[0]  # fmt: skip
    return t


@triton.jit(do_not_specialize=["chunk", "n_chunks", "n_units"])
def _summary_kernel(
    logits_ptr,
    row_stride,
    k_ptr,
    p_ptr,
    vocab,
    chunk,
    n_chunks,
    n_units,
    maxima_ptr,
    chunk_max_ptr,
    count_ptr,
    cand_ptr,
    piv_ptr,
    ref_ptr,
    part_ptr,
    z_ptr,
    threshold_ptr,
    counter_ptr,
    HAS_K: tl.constexpr,
    HAS_P: tl.constexpr,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
    KCAP: tl.constexpr,
    BUF: tl.constexpr,
    NP: tl.constexpr,
    BOUND_NP: tl.constexpr,
    BOUND_PASSES: tl.constexpr,
    SAMPLE_NP: tl.constexpr,
    SAMPLE_PASSES: tl.constexpr,
    SAMPLE_RANGE: tl.constexpr,
    SPREAD: tl.constexpr,
    CLAMP: tl.constexpr,
    CB: tl.constexpr,
    S_NP: tl.constexpr,
    BLOCK: tl.constexpr,
    NP_C: tl.constexpr,
    EXACT_BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """One chunk of a row: unit maxima and the chunk's max; the candidate buffer (top-k rows, whose
    last program then stores the threshold) or the pivot masses (top-p rows); rows with neither
    store ``-inf``."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    r64 = row.to(tl.int64)
    row_ptr = logits_ptr + r64 * row_stride
    TILE: tl.constexpr = A * NG * V
    begin = c * chunk
    end = tl.minimum(begin + chunk, vocab)
    umax_ptr = maxima_ptr + r64 * n_units
    k, p, k_on, p_alone = _params(k_ptr, p_ptr, row, vocab, HAS_K, HAS_P)
    if HAS_P:
        if p_alone:
            _summary_top_p(
                row_ptr, r64, c, begin, end, vocab, p, n_chunks, umax_ptr, chunk_max_ptr, piv_ptr, ref_ptr,
                part_ptr, z_ptr, A, NG, V, NP, SAMPLE_NP, SAMPLE_PASSES, SAMPLE_RANGE, SPREAD, CLAMP,
            )  # fmt: skip
    if HAS_K:
        if k_on:
            region = cand_ptr + (r64 * n_chunks + c) * BUF
            local = slots(A, NG, V)
            g = tl.arange(0, NG)
            buffered = k <= KCAP
            thr = tl.full([], float("inf"), tl.float32)  # rows above KCAP collect nothing
            cnt = tl.zeros([], tl.int32)
            ovf = tl.zeros([], tl.int32)
            smax = tl.full([NG], float("-inf"), tl.float32)
            nxt = tl.load(row_ptr + begin + local, mask=begin + local < end, other=float("-inf"))
            for start in range(begin, end, TILE):
                x = nxt.to(tl.float32)
                offs = start + TILE + local
                nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
                umax = tl.max(tl.max(x, 2), 0)
                tl.store(umax_ptr + (start // TILE) * NG + g, umax.to(umax_ptr.dtype.element_ty))
                smax = tl.maximum(smax, umax)
                if buffered:
                    cnt, thr, ovf = C._take_tile(
                        region, region, cnt, thr, ovf, x, x, umax, k, start == begin, False, BUF,
                        BOUND_NP, BOUND_PASSES, S_NP, EXACT_BLOCK, MAX_PASSES,
                    )  # fmt: skip
            if buffered & (ovf == 0) & (cnt > k) & (n_chunks > 1):  # one row program: its search does it
                cnt = C._compact(region, region, cnt, k, False, BUF, S_NP, EXACT_BLOCK, MAX_PASSES)[1]
            tl.store(count_ptr + r64 * n_chunks + c, tl.where(ovf != 0, -1, cnt))
            tl.store(chunk_max_ptr + r64 * n_chunks + c, tl.max(smax, 0))
            last = n_chunks == 1
            if n_chunks > 1:
                last = last_chunk(counter_ptr, row, n_chunks)
            if last:
                row_max = _max_chunks(chunk_max_ptr + r64 * n_chunks, n_chunks, CB)
                t = _finish_top_k(
                    row_ptr, vocab, k, p, row_max, cand_ptr + r64 * n_chunks * BUF, count_ptr + r64 * n_chunks,
                    n_chunks, HAS_P, KCAP, BUF, S_NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
                )  # fmt: skip
                tl.store(threshold_ptr + row, t)
    if (k_on == 0) & (p_alone == 0) & (c == 0):
        tl.store(threshold_ptr + row, float("-inf"))


@triton.jit
def _sum_chunks(ptr, n_chunks, N: tl.constexpr, CB: tl.constexpr):
    """``sum over c < n_chunks of ptr[c * N + j]`` for ``j < N``."""
    j = tl.arange(0, N)
    ci = tl.arange(0, CB)
    total = tl.zeros([N], tl.float32)
    for c0 in range(0, n_chunks, CB):
        at = ptr + (c0 + ci[:, None]) * N + j[None, :]
        total += tl.sum(tl.load(at, mask=(c0 + ci < n_chunks)[:, None], other=0.0), 0)
    return total


@triton.jit
def _sum_z(ptr, n_chunks, CB: tl.constexpr):
    ci = tl.arange(0, CB)
    total = tl.zeros([], tl.float32)
    for c0 in range(0, n_chunks, CB):
        total += tl.sum(tl.load(ptr + c0 + ci, mask=c0 + ci < n_chunks, other=0.0), 0)
    return total


@triton.jit
def _max_chunks(ptr, n_chunks, CB: tl.constexpr):
    ci = tl.arange(0, CB)
    m = tl.full([], float("-inf"), tl.float32)
    for c0 in range(0, n_chunks, CB):
        m = tl.maximum(m, tl.max(tl.load(ptr + c0 + ci, mask=c0 + ci < n_chunks, other=float("-inf")), 0))
    return m


@triton.jit
def _bracket(piv, masses, target, z, ref, p, vocab, NP: tl.constexpr):
    """From the masses of ``{x >= piv_j}``: ``(lo, hi, mass >= hi, mass >= lo)`` with ``t`` in
    ``[lo, hi)``; below the first pivot ``lo`` is the tail bound, above the last ``hi`` is ``inf``."""
    idx = tl.arange(0, NP)
    j = tl.sum((masses >= target).to(tl.int32), 0)
    tail = tl.minimum(S._tail_bound(ref, z, vocab + tl.zeros([], tl.int32), p), tl.min(piv, 0))
    lo = tl.where(j == 0, tail, S._take(piv, idx, j - 1, 0.0))
    hi = tl.where(j == NP, float("inf"), S._take(piv, idx, j, 0.0))
    base = tl.where(j == NP, 0.0, S._take(masses, idx, j, 0.0))
    mass_lo = tl.where(j == 0, z, S._take(masses, idx, j - 1, 0.0))
    return lo, hi, base, mass_lo


@triton.jit
def _units(umax_ptr, t, n_units, lo, NG: tl.constexpr):
    """Whether each slot's unit of tile ``t`` reaches ``lo`` (its max; units past the row: no)."""
    u = t * NG + tl.arange(0, NG)
    return tl.load(umax_ptr + u, mask=u < n_units, other=float("-inf")).to(tl.float32) >= lo


@triton.jit
def _copy_bracket(
    row_ptr,
    umax_ptr,
    begin,
    end,
    n_units,
    lo,
    hi,
    region,
    cap,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
):
    """Copy the chunk's elements in ``[lo, hi)`` to ``region``, reading only units whose max reaches
    ``lo`` (the next tile's maxima and elements are loaded before this tile is taken); returns how
    many, ``-1`` past ``cap``."""
    TILE: tl.constexpr = A * NG * V
    local = slots(A, NG, V)
    n = tl.zeros([], tl.int32)
    sel = _units(umax_ptr, begin // TILE, n_units, lo, NG)
    nxt = tl.load(
        row_ptr + begin + local, mask=(begin + local < end) & sel[None, :, None], other=float("-inf")
    )
    sel_nxt = _units(umax_ptr, begin // TILE + 1, n_units, lo, NG)
    for start in range(begin, end, TILE):
        x = nxt.to(tl.float32)
        cur = sel
        offs = start + TILE + local
        nxt = tl.load(row_ptr + offs, mask=(offs < end) & sel_nxt[None, :, None], other=float("-inf"))
        sel = sel_nxt
        sel_nxt = _units(umax_ptr, start // TILE + 2, n_units, lo, NG)
        if (tl.max(cur.to(tl.int32), 0) > 0) & (n >= 0):
            hits = (x >= lo) & (x < hi)
            n_hits = tl.sum(tl.sum(tl.sum(hits.to(tl.int32), 2), 0), 0)
            if n + n_hits > cap:
                n = tl.full([], -1, tl.int32)
            else:
                n = C._append(region, region, n, x, hits, x, False)
    return n


@triton.jit
def _round(
    row_ptr,
    umax_ptr,
    begin,
    end,
    n_units,
    lo,
    piv,
    ref,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
    NP: tl.constexpr,
    CLAMP: tl.constexpr,
):
    """The chunk's mass of ``{x >= piv_j}`` (all pivots ``>= lo``; units below ``lo`` are not read)."""
    TILE: tl.constexpr = A * NG * V
    local = slots(A, NG, V)
    pv = piv[:, None, None, None]
    acc = tl.zeros([NP, A, NG, V], tl.float32)
    for start in range(begin, end, TILE):
        sel = _units(umax_ptr, start // TILE, n_units, lo, NG)
        offs = start + local
        x = tl.load(row_ptr + offs, mask=(offs < end) & sel[None, :, None], other=float("-inf")).to(
            tl.float32
        )
        e = tl.exp(tl.minimum(x - ref, CLAMP))
        acc += (x[None] >= pv).to(tl.float32) * e[None]
    return tl.sum(tl.sum(tl.sum(acc, 3), 1), 1)


@triton.jit(do_not_specialize=["chunk", "n_chunks", "n_units"])
def _collect_kernel(
    logits_ptr,
    row_stride,
    k_ptr,
    p_ptr,
    vocab,
    chunk,
    n_chunks,
    n_units,
    maxima_ptr,
    chunk_max_ptr,
    piv_ptr,
    ref_ptr,
    part_ptr,
    z_ptr,
    round_ptr,
    cand_ptr,
    count_ptr,
    threshold_ptr,
    counter_ptr,
    HAS_K: tl.constexpr,
    STAGE: tl.constexpr,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
    NP: tl.constexpr,
    CAP: tl.constexpr,
    CLAMP: tl.constexpr,
    CB: tl.constexpr,
    S_NP: tl.constexpr,
    BLOCK: tl.constexpr,
    NP_C: tl.constexpr,
    EXACT_BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """Top-p rows. Stage 1: the bracket of the summary's pivots holding ``t``; copy it when its
    elements fit ``CAP`` (their mass bounds their count), else one round of pivots inside it. Stage 2,
    rows that took the round: copy the round's bracket. The row's last program of the stage that
    copied searches the copy exactly; rows the pivots cannot measure are searched whole."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    r64 = row.to(tl.int64)
    row_ptr = logits_ptr + r64 * row_stride
    k, p, _k_on, p_alone = _params(k_ptr, p_ptr, row, vocab, HAS_K, True)
    if p_alone:
        begin = c * chunk
        end = tl.minimum(begin + chunk, vocab)
        umax_ptr = maxima_ptr + r64 * n_units
        row_max = _max_chunks(chunk_max_ptr + r64 * n_chunks, n_chunks, CB)
        i = tl.arange(0, NP)
        piv = tl.load(piv_ptr + r64 * NP + i)
        ref = tl.load(ref_ptr + r64)
        masses = _sum_chunks(part_ptr + r64 * n_chunks * NP, n_chunks, NP, CB)
        z = _sum_z(z_ptr + r64 * n_chunks, n_chunks, CB)
        valid = (row_max <= ref + CLAMP) & (z > 0.0)
        target = p * z
        lo, hi, base, mass_lo = _bracket(piv, masses, target, z, ref, p, vocab, NP)
        direct = valid & (mass_lo - base <= CAP * tl.exp(lo - ref))
        region = cand_ptr + (r64 * n_chunks + c) * CAP
        rounds = round_ptr + r64 * n_chunks * NP
        if STAGE == 1:
            if direct:
                n = _copy_bracket(row_ptr, umax_ptr, begin, end, n_units, lo, hi, region, CAP, A, NG, V)
                tl.store(count_ptr + r64 * n_chunks + c, n)
            elif valid:
                piv2 = S._pivots(lo, tl.minimum(hi, row_max), NP)
                masses2 = _round(row_ptr, umax_ptr, begin, end, n_units, lo, piv2, ref, A, NG, V, NP, CLAMP)
                tl.store(rounds + c * NP + i, masses2)
            finishes = direct | (valid == 0)
        else:
            finishes = valid & (direct == 0)
            if finishes:  # the round's bracket inside the summary's
                piv2 = S._pivots(lo, tl.minimum(hi, row_max), NP)
                masses2 = _sum_chunks(rounds, n_chunks, NP, CB)
                j = tl.sum((masses2 >= target).to(tl.int32), 0)
                lo = tl.where(j == 0, lo, S._take(piv2, i, j - 1, 0.0))
                base = tl.where(j == NP, base, S._take(masses2, i, j, 0.0))
                hi = tl.where(j == NP, hi, S._take(piv2, i, j, 0.0))
                n = _copy_bracket(row_ptr, umax_ptr, begin, end, n_units, lo, hi, region, CAP, A, NG, V)
                tl.store(count_ptr + r64 * n_chunks + c, n)
        if finishes:
            last = n_chunks == 1
            if n_chunks > 1:
                last = last_chunk(counter_ptr, row, n_chunks)
            if last:
                base_v = cand_ptr + r64 * n_chunks * CAP
                t = tl.full([], float("-inf"), tl.float32)
                copied = valid
                if valid:
                    n, ovf, _vmin, vmax = C._merge(
                        base_v, base_v, count_ptr + r64 * n_chunks, n_chunks, CAP, False, BLOCK
                    )
                    copied = (ovf == 0) & (n > 0)
                    if copied:
                        t = S._exact(
                            base_v, n, lo, tl.minimum(hi, vmax), n, ref, float("-inf"), 0, base, 0, target, True,
                            S_NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
                        )[0]  # fmt: skip
                if copied == 0:
                    t = _whole_row(
                        row_ptr, vocab, k, p, row_max, base_v, n_chunks * CAP, False, True,
                        S_NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
                    )  # fmt: skip
                tl.store(threshold_ptr + row, t)


@triton.jit(do_not_specialize=["chunk", "n_units"])
def _mask_kernel(
    logits_ptr,
    row_stride,
    vocab,
    chunk,
    n_units,
    maxima_ptr,
    threshold_ptr,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
):
    """Write ``-inf`` below the row's threshold; units whose max is below it are written unread
    (the next tile's maxima and kept units are loaded before this tile is written)."""
    row = tl.program_id(0)
    t = tl.load(threshold_ptr + row)
    if t > float("-inf"):
        TILE: tl.constexpr = A * NG * V
        r64 = row.to(tl.int64)
        row_ptr = logits_ptr + r64 * row_stride
        umax_ptr = maxima_ptr + r64 * n_units
        local = slots(A, NG, V)
        begin = tl.program_id(1) * chunk
        end = tl.minimum(begin + chunk, vocab)
        sel = _units(umax_ptr, begin // TILE, n_units, t, NG)
        nxt = tl.load(
            row_ptr + begin + local, mask=(begin + local < end) & sel[None, :, None], other=float("-inf")
        )
        for start in range(begin, end, TILE):
            x = nxt.to(tl.float32)
            offs = start + local
            sel = _units(umax_ptr, start // TILE + 1, n_units, t, NG)
            nxt = tl.load(
                row_ptr + offs + TILE, mask=(offs + TILE < end) & sel[None, :, None], other=float("-inf")
            )
            y = tl.where(x < t, float("-inf"), x)
            tl.store(row_ptr + offs, y.to(logits_ptr.dtype.element_ty), mask=offs < end)


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    if rows == 0 or (k is None and p is None):
        return logits
    dev = logits.device
    lay = layout(rows, vocab, logits.dtype, dev)
    programs = rows * lay.chunks
    search = search_constexprs(lay.warps)
    kw = launch_kwargs(dev, lay.warps)
    maxima = scratch("top_k_top_p.maxima", rows * lay.n_units, logits.dtype, dev)
    chunk_max = scratch("top_k_top_p.chunk_max", programs, torch.float32, dev)
    counts = scratch("top_k_top_p.counts", programs, torch.int32, dev)
    thresholds = scratch("top_k_top_p.threshold", rows, torch.float32, dev)
    p32 = p.to(torch.float32) if p is not None else logits
    pivots = scratch("top_k_top_p.pivots", rows * PIVOTS, torch.float32, dev)
    refs = scratch("top_k_top_p.refs", rows, torch.float32, dev)
    partials = scratch("top_k_top_p.partials", programs * PIVOTS, torch.float32, dev)
    z_parts = scratch("top_k_top_p.z", programs, torch.float32, dev)
    cand = (
        scratch("top_k_top_p.candidates", programs * BUF, torch.float32, dev) if k is not None else chunk_max
    )
    _summary_kernel[(rows, lay.chunks)](
        logits, logits.stride(0), k if k is not None else counts, p32, vocab, lay.chunk, lay.chunks,
        lay.n_units, maxima, chunk_max, counts, cand, pivots, refs, partials, z_parts, thresholds,
        counters("top_k_top_p.summary", rows, dev), HAS_K=k is not None, HAS_P=p is not None, KCAP=KCAP,
        BUF=BUF, NP=PIVOTS, BOUND_NP=BOUND_PIVOTS, BOUND_PASSES=BOUND_PASSES, SAMPLE_NP=SAMPLE_PIVOTS,
        SAMPLE_PASSES=SAMPLE_PASSES, SAMPLE_RANGE=SAMPLE_RANGE, SPREAD=SPREAD, CLAMP=CLAMP, CB=CHUNK_BLOCK,
        **lay.shape, **search, **kw,
    )  # fmt: skip
    if p is not None:
        bracket = scratch("top_k_top_p.bracket", programs * CAP, torch.float32, dev)
        bracket_counts = scratch("top_k_top_p.bracket_counts", programs, torch.int32, dev)
        rounds = scratch("top_k_top_p.rounds", programs * PIVOTS, torch.float32, dev)
        for stage in (1, 2):
            _collect_kernel[(rows, lay.chunks)](
                logits, logits.stride(0), k if k is not None else counts, p32, vocab, lay.chunk, lay.chunks,
                lay.n_units, maxima, chunk_max, pivots, refs, partials, z_parts, rounds, bracket, bracket_counts,
                thresholds, counters(f"top_k_top_p.collect{stage}", rows, dev), HAS_K=k is not None,
                STAGE=stage, NP=PIVOTS, CAP=CAP, CLAMP=CLAMP, CB=CHUNK_BLOCK, **lay.shape, **search, **kw,
            )  # fmt: skip
    _mask_kernel[(rows, lay.chunks)](
        logits, logits.stride(0), vocab, lay.chunk, lay.n_units, maxima, thresholds, **lay.shape, **kw
    )
    return logits
