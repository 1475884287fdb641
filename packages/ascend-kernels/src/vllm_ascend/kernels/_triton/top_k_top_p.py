"""Triton :func:`vllm_ascend.kernels.apply_top_k_top_p`: a threshold search instead of a sort.

The kept set of a row is ``{x >= t}``. The first and last launches are shared:

* ``_summary_kernel`` (rows split into chunks so that small batches fill the device): per chunk the
  max, softmax sum, min and finite count; per sub-tile of ``SUB`` consecutive elements its max, and
  per group of ``GROUP`` sub-tiles its max (:mod:`.logprobs` also has it count, per chunk, the
  elements above a chosen token).
* ``_mask_kernel`` (split the same way): writes ``-inf`` below ``t``; sub-tiles whose max is below
  ``t`` are written without being read.

With top-k (``_threshold_kernel``, one program per row): the sub-tile maxima are distinct
elements, so if ``c`` of them are ``>= v`` the row has at least ``c`` elements ``>= v`` (and at
least their mass), i.e. ``t >= v`` as soon as ``c >= k`` (or their mass reaches the top-p target).
A ``k`` far below the number of groups takes the bound from the group maxima instead (16 times
fewer values). Only sub-tiles whose max reaches that bound can hold candidates: they are listed
through the group maxima (groups below the bound are skipped whole), they alone are read, and their
elements ``>= bound`` copied to a per-row scratch (typically a few times ``k``), where exact pivot
passes find ``t``: per pass, pivots spread over an interval ``[lo, top]`` known to hold ``t`` give
the count (top-k) or probability mass (top-p) of ``{x >= pivot}``; the pivots around the target
then give way to the nearest elements (one more sweep, or none when the candidates, up to
``REG_PER_LANE`` per lane, stay in registers for the whole search), so ``lo`` and ``top`` become
element values and meet at ``t``; ties are kept exactly as a sort keeps them. Top-p then runs on the
scratch, over the distribution top-k left.
Rows whose bound is too weak (``k`` above the number of sub-tiles, massive ties, top-k off with a
flat distribution) search the whole row: coarse pivot passes until a bucket fits the scratch, then
the same exact passes.

Top-p alone (flat distributions keep thousands of tokens, beyond what maxima bound): the search is
split over the device. ``TOP_P_ROUNDS`` launches of ``_top_p_round_kernel`` each give, per chunk,
the mass of ``{x >= pivot}`` for ``ROUND_PIVOTS`` pivots over the bracket the earlier rounds left
(starting at an analytic lower bound, see ``_tail_bound``); every program replays the rounds from
those partials, so no per-row state is stored. ``_top_p_bucket_kernel`` copies the elements of the
final bracket to the scratch (a relaxed atomic per element), and ``_top_p_threshold_kernel`` searches them
exactly, with the mass above the bracket as a base; the shared mask kernel follows. For float32 logits
(``TOP_P_FUSED_MASK``) ``_top_p_mask_collect_kernel`` does the copy and the mask in one sweep (``-inf``
below the bracket, the bracket's elements copied with their columns and left in place) and
``_top_p_finish_kernel`` searches the scratch and writes ``-inf`` at the columns under ``t``: one read
of the row and one launch fewer.

So a typical row is read about twice and written once. Scratch buffers are cached per device and
shared: calls must not run concurrently on two streams of one device. Masses are float32 sums, so
a top-p threshold can differ from a float64 sort where the cumulative mass is within rounding of
``p``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels._triton.common import (
    IS_INTERPRETED,
    SMALL_BATCH_ROWS,
    check_logits,
    row_split,
    scratch,
)

NUM_PIVOTS = 8
SCRATCH_PIVOTS = 32
ROUND_PIVOTS = 8
ROUND_BLOCK = 1024
TOP_P_ROUNDS = 2
#: Top-p alone, per logits dtype: the bucket copy and the mask in one sweep (the threshold kernel then masks the
#: bracket under ``t``) or in two. H100, 2026-12-06: fused, float32 ran 0-8 % faster (1024 x 151936: 1568 ->
#: 1442 µs), bfloat16 0-8 % slower (1173 -> 1271 µs; its rows are half the bytes, so the read the fusion saves
#: weighs less than the columns it stores).
TOP_P_FUSED_MASK = {torch.float32: True, torch.bfloat16: False, torch.float16: False}
BOUND_PIVOTS = 16
BOUND_PASSES = 2
SUB = 8 if IS_INTERPRETED else 16
CAP = 64 if IS_INTERPRETED else 16384
MAX_PASSES = 48
REG_PER_LANE = tl.constexpr(2 if IS_INTERPRETED else 8)  # exact search on registers up to this many per lane
GROUP = 4 if IS_INTERPRETED else 16  # sub-tiles per group (the summary also keeps group maxima)
GROUP_RATIO = tl.constexpr(8)  # the top-k bound uses group maxima when k * this <= their number
GATHER_BLOCK = 64 if IS_INTERPRETED else 512  # elements loaded per step from listed sub-tiles
# (tile, warps) of the per-row search programs, for batches up to SMALL_BATCH_ROWS and above
SMALL_BATCH_SEARCH = (2048, 8)
LARGE_BATCH_SEARCH = (512, 4)
MASS_MARGIN = tl.constexpr(
    1.0 + 2.0**-14
)  # the bound's float32 mass must beat the target by more than rounding
_STATS = 4  # per chunk: max, softmax sum relative to it, min, finite count


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
    n_ready,
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
    """Threshold ``t`` (largest element whose ``{x >= t}`` reaches the target), ``#{x >= t}``, and the
    number of elements ``>= t`` left in the scratch (``-1`` when the scratch does not hold them all).

    ``n_ready >= 0`` says the scratch already holds every element ``>= lo`` (``n_ready`` of them)."""
    idx = tl.arange(0, NP)
    inf = float("inf")
    hi = tl.full([], inf, tl.float32)  # exclusive upper end of the candidate bucket [lo, hi)
    count_hi = tl.zeros([], tl.int32)
    mass_hi = tl.zeros([], tl.float32)
    passes = tl.zeros([], tl.int32)
    # Coarse passes over the row until the bucket [lo, hi) fits the scratch (tensors left of `&`: n_ready
    # may be a constexpr, which triton-ascend refuses there).
    searching = (count_lo - count_hi > cap) & (lo < row_max) & (n_ready < 0)
    while searching:
        top = tl.minimum(hi, row_max)
        piv = _pivots(lo, top, NP)
        cnt, mass, _ = _pivot_pass(row_ptr, vocab, piv, row_max, floor, lo, BY_MASS, NP, BLOCK)
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
    tail_in_scratch = tl.zeros([], tl.int32)
    if n_ready >= 0:
        src_ptr = cand_ptr
        n = n_ready
        tail_in_scratch = 1
    elif count_lo <= cap:
        n = _compact(row_ptr, vocab, lo, inf, cand_ptr, BLOCK)
        src_ptr = cand_ptr
        tail_in_scratch = 1
    elif count_lo - count_hi <= cap:
        n = _compact(row_ptr, vocab, lo, hi, cand_ptr, BLOCK)
        src_ptr = cand_ptr
        base_count = count_hi
        base_mass = mass_hi
    # Exact passes: lo and top become elements until they meet.
    top = tl.minimum(hi, row_max)
    lo, count_lo = _exact(
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
        NP_C,
        BLOCK_C,
        WIDE,
        MAX_PASSES,
    )
    return lo, count_lo, tl.where(tail_in_scratch == 1, n, -1)


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
            cnt, mass, _ = _pivot_pass(src_ptr, n, piv, row_max, floor, lo, BY_MASS, NP, BLOCK)
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
def _summary_kernel(
    logits_ptr,
    row_stride,
    vocab,
    chunk,
    n_sub,
    maxima_ptr,
    n_grp,
    groups_ptr,
    stats_ptr,
    counter_ptr,
    chosen_ptr,
    above_ptr,
    NEED_SUM: tl.constexpr,
    SUB: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
    COUNT_ABOVE: tl.constexpr = False,
):
    """Per chunk: max, softmax sum, min, finite count (and with ``COUNT_ABOVE`` the number of
    elements above the row's ``chosen`` token, for its rank); per sub-tile: its max; per group of
    ``GROUP`` sub-tiles: its max."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    chosen = tl.zeros([], tl.float32)
    if COUNT_ABOVE:
        chosen = tl.load(row_ptr + tl.load(chosen_ptr + row)).to(tl.float32)
    lo_idx = c * chunk
    end = tl.minimum(lo_idx + chunk, vocab)
    NS: tl.constexpr = BLOCK // SUB
    sub = tl.arange(0, NS)
    col = tl.arange(0, SUB)
    run_max = tl.full([NS], float("-inf"), tl.float32)
    run_sum = tl.zeros([NS], tl.float32)
    mn = tl.full([NS, SUB], float("inf"), tl.float32)
    finite = tl.zeros([NS, SUB], tl.int32)
    above = tl.zeros([NS, SUB], tl.int32)
    tile = sub[:, None] * SUB + col[None, :]
    nxt = tl.load(row_ptr + lo_idx + tile, mask=lo_idx + tile < end, other=float("-inf"))
    for start in range(lo_idx, end, BLOCK):  # the next tile is loaded before this one is reduced
        x = nxt.to(tl.float32)
        offs = start + BLOCK + tile
        nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
        sub_max = tl.max(x, 1)
        s = start // SUB + sub
        tl.store(maxima_ptr + row.to(tl.int64) * n_sub + s, sub_max, mask=s < tl.cdiv(end, SUB))
        g = start // (SUB * GROUP) + tl.arange(0, NS // GROUP)
        grp_max = tl.max(tl.reshape(sub_max, [NS // GROUP, GROUP]), 1)
        tl.store(groups_ptr + row.to(tl.int64) * n_grp + g, grp_max, mask=g < tl.cdiv(end, SUB * GROUP))
        if NEED_SUM:  # softmax sum per sub-tile lane: one exponential per element
            new_max = tl.maximum(run_max, sub_max)
            safe = tl.where(new_max > float("-inf"), new_max, 0.0)
            run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(tl.exp(x - safe[:, None]), 1)
            run_max = new_max
        else:
            run_max = tl.maximum(run_max, sub_max)
        ok = x > float("-inf")
        mn = tl.minimum(mn, tl.where(ok, x, float("inf")))
        finite += ok.to(tl.int32)
        if COUNT_ABOVE:
            above += (x > chosen).to(tl.int32)
    m = tl.max(run_max, 0)
    safe_m = tl.where(m > float("-inf"), m, 0.0)
    out = stats_ptr + (row.to(tl.int64) * tl.num_programs(1) + c) * 4
    if c == 0:
        tl.store(counter_ptr + row, 0)
    tl.store(out, m)
    tl.store(out + 1, tl.sum(run_sum * tl.exp(run_max - safe_m), 0))
    tl.store(out + 2, tl.min(tl.min(mn, 1), 0))
    tl.store(out + 3, tl.sum(tl.sum(finite, 1), 0).to(tl.float32))
    if COUNT_ABOVE:
        tl.store(above_ptr + row.to(tl.int64) * tl.num_programs(1) + c, tl.sum(tl.sum(above, 1), 0))


@triton.jit
def _row_stats(stats_ptr, row, n_chunks, CHUNKS: tl.constexpr):
    """Row max, softmax sum relative to it, min and finite count from the chunk statistics."""
    ci = tl.arange(0, CHUNKS)
    st = stats_ptr + (row.to(tl.int64) * n_chunks + ci) * 4
    inside = ci < n_chunks
    c_max = tl.load(st, mask=inside, other=float("-inf"))
    row_max = tl.max(c_max, 0)
    safe = tl.where(row_max > float("-inf"), row_max, 0.0)
    z = tl.sum(tl.load(st + 1, mask=inside, other=0.0) * tl.exp(c_max - safe), 0)
    row_min = tl.min(tl.load(st + 2, mask=inside, other=float("inf")), 0)
    finite = tl.sum(tl.load(st + 3, mask=inside, other=0.0), 0).to(tl.int32)
    return row_max, z, row_min, finite


@triton.jit
def _tail_bound(row_max, z, finite, p):
    """The mass below ``v`` is at most ``finite * exp(v - max)``: where that is the ``1 - p`` left
    over, ``{x >= v}`` must hold at least ``p``, so ``v`` bounds the top-p threshold from below."""
    return tl.minimum(row_max + tl.log((1.0 - p) * z * 0.999 / finite.to(tl.float32)), row_max)


@triton.jit
def _bracket(
    partials_ptr,
    row,
    rows,
    n_chunks,
    lo,
    target,
    row_max,
    ROUNDS: tl.constexpr,
    NP: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """Replay the split top-p rounds: ``(lo, hi, count, mass)`` with the threshold in ``[lo, hi)``
    and ``count`` / ``mass`` those of ``{x >= hi}``. Round ``r``'s per-chunk counts and masses of
    ``{x >= pivot}`` are at ``partials[r, row, chunk, pivot, 2]``."""
    idx = tl.arange(0, NP)
    ci = tl.arange(0, CHUNKS)
    hi = tl.full([], float("inf"), tl.float32)
    count_hi = tl.zeros([], tl.float32)
    mass_hi = tl.zeros([], tl.float32)
    for r in tl.static_range(ROUNDS):
        piv = _pivots(lo, tl.minimum(hi, row_max), NP)
        at = partials_ptr + (((r * rows + row).to(tl.int64) * n_chunks + ci[:, None]) * NP + idx[None, :]) * 2
        inside = (ci < n_chunks)[:, None]
        cnt = tl.sum(tl.load(at, mask=inside, other=0.0), 0)
        mass = tl.sum(tl.load(at + 1, mask=inside, other=0.0), 0)
        j = tl.sum((mass >= target).to(tl.int32), 0)
        lo = tl.where(j == 0, lo, _take(piv, idx, j - 1, 0.0))
        count_hi = tl.where(j == NP, count_hi, _take(cnt, idx, j, 0.0))
        mass_hi = tl.where(j == NP, mass_hi, _take(mass, idx, j, 0.0))
        hi = tl.where(j == NP, hi, _take(piv, idx, j, 0.0))
    return lo, hi, count_hi, mass_hi


@triton.jit(do_not_specialize=["rows", "n_chunks"])
def _top_p_round_kernel(
    logits_ptr,
    row_stride,
    p_ptr,
    stats_ptr,
    partials_ptr,
    rows,
    vocab,
    chunk,
    n_chunks,
    ROUND: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """One split round of the top-p search: this chunk's count and mass of ``{x >= pivot}`` for
    ``NP`` pivots over the bracket the earlier rounds left."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_max, z, row_min, finite = _row_stats(stats_ptr, row, n_chunks, CHUNKS)
    p = tl.load(p_ptr + row)
    if (p < 1.0) & (finite > 0):
        start = c * chunk
        lo = tl.maximum(row_min, _tail_bound(row_max, z, finite, p))
        lo, hi, _, _ = _bracket(partials_ptr, row, rows, n_chunks, lo, p * z, row_max, ROUND, NP, CHUNKS)
        piv = _pivots(lo, tl.minimum(hi, row_max), NP)
        cnt, mass, _ = _pivot_pass(
            logits_ptr + row.to(tl.int64) * row_stride + start,
            tl.minimum(chunk, vocab - start),
            piv,
            row_max,
            float("-inf"),
            lo,
            True,
            NP,
            BLOCK,
            False,
        )
        out = partials_ptr + (((ROUND * rows + row).to(tl.int64) * n_chunks + c) * NP + tl.arange(0, NP)) * 2
        tl.store(out, cnt.to(tl.float32))
        tl.store(out + 1, mass)


@triton.jit(do_not_specialize=["rows", "n_chunks"])
def _top_p_bucket_kernel(
    logits_ptr,
    row_stride,
    p_ptr,
    stats_ptr,
    partials_ptr,
    counter_ptr,
    cand_base_ptr,
    rows,
    vocab,
    chunk,
    n_chunks,
    cap,
    ROUNDS: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """Copy this chunk's elements of the final bracket ``[lo, hi)`` to the row's scratch, at
    offsets taken from a per-row counter."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_max, z, row_min, finite = _row_stats(stats_ptr, row, n_chunks, CHUNKS)
    p = tl.load(p_ptr + row)
    if (p < 1.0) & (finite > 0):
        lo = tl.maximum(row_min, _tail_bound(row_max, z, finite, p))
        lo, hi, _, _ = _bracket(partials_ptr, row, rows, n_chunks, lo, p * z, row_max, ROUNDS, NP, CHUNKS)
        row_ptr = logits_ptr + row.to(tl.int64) * row_stride
        cand_ptr = cand_base_ptr + row.to(tl.int64) * cap
        end = tl.minimum(c * chunk + chunk, vocab)
        for start in range(c * chunk, end, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
            xf = x.to(tl.float32)
            keep = (xf >= lo) & (xf < hi)
            # One relaxed atomic per kept element (a bracket holds ~1/80 of the row): cheaper than a
            # prefix sum over every tile, and the order of the scratch does not matter.
            pos = tl.atomic_add(counter_ptr + row + tl.zeros_like(offs), 1, mask=keep, sem="relaxed")
            tl.store(cand_ptr + pos, x, mask=keep & (pos < cap))


@triton.jit
def _top_p_search(
    row_ptr,
    vocab,
    cand_ptr,
    n,
    cap,
    lo,
    hi,
    count_hi,
    mass_hi,
    row_max,
    finite,
    target,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    NP_C: tl.constexpr,
    EXACT_BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """The exact top-p threshold of a row from its final bracket ``[lo, hi)``: searched among the ``n``
    elements the scratch holds (the mass of ``{x >= hi}`` as a base), or over the row when they overflowed it."""
    if n <= cap:
        threshold, _ = _exact(
            cand_ptr,
            n,
            lo,
            tl.minimum(hi, row_max),
            tl.zeros([], tl.int32),
            row_max,
            float("-inf"),
            count_hi.to(tl.int32),
            mass_hi,
            0,
            target,
            True,
            NP,
            BLOCK,
            NP_C,
            EXACT_BLOCK,
            WIDE,
            MAX_PASSES,
        )
    else:
        threshold, _, _ = _select(
            row_ptr,
            vocab,
            cand_ptr,
            -1,
            cap,
            lo,
            finite,
            row_max,
            float("-inf"),
            0,
            target,
            True,
            NP,
            BLOCK,
            NP_C,
            EXACT_BLOCK,
            WIDE,
            MAX_PASSES,
        )
    return threshold


@triton.jit(do_not_specialize=["rows", "n_chunks"])
def _top_p_mask_collect_kernel(
    logits_ptr,
    row_stride,
    p_ptr,
    stats_ptr,
    partials_ptr,
    maxima_ptr,
    counter_ptr,
    cand_base_ptr,
    col_base_ptr,
    rows,
    vocab,
    chunk,
    n_chunks,
    n_sub,
    cap,
    ROUNDS: tl.constexpr,
    NP: tl.constexpr,
    SUB: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """The bucket copy and the mask in one sweep of this chunk: ``-inf`` below the final bracket
    ``[lo, hi)`` (sub-tiles whose max is below ``lo`` written unread), the bracket's elements copied
    to the row's scratch with their columns and left in place (the threshold kernel masks those under
    ``t``), the elements at or above ``hi`` kept."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    row_max, z, row_min, finite = _row_stats(stats_ptr, row, n_chunks, CHUNKS)
    p = tl.load(p_ptr + row)
    if (p < 1.0) & (finite > 0):
        lo = tl.maximum(row_min, _tail_bound(row_max, z, finite, p))
        lo, hi, _, _ = _bracket(partials_ptr, row, rows, n_chunks, lo, p * z, row_max, ROUNDS, NP, CHUNKS)
        row_ptr = logits_ptr + row.to(tl.int64) * row_stride
        cand_ptr = cand_base_ptr + row.to(tl.int64) * cap
        col_ptr = col_base_ptr + row.to(tl.int64) * cap
        start0 = c * chunk
        end = tl.minimum(start0 + chunk, vocab)
        NS: tl.constexpr = BLOCK // SUB
        sub = tl.arange(0, NS)
        col = tl.arange(0, SUB)
        for start in range(start0, end, BLOCK):
            s = start // SUB + sub
            sel = (
                tl.load(maxima_ptr + row.to(tl.int64) * n_sub + s, mask=s < n_sub, other=float("-inf")) >= lo
            )
            offs = start + sub[:, None] * SUB + col[None, :]
            inb = offs < vocab  # chunks are whole tiles: only the row end needs a mask
            x = tl.load(row_ptr + offs, mask=inb & sel[:, None], other=float("-inf"))
            xf = x.to(tl.float32)
            keep = (xf >= lo) & (xf < hi)
            pos = tl.atomic_add(counter_ptr + row + tl.zeros_like(offs), 1, mask=keep, sem="relaxed")
            tl.store(cand_ptr + pos, x, mask=keep & (pos < cap))
            tl.store(col_ptr + pos, offs, mask=keep & (pos < cap))
            tl.store(row_ptr + offs, tl.where(xf < lo, float("-inf"), x), mask=inb)


@triton.jit(do_not_specialize=["rows", "n_chunks"])
def _top_p_finish_kernel(
    logits_ptr,
    row_stride,
    p_ptr,
    stats_ptr,
    partials_ptr,
    counter_ptr,
    cand_base_ptr,
    col_base_ptr,
    rows,
    vocab,
    n_chunks,
    cap,
    ROUNDS: tl.constexpr,
    NP_R: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    NP_C: tl.constexpr,
    EXACT_BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    CHUNKS: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """After :func:`_top_p_mask_collect_kernel`: the exact threshold from the bracket in the scratch, and
    ``-inf`` at the scratch's columns under it; a bracket that overflowed the scratch searches the row
    (its elements under ``lo`` are already ``-inf``) and masks it whole."""
    row = tl.program_id(0)
    row_max, z, row_min, finite = _row_stats(stats_ptr, row, n_chunks, CHUNKS)
    p = tl.load(p_ptr + row)
    if (p < 1.0) & (finite > 0):
        target = p * z
        lo = tl.maximum(row_min, _tail_bound(row_max, z, finite, p))
        lo, hi, count_hi, mass_hi = _bracket(
            partials_ptr, row, rows, n_chunks, lo, target, row_max, ROUNDS, NP_R, CHUNKS
        )
        n = tl.load(counter_ptr + row)
        row_ptr = logits_ptr + row.to(tl.int64) * row_stride
        cand_ptr = cand_base_ptr + row.to(tl.int64) * cap
        threshold = _top_p_search(
            row_ptr, vocab, cand_ptr, n, cap, lo, hi, count_hi, mass_hi, row_max, finite, target,
            NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
        )  # fmt: skip
        if n <= cap:
            col_ptr = col_base_ptr + row.to(tl.int64) * cap
            for start in range(0, n, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                inside = offs < n
                x = tl.load(cand_ptr + offs, mask=inside, other=float("inf")).to(tl.float32)
                cols = tl.load(col_ptr + offs, mask=inside, other=0)
                tl.store(row_ptr + cols, float("-inf"), mask=inside & (x < threshold))
        else:
            for start in range(0, vocab, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                inside = offs < vocab
                x = tl.load(row_ptr + offs, mask=inside, other=float("inf"))
                tl.store(row_ptr + offs, float("-inf"), mask=inside & (x.to(tl.float32) < threshold))


@triton.jit(do_not_specialize=["rows", "n_chunks"])
def _top_p_threshold_kernel(
    logits_ptr,
    row_stride,
    p_ptr,
    stats_ptr,
    partials_ptr,
    counter_ptr,
    cand_base_ptr,
    threshold_ptr,
    rows,
    vocab,
    n_chunks,
    cap,
    ROUNDS: tl.constexpr,
    NP_R: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    NP_C: tl.constexpr,
    EXACT_BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    CHUNKS: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """The exact top-p threshold of a row from its bracket in the scratch (whole-row search when
    the bracket overflowed the scratch)."""
    row = tl.program_id(0)
    row_max, z, row_min, finite = _row_stats(stats_ptr, row, n_chunks, CHUNKS)
    p = tl.load(p_ptr + row)
    threshold = tl.full([], float("-inf"), tl.float32)
    if (p < 1.0) & (finite > 0):
        target = p * z
        lo = tl.maximum(row_min, _tail_bound(row_max, z, finite, p))
        lo, hi, count_hi, mass_hi = _bracket(
            partials_ptr, row, rows, n_chunks, lo, target, row_max, ROUNDS, NP_R, CHUNKS
        )
        threshold = _top_p_search(
            logits_ptr + row.to(tl.int64) * row_stride, vocab, cand_base_ptr + row.to(tl.int64) * cap,
            tl.load(counter_ptr + row), cap, lo, hi, count_hi, mass_hi, row_max, finite, target,
            NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
        )  # fmt: skip
    tl.store(threshold_ptr + row, threshold)


@triton.jit
def _bound(
    maxima_ptr,
    n_sub,
    row_min,
    row_max,
    floor,
    target_count,
    target_mass,
    BY_MASS: tl.constexpr,
    NP: tl.constexpr,
    PASSES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Largest pivot ``v`` (to ``(row_max - row_min) / NP**PASSES``) such that the sub-tile maxima
    ``>= v`` alone reach the target: a lower bound of the threshold; ``row_min`` if none does."""
    idx = tl.arange(0, NP)
    lo = row_min
    top = row_max
    for _ in range(PASSES):
        piv = _pivots(lo, top, NP)
        cnt, mass, _ = _pivot_pass(maxima_ptr, n_sub, piv, row_max, floor, lo, BY_MASS, NP, BLOCK)
        j = tl.sum(
            _reached(cnt, mass, 0, 0.0, target_count, target_mass * MASS_MARGIN, BY_MASS).to(tl.int32), 0
        )
        lo = tl.where(j == 0, lo, _take(piv, idx, j - 1, 0.0))
        top = tl.where(j == NP, top, _take(piv, idx, j, 0.0))
    return lo


@triton.jit
def _list_subtiles(
    row_maxima,
    row_groups,
    n_sub,
    n_grp,
    v,
    gsel_ptr,
    sel_ptr,
    cap,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """List the sub-tiles whose max is ``>= v`` in ascending order (the first ``cap`` of them);
    returns how many. Groups whose max is below ``v`` are listed out first, so their sub-tile
    maxima are never read: a high ``v`` touches a few groups' maxima, not the row's. Rows of at most
    ``2 * BLOCK`` sub-tiles are listed in one or two flat steps instead (fewer dependent steps)."""
    n_sel = tl.zeros([], tl.int32)
    if n_sub <= 2 * BLOCK:
        for s0 in range(0, n_sub, BLOCK):
            sub = s0 + tl.arange(0, BLOCK)
            sel = (tl.load(row_maxima + sub, mask=sub < n_sub, other=float("-inf")) >= v) & (sub < n_sub)
            pos = n_sel + tl.cumsum(sel.to(tl.int32), 0) - 1
            tl.store(sel_ptr + pos, sub, mask=sel & (pos < cap))
            n_sel += tl.sum(sel.to(tl.int32), 0)
    else:
        n_g = tl.zeros([], tl.int32)
        for g0 in range(0, n_grp, BLOCK):
            g = g0 + tl.arange(0, BLOCK)
            sel = (tl.load(row_groups + g, mask=g < n_grp, other=float("-inf")) >= v) & (g < n_grp)
            pos = n_g + tl.cumsum(sel.to(tl.int32), 0) - 1
            tl.store(gsel_ptr + pos, g, mask=sel)
            n_g += tl.sum(sel.to(tl.int32), 0)
        tl.debug_barrier()
        NG: tl.constexpr = 32  # groups per step
        for i0 in range(0, n_g, NG):
            i = i0 + tl.arange(0, NG)
            g = tl.load(gsel_ptr + i, mask=i < n_g, other=0)
            sub = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
            sub = tl.reshape(sub, [NG * GROUP])
            ok = tl.reshape(tl.broadcast_to((i < n_g)[:, None], [NG, GROUP]), [NG * GROUP]) & (sub < n_sub)
            sel = (tl.load(row_maxima + sub, mask=ok, other=float("-inf")) >= v) & ok
            pos = n_sel + tl.cumsum(sel.to(tl.int32), 0) - 1
            tl.store(sel_ptr + pos, sub, mask=sel & (pos < cap))
            n_sel += tl.sum(sel.to(tl.int32), 0)
    tl.debug_barrier()
    return n_sel


@triton.jit
def _gather(
    row_ptr,
    maxima_ptr,
    groups_ptr,
    n_sub,
    n_grp,
    vocab,
    lo,
    cand_ptr,
    gsel_ptr,
    sel_ptr,
    cap,
    SUB: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Copy every element ``>= lo`` to the scratch, reading only sub-tiles whose max is ``>= lo``;
    returns how many (more than ``cap``: the scratch holds only part of them, or more than
    ``cap // 4`` sub-tiles qualified and none were read).

    First the indices of those sub-tiles are listed (:func:`_list_subtiles`), then they are
    loaded ``BLOCK_C // SUB`` at a time, so the loop does not walk the whole row."""
    n_sel = _list_subtiles(maxima_ptr, groups_ptr, n_sub, n_grp, lo, gsel_ptr, sel_ptr, cap, GROUP, BLOCK)
    n = tl.zeros([], tl.int32)
    if n_sel > cap // 4:  # likely more candidates than fit: not worth loading them one by one
        n = cap + 1
    else:
        NS: tl.constexpr = BLOCK_C // SUB
        col = tl.arange(0, SUB)
        for i0 in range(0, n_sel, NS):
            i = i0 + tl.arange(0, NS)
            s = tl.load(sel_ptr + i, mask=i < n_sel, other=0)
            offs2 = s[:, None] * SUB + col[None, :]
            x = tl.load(row_ptr + offs2, mask=(i < n_sel)[:, None] & (offs2 < vocab), other=float("-inf"))
            keep = tl.reshape(x.to(tl.float32) >= lo, [BLOCK_C])
            pos = n + tl.cumsum(keep.to(tl.int32), 0) - 1
            tl.store(cand_ptr + pos, tl.reshape(x, [BLOCK_C]), mask=keep & (pos < cap))
            n += tl.sum(keep.to(tl.int32), 0)
        tl.debug_barrier()
    return n


@triton.jit
def _top_k_threshold(
    row_ptr,
    row_maxima,
    row_groups,
    cand_ptr,
    gsel_ptr,
    sel_ptr,
    vocab,
    n_sub,
    n_grp,
    cap,
    k,
    finite,
    row_min,
    row_max,
    NP: tl.constexpr,
    NP_C: tl.constexpr,
    BOUND_NP: tl.constexpr,
    BOUND_PASSES: tl.constexpr,
    SUB: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr,
    EXACT_BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """``(t, #{x >= t}, n_ready)`` for the ``k`` largest of a row (``t = -inf``, count ``finite``
    when ``k`` keeps every finite element or is off); ``n_ready`` as :func:`_select` returns it."""
    threshold = tl.full([], float("-inf"), tl.float32)
    count = finite
    n_ready = tl.full([], -1, tl.int32)
    if (k > 0) & (k < finite):
        lo = row_min
        n = finite
        if k <= n_sub:
            # Group maxima bound as well and are GROUP times fewer; their bound is weaker, so only
            # for k well below their number.
            src = row_maxima
            n_src = n_sub
            if k * GROUP_RATIO <= n_grp:
                src = row_groups
                n_src = n_grp
            bound = _bound(
                src, n_src, row_min, row_max, float("-inf"), k, 0.0, False, BOUND_NP, BOUND_PASSES, BLOCK_C
            )
            if bound > row_min:
                n_bound = _gather(
                    row_ptr,
                    row_maxima,
                    row_groups,
                    n_sub,
                    n_grp,
                    vocab,
                    bound,
                    cand_ptr,
                    gsel_ptr,
                    sel_ptr,
                    cap,
                    SUB,
                    GROUP,
                    BLOCK,
                    BLOCK_C,
                )
                if n_bound <= cap:
                    n_ready = n_bound
                    lo = bound
                    n = n_bound
        threshold, count, n_ready = _select(
            row_ptr,
            vocab,
            cand_ptr,
            n_ready,
            cap,
            lo,
            n,
            row_max,
            float("-inf"),
            k,
            0.0,
            False,
            NP,
            BLOCK,
            NP_C,
            EXACT_BLOCK,
            WIDE,
            MAX_PASSES,
        )
    return threshold, count, n_ready


@triton.jit(do_not_specialize=["n_chunks"])
def _threshold_kernel(
    logits_ptr,
    row_stride,
    k_ptr,
    p_ptr,
    maxima_ptr,
    groups_ptr,
    stats_ptr,
    cand_base_ptr,
    gsel_base_ptr,
    sel_base_ptr,
    threshold_ptr,
    vocab,
    n_sub,
    n_grp,
    n_chunks,
    cap,
    HAS_P: tl.constexpr,
    NP: tl.constexpr,
    NP_C: tl.constexpr,
    BOUND_NP: tl.constexpr,
    BOUND_PASSES: tl.constexpr,
    SUB: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr,
    EXACT_BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    CHUNKS: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    cand_ptr = cand_base_ptr + row.to(tl.int64) * cap
    sel_ptr = sel_base_ptr + row.to(tl.int64) * cap
    row_maxima = maxima_ptr + row.to(tl.int64) * n_sub
    row_groups = groups_ptr + row.to(tl.int64) * n_grp
    gsel_ptr = gsel_base_ptr + row.to(tl.int64) * n_grp
    row_max, z, row_min, finite = _row_stats(stats_ptr, row, n_chunks, CHUNKS)
    k = tl.load(k_ptr + row).to(tl.int32)
    threshold, count, n_ready = _top_k_threshold(
        row_ptr,
        row_maxima,
        row_groups,
        cand_ptr,
        gsel_ptr,
        sel_ptr,
        vocab,
        n_sub,
        n_grp,
        cap,
        k,
        finite,
        row_min,
        row_max,
        NP,
        NP_C,
        BOUND_NP,
        BOUND_PASSES,
        SUB,
        GROUP,
        BLOCK,
        BLOCK_C,
        EXACT_BLOCK,
        WIDE,
        MAX_PASSES,
    )
    if HAS_P:
        p = tl.load(p_ptr + row)
        if (p < 1.0) & (finite > 0):
            target = p * z
            lo = tl.maximum(threshold, row_min)
            if threshold > float("-inf"):  # top-p over what top-k kept
                src = row_ptr
                n_src = vocab
                if n_ready >= 0:
                    src = cand_ptr
                    n_src = n_ready
                _, _, kept = _pivot_pass(
                    src,
                    n_src,
                    _pivots(threshold, row_max, NP),
                    row_max,
                    threshold,
                    threshold,
                    True,
                    NP,
                    BLOCK_C,
                    False,
                )
                target = p * kept
            else:
                bound = _bound(
                    row_maxima,
                    n_sub,
                    row_min,
                    row_max,
                    float("-inf"),
                    0,
                    target,
                    True,
                    BOUND_NP,
                    BOUND_PASSES,
                    BLOCK_C,
                )
                bound = tl.maximum(bound, _tail_bound(row_max, z, finite, p))
                if bound > row_min:
                    lo = bound  # the whole-row search starts here too (count: at most finite)
                    n_bound = _gather(
                        row_ptr,
                        row_maxima,
                        row_groups,
                        n_sub,
                        n_grp,
                        vocab,
                        bound,
                        cand_ptr,
                        gsel_ptr,
                        sel_ptr,
                        cap,
                        SUB,
                        GROUP,
                        BLOCK,
                        BLOCK_C,
                    )
                    if n_bound <= cap:
                        n_ready = n_bound
                        count = n_bound
            threshold, count, n_ready = _select(
                row_ptr,
                vocab,
                cand_ptr,
                n_ready,
                cap,
                lo,
                count,
                row_max,
                threshold,
                0,
                target,
                True,
                NP,
                BLOCK,
                NP_C,
                EXACT_BLOCK,
                WIDE,
                MAX_PASSES,
            )
    tl.store(threshold_ptr + row, threshold)


@triton.jit
def _mask_kernel(
    logits_ptr,
    row_stride,
    vocab,
    chunk,
    n_sub,
    maxima_ptr,
    threshold_ptr,
    SUB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    t = tl.load(threshold_ptr + row)
    if t > float("-inf"):
        row_ptr = logits_ptr + row.to(tl.int64) * row_stride
        start0 = tl.program_id(1) * chunk
        end = tl.minimum(start0 + chunk, vocab)
        NS: tl.constexpr = BLOCK // SUB
        sub = tl.arange(0, NS)
        col = tl.arange(0, SUB)
        for start in range(start0, end, BLOCK):
            s = start // SUB + sub
            sel = tl.load(maxima_ptr + row.to(tl.int64) * n_sub + s, mask=s < n_sub, other=float("-inf")) >= t
            offs = start + sub[:, None] * SUB + col[None, :]
            inb = offs < vocab  # chunks are whole tiles: only the row end needs a mask
            x = tl.load(row_ptr + offs, mask=inb & sel[:, None], other=float("-inf"))
            tl.store(row_ptr + offs, tl.where(x.to(tl.float32) < t, float("-inf"), x), mask=inb)


class Summary(NamedTuple):
    """What :func:`summarize` leaves on the device for the per-row searches."""

    block: int
    chunks: int
    chunk: int
    n_sub: int
    maxima: torch.Tensor  # [rows * n_sub] float32: the max of each sub-tile
    group: int  # sub-tiles per group
    n_grp: int
    groups: torch.Tensor  # [rows * n_grp] float32: the max of each group of sub-tiles
    stats: torch.Tensor  # [rows * chunks * 4] float32: see ``_STATS``
    counter: torch.Tensor  # [rows] int32, zeroed
    above: torch.Tensor | None  # [rows * chunks] int32: elements above the chosen token per chunk


def summarize(logits: torch.Tensor, need_sum: bool, chosen: torch.Tensor | None = None) -> Summary:
    """Launch ``_summary_kernel`` over ``logits`` (rows split so that small batches fill the device);
    with ``chosen`` (one token id per row) also count, per chunk, the elements above that token."""
    rows, vocab = logits.shape
    dev = logits.device
    block = max(SUB, min(triton.next_power_of_2(vocab), 64 if IS_INTERPRETED else 2048))
    chunks, chunk = row_split(rows, vocab, block, dev)
    n_sub = triton.cdiv(vocab, SUB)
    maxima = scratch("top_k_top_p.maxima", rows * n_sub, torch.float32, dev)
    group = min(GROUP, block // SUB)
    n_grp = triton.cdiv(n_sub, group)
    groups = scratch("top_k_top_p.groups", rows * n_grp, torch.float32, dev)
    stats = scratch("top_k_top_p.stats", rows * chunks * _STATS, torch.float32, dev)
    counter = scratch("top_k_top_p.counter", rows, torch.int32, dev)
    above = None if chosen is None else scratch("top_k_top_p.above", rows * chunks, torch.int32, dev)
    _summary_kernel[(rows, chunks)](
        logits,
        logits.stride(0),
        vocab,
        chunk,
        n_sub,
        maxima,
        n_grp,
        groups,
        stats,
        counter,
        counter if chosen is None else chosen,
        counter if above is None else above,
        NEED_SUM=need_sum,
        SUB=SUB,
        GROUP=group,
        BLOCK=block,
        COUNT_ABOVE=chosen is not None,
        **launch(dev, 8),
    )
    return Summary(block, chunks, chunk, n_sub, maxima, group, n_grp, groups, stats, counter, above)


def search_settings(rows: int, vocab: int, sm: Summary, device: torch.device) -> tuple[int, dict[str, int]]:
    """``(num_warps, constexprs)`` of the per-row search programs.

    H200: the per-row search is latency-bound; few rows want wide programs, many rows narrow ones
    (more of them resident per multiprocessor). ``CHUNKS`` (chunk statistics a row program reads at
    once) is 1 for unsplit rows and otherwise the most chunks any batch splits a row into, so that one
    compiled variant serves every split batch size (and the warm-up covers it) instead of one per
    power of two."""
    chunks = 1 if sm.chunks == 1 else row_split(1, vocab, sm.block, device)[0]
    search_block, warps = SMALL_BATCH_SEARCH if rows <= SMALL_BATCH_ROWS else LARGE_BATCH_SEARCH
    search_block = max(SUB, min(triton.next_power_of_2(vocab), 128 if IS_INTERPRETED else search_block))
    return warps, dict(
        NP=NUM_PIVOTS,
        BLOCK=search_block,
        NP_C=SCRATCH_PIVOTS,
        EXACT_BLOCK=32 if IS_INTERPRETED else 32 * warps,  # one candidate per lane: no register spills
        WIDE=32 if IS_INTERPRETED else 4096,
        CHUNKS=triton.next_power_of_2(chunks),
        MAX_PASSES=MAX_PASSES,
    )


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    if rows == 0 or (k is None and p is None):
        return logits
    dev = logits.device
    row_stride = logits.stride(0)
    sm = summarize(logits, need_sum=p is not None)
    block, chunks, chunk, n_sub, maxima, stats, counter = (
        sm.block,
        sm.chunks,
        sm.chunk,
        sm.n_sub,
        sm.maxima,
        sm.stats,
        sm.counter,
    )
    thresholds = scratch("top_k_top_p.threshold", rows, torch.float32, dev)
    cand = scratch("top_k_top_p.candidates", rows * CAP, logits.dtype, dev)
    p32 = p.to(torch.float32) if p is not None else logits
    warps, exact = search_settings(rows, vocab, sm, dev)
    if k is None:  # top-p alone: split rounds narrow the threshold over the whole device
        partials = scratch(
            "top_k_top_p.partials", TOP_P_ROUNDS * rows * chunks * ROUND_PIVOTS * 2, torch.float32, dev
        )
        split = dict(NP=ROUND_PIVOTS, BLOCK=block, CHUNKS=exact["CHUNKS"], **launch(dev, 8))
        for r in range(TOP_P_ROUNDS):  # small tiles: each element meets ROUND_PIVOTS pivots
            _top_p_round_kernel[(rows, chunks)](
                logits,
                row_stride,
                p32,
                stats,
                partials,
                rows,
                vocab,
                chunk,
                chunks,
                ROUND=r,
                **(split | dict(BLOCK=min(block, ROUND_BLOCK))),
            )
        if TOP_P_FUSED_MASK.get(logits.dtype, False):
            _top_p_mask_collect_kernel[(rows, chunks)](
                logits,
                row_stride,
                p32,
                stats,
                partials,
                maxima,
                counter,
                cand,
                scratch("top_k_top_p.candidate_columns", rows * CAP, torch.int32, dev),
                rows,
                vocab,
                chunk,
                chunks,
                n_sub,
                CAP,
                ROUNDS=TOP_P_ROUNDS,
                SUB=SUB,
                **split,
            )
            _top_p_finish_kernel[(rows,)](
                logits,
                row_stride,
                p32,
                stats,
                partials,
                counter,
                cand,
                scratch("top_k_top_p.candidate_columns", rows * CAP, torch.int32, dev),
                rows,
                vocab,
                chunks,
                CAP,
                ROUNDS=TOP_P_ROUNDS,
                NP_R=ROUND_PIVOTS,
                **launch(dev, warps),
                **exact,
            )
            return logits
        _top_p_bucket_kernel[(rows, chunks)](
            logits,
            row_stride,
            p32,
            stats,
            partials,
            counter,
            cand,
            rows,
            vocab,
            chunk,
            chunks,
            CAP,
            ROUNDS=TOP_P_ROUNDS,
            **split,
        )
        _top_p_threshold_kernel[(rows,)](
            logits,
            row_stride,
            p32,
            stats,
            partials,
            counter,
            cand,
            thresholds,
            rows,
            vocab,
            chunks,
            CAP,
            ROUNDS=TOP_P_ROUNDS,
            NP_R=ROUND_PIVOTS,
            **launch(dev, warps),
            **exact,
        )
    else:
        _threshold_kernel[(rows,)](
            logits,
            row_stride,
            k,
            p32,
            maxima,
            sm.groups,
            stats,
            cand,
            scratch("top_k_top_p.group_list", rows * sm.n_grp, torch.int32, dev),
            scratch("top_k_top_p.subtiles", rows * CAP, torch.int32, dev),
            thresholds,
            vocab,
            n_sub,
            sm.n_grp,
            chunks,
            CAP,
            HAS_P=p is not None,
            BLOCK_C=GATHER_BLOCK,
            BOUND_NP=BOUND_PIVOTS,
            BOUND_PASSES=BOUND_PASSES,
            SUB=SUB,
            GROUP=sm.group,
            **launch(dev, warps),
            **exact,
        )
    _mask_kernel[(rows, chunks)](
        logits, row_stride, vocab, chunk, n_sub, maxima, thresholds, SUB=SUB, BLOCK=block, **launch(dev, 8)
    )
    return logits
