"""Exact threshold search over a row or a list of candidates, shared by the filters and logprobs.

The threshold of a target (a count ``k`` or a probability mass) is the largest element value ``t``
whose ``{x >= t}`` reaches it: ties with ``t`` are kept, as a sort keeps them. A pass spreads
pivots over an interval ``[lo, top]`` known to hold ``t`` and measures the count (or mass) of
``{x >= pivot}``; the pivots around the target then give way to the nearest elements, so ``lo``
and ``top`` become element values and meet at ``t`` in a few passes (:func:`_narrow`). Candidates
that fit the program's lanes stay in registers for the whole search. Masses are float32 sums of
``exp(x - ref)`` for a reference ``ref >= max(x) - 80`` given by the caller.
"""

from __future__ import annotations

import triton
import triton.language as tl

from vllm_ascend.kernels._triton.common import IS_INTERPRETED

NUM_PIVOTS = 8  # pivots per pass over a row or a long list
SCRATCH_PIVOTS = 32  # pivots per pass over a short list (one candidate per lane)
MAX_PASSES = 48
REG_PER_LANE = tl.constexpr(2 if IS_INTERPRETED else 8)  # exact search on registers up to this many per lane


@triton.jit
def _pivots(lo, top, NP: tl.constexpr):
    i = tl.arange(0, NP) + 1
    piv = lo + (top - lo) * (i.to(tl.float32) / NP)
    return tl.where(i == NP, top, tl.minimum(piv, top))


@triton.jit
def _pivot_pass(
    src_ptr,
    n,
    piv,
    row_max,
    floor,
    lo,
    BY_MASS: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    COUNT: tl.constexpr = True,
):
    """Per pivot: count (zero without ``COUNT``) and mass of ``{x >= pivot}``, and the mass of
    ``{x >= lo}``. Elements under ``floor`` count as ``-inf``.

    Tiles are loaded as ``[1, BLOCK]`` and the pivot axis comes first, so a tile broadcasts against
    the pivots in the layout it was loaded in (a 1-D tile would go through shared memory on every
    iteration). Counts and masses are kept per lane and reduced once at the end: a reduction across
    the program per tile (and per pivot) would dominate the pass."""
    lane_cnt = tl.zeros([NP, BLOCK], tl.int32)
    lane_mass = tl.zeros([NP, BLOCK], tl.float32)
    mass_lo = tl.zeros([1, BLOCK], tl.float32)
    pv = piv[:, None]
    offs = tl.arange(0, BLOCK)[None, :]
    nxt = tl.load(src_ptr + offs, mask=offs < n, other=float("-inf"))
    for start in range(0, n, BLOCK):
        x = nxt.to(tl.float32)
        offs = start + BLOCK + tl.arange(0, BLOCK)[None, :]
        nxt = tl.load(src_ptr + offs, mask=offs < n, other=float("-inf"))
        x = tl.where(x >= floor, x, float("-inf"))
        ge = x >= pv
        if COUNT:
            lane_cnt += ge.to(tl.int32)
        if BY_MASS:
            e = tl.exp(x - row_max)
            lane_mass += tl.where(ge, e, 0.0)
            mass_lo += tl.where(x >= lo, e, 0.0)
    return tl.sum(lane_cnt, 1), tl.sum(lane_mass, 1), tl.sum(tl.sum(mass_lo, 1), 0)


@triton.jit
def _neighbours(src_ptr, n, floor, above, below, BLOCK: tl.constexpr):
    """``(min{x >= above}, max{x < below})`` over the candidates (``inf`` / ``-inf`` when empty)."""
    lane_min = tl.full([BLOCK], float("inf"), tl.float32)
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(src_ptr + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
        x = tl.where(x >= floor, x, float("-inf"))
        lane_min = tl.minimum(lane_min, tl.where(x >= above, x, float("inf")))
        lane_max = tl.maximum(lane_max, tl.where(x < below, x, float("-inf")))
    return tl.min(lane_min, 0), tl.max(lane_max, 0)


@triton.jit
def _take(vec, idx, j, default):
    """``vec[j]`` (``default`` when ``j`` is out of range) for a small vector and scalar ``j``."""
    return tl.sum(tl.where(idx == j, vec, 0), 0) + tl.where((j >= 0) & (j < vec.shape[0]), 0, default)


@triton.jit
def _reached(cnt, mass, base_count, base_mass, target_count, target_mass, BY_MASS: tl.constexpr):
    if BY_MASS:
        return mass + base_mass >= target_mass
    return cnt + base_count >= target_count


@triton.jit
def _compact(row_ptr, vocab, lo, hi, dst_ptr, BLOCK: tl.constexpr):
    """Copy the row's elements in ``[lo, hi)`` to ``dst`` (order kept); returns how many."""
    base = tl.zeros([], tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        keep = (x >= lo) & (x < hi)
        pos = tl.cumsum(keep.to(tl.int32), 0)
        tl.store(dst_ptr + base + pos - 1, x.to(dst_ptr.dtype.element_ty), mask=keep)
        base += tl.sum(keep.to(tl.int32), 0)
    return base


@triton.jit
def _select(
    row_ptr,
    vocab,
    cand_ptr,
    cap,
    lo,
    count_lo,
    row_max,
    floor,
    target_count,
    target_mass,
    BY_MASS: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    NP_C: tl.constexpr,
    BLOCK_C: tl.constexpr,
    WIDE: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """Threshold ``t`` (largest element whose ``{x >= t}`` reaches the target) of a whole row and
    ``#{x >= t}``, by one program: coarse pivot passes over the row until the bucket ``[lo, hi)``
    holding ``t`` fits the ``cap`` elements of ``cand_ptr``, a copy of it there, then exact passes.
    ``count_lo`` bounds ``#{x >= lo}`` from above. The slow path: for what the streaming searches
    cannot bound (a large ``k``, massive ties, an estimate that missed)."""
    idx = tl.arange(0, NP)
    inf = float("inf")
    hi = tl.full([], inf, tl.float32)  # exclusive upper end of the candidate bucket [lo, hi)
    count_hi = tl.zeros([], tl.int32)
    mass_hi = tl.zeros([], tl.float32)
    passes = tl.zeros([], tl.int32)
    searching = (count_lo - count_hi > cap) & (lo < row_max)
    while searching:
        top = tl.minimum(hi, row_max)
        piv = _pivots(lo, top, NP)
        cnt, mass, _mass_lo = _pivot_pass(row_ptr, vocab, piv, row_max, floor, lo, BY_MASS, NP, BLOCK)
        j = tl.sum(_reached(cnt, mass, 0, 0.0, target_count, target_mass, BY_MASS).to(tl.int32), 0)
        count_lo = tl.where(j == 0, count_lo, _take(cnt, idx, j - 1, 0))
        lo = tl.where(j == 0, lo, _take(piv, idx, j - 1, 0.0))
        count_hi = _take(cnt, idx, j, 0)
        mass_hi = _take(mass, idx, j, 0.0)
        hi = _take(piv, idx, j, inf)
        passes += 1
        searching = (count_lo - count_hi > cap) & (lo < tl.minimum(hi, row_max)) & (passes < MAX_PASSES)
    # Candidates: the scratch when they fit (the whole tail >= lo if possible), else the row itself.
    src_ptr = row_ptr
    n = vocab
    base_count = tl.zeros([], tl.int32)
    base_mass = tl.zeros([], tl.float32)
    if count_lo <= cap:
        n = _compact(row_ptr, vocab, lo, inf, cand_ptr, BLOCK)
        src_ptr = cand_ptr
    elif count_lo - count_hi <= cap:
        n = _compact(row_ptr, vocab, lo, hi, cand_ptr, BLOCK)
        src_ptr = cand_ptr
        base_count = count_hi
        base_mass = mass_hi
    # Exact passes: lo and top become elements until they meet.
    lo, count_lo = _exact(
        src_ptr,
        n,
        lo,
        tl.minimum(hi, row_max),
        count_lo,
        row_max,
        floor,
        base_count,
        base_mass,
        target_count,
        target_mass,
        BY_MASS,
        NP,
        BLOCK,
        NP_C,
        BLOCK_C,
        WIDE,
        MAX_PASSES,
    )
    return lo, count_lo


@triton.jit
def _exact(
    src_ptr,
    n,
    lo,
    top,
    count_lo,
    row_max,
    floor,
    base_count,
    base_mass,
    target_count,
    target_mass,
    BY_MASS: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    NP_C: tl.constexpr,
    BLOCK_C: tl.constexpr,
    WIDE: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """:func:`_narrow` over ``n`` candidates: more than ``WIDE`` take the row's wide tiles and
    ``NP`` pivots, fewer the candidate tiles and ``NP_C`` pivots (fewer, cheaper passes); up to
    ``REG_PER_LANE`` candidates per lane stay in registers for every pass, with ``NP`` pivots (a
    pass over registers costs far less than the memory round trip of a streamed one)."""
    REG: tl.constexpr = BLOCK_C * REG_PER_LANE
    if (n > BLOCK_C) & (n <= REG):
        lo, count_lo = _narrow(
            src_ptr,
            n,
            lo,
            top,
            count_lo,
            row_max,
            floor,
            base_count,
            base_mass,
            target_count,
            target_mass,
            BY_MASS,
            NP,
            REG,
            MAX_PASSES,
        )
    elif n > WIDE:
        lo, count_lo = _narrow(
            src_ptr,
            n,
            lo,
            top,
            count_lo,
            row_max,
            floor,
            base_count,
            base_mass,
            target_count,
            target_mass,
            BY_MASS,
            NP,
            BLOCK,
            MAX_PASSES,
        )
    else:
        lo, count_lo = _narrow(
            src_ptr,
            n,
            lo,
            top,
            count_lo,
            row_max,
            floor,
            base_count,
            base_mass,
            target_count,
            target_mass,
            BY_MASS,
            NP_C,
            BLOCK_C,
            MAX_PASSES,
        )
    return lo, count_lo


@triton.jit
def _narrow(
    src_ptr,
    n,
    lo,
    top,
    count_lo,
    row_max,
    floor,
    base_count,
    base_mass,
    target_count,
    target_mass,
    BY_MASS: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """Narrow ``[lo, top]`` to the threshold: per pass the nearest elements around ``NP`` pivots
    become the new ends, so they are element values and meet at ``t``. Candidates that fit one
    tile are loaded once and every pass runs on registers (the passes are a dependent chain, so a
    memory round trip per pass is what a short search costs)."""
    idx = tl.arange(0, NP)
    passes = tl.zeros([], tl.int32)
    searching = lo < top
    if n <= BLOCK:
        offs = tl.arange(0, BLOCK)[None, :]
        x = tl.load(src_ptr + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
        x = tl.where(x >= floor, x, float("-inf"))
        e = x
        if BY_MASS:
            e = tl.exp(x - row_max)
        while searching:
            piv = _pivots(lo, top, NP)
            ge = x >= piv[:, None]
            cnt = tl.sum(ge.to(tl.int32), 1)
            mass = tl.sum(tl.where(ge, e, 0.0), 1)
            j = tl.sum(
                _reached(cnt, mass, base_count, base_mass, target_count, target_mass, BY_MASS).to(tl.int32), 0
            )
            above = tl.min(tl.min(tl.where(x >= _take(piv, idx, j - 1, float("inf")), x, float("inf")), 1), 0)
            below = tl.max(tl.max(tl.where(x < _take(piv, idx, j, float("-inf")), x, float("-inf")), 1), 0)
            lo, top, count_lo = _advance(j, lo, top, count_lo, cnt, base_count, above, below, NP)
            passes += 1
            searching = (lo < top) & (passes < MAX_PASSES)
    else:
        while searching:
            piv = _pivots(lo, top, NP)
            cnt, mass, _mass_lo = _pivot_pass(src_ptr, n, piv, row_max, floor, lo, BY_MASS, NP, BLOCK)
            j = tl.sum(
                _reached(cnt, mass, base_count, base_mass, target_count, target_mass, BY_MASS).to(tl.int32), 0
            )
            above, below = _neighbours(
                src_ptr,
                n,
                floor,
                _take(piv, idx, j - 1, float("inf")),
                _take(piv, idx, j, float("-inf")),
                BLOCK,
            )
            lo, top, count_lo = _advance(j, lo, top, count_lo, cnt, base_count, above, below, NP)
            passes += 1
            searching = (lo < top) & (passes < MAX_PASSES)
    return lo, count_lo


@triton.jit
def _advance(j, lo, top, count_lo, cnt, base_count, above, below, NP: tl.constexpr):
    """One narrowing step: ``j`` pivots reached the target; ``above`` is the smallest element at or
    above the last of them, ``below`` the largest under the next (only these two, not one per
    pivot). Returns the new ``(lo, top, count_lo)``; ``lo == top`` once they meet at ``t``."""
    count_lo = tl.where(j == 0, count_lo, _take(cnt, tl.arange(0, NP), j - 1, 0) + base_count)
    new_lo = tl.where(j == 0, lo, above)
    done = (j == NP) | (new_lo >= below)
    answer = tl.where(j == NP, top, new_lo)
    return tl.where(done, answer, new_lo), tl.where(done, answer, below), count_lo


@triton.jit
def _tail_bound(ref, z, count, p):
    """The mass below ``v`` is at most ``count * exp(v - ref)`` (``count``: at least the number of
    finite elements): where that is the ``1 - p`` left over, ``{x >= v}`` holds at least ``p`` of
    ``z``, so ``v`` bounds the top-p threshold from below."""
    return ref + tl.log((1.0 - p) * z * 0.999 / count.to(tl.float32))
