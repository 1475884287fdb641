"""A per-program buffer of the candidates for the ``k`` largest elements, filled while a row streams.

The buffer holds every finite element seen so far that is ``>= thr``, where ``thr`` never exceeds
the ``k``-th largest value seen: first a bound from the maxima of the first tile's units (those
maxima are distinct elements, so if ``k`` of them reach ``v``, at least ``k`` elements do), then,
whenever the buffer fills, the exact ``k``-th largest value of the buffer (a compaction keeps the
entries ``>= `` it). A tile whose maximum is below ``thr`` — most tiles once ``thr`` has risen —
costs one comparison; the entries of the others are appended in slot order (per-slot counts, one
scan across the slots, positions inside a slot in registers). So the buffer of a chunk ends with
every element ``>=`` the chunk's ``k``-th largest value (ties included), and the chunks' buffers of
a row together hold every element ``>=`` the row's ``k``-th largest value: the row's exact search
needs nothing else. A buffer that cannot make room (massive ties) reports an overflow and the row
takes the whole-row search instead.
"""

from __future__ import annotations

import triton
import triton.language as tl

from vllm_ascend.kernels._triton import threshold_search as S


@triton.jit
def _first_bound(umax, k, NPB: tl.constexpr, PASSES: tl.constexpr):
    """A lower bound of the ``k``-th largest element of a tile from its unit maxima ``umax``
    (``-inf`` when fewer than ``k`` units hold a finite element): the largest of ``PASSES`` rounds of
    ``NPB`` pivots with at least ``k`` maxima ``>=`` it."""
    finite = umax > float("-inf")
    n_fin = tl.sum(finite.to(tl.int32), 0)
    lo = tl.min(tl.where(finite, umax, float("inf")), 0)
    top = tl.max(umax, 0)
    idx = tl.arange(0, NPB)
    for _ in tl.static_range(PASSES):
        piv = S._pivots(lo, top, NPB)
        cnt = tl.sum((umax[None, :] >= piv[:, None]).to(tl.int32), 1)
        j = tl.sum((cnt >= k).to(tl.int32), 0)
        lo = tl.where(j == 0, lo, S._take(piv, idx, j - 1, 0.0))
        top = tl.where(j == NPB, top, S._take(piv, idx, j, 0.0))
    return tl.where(n_fin >= k, lo, float("-inf"))


@triton.jit
def _append(buf_v, buf_i, cnt, x, hits, ids, WITH_IDS: tl.constexpr):
    """Append the ``hits`` of a ``[A, NG, V]`` slot tile (values ``x``, token ids ``ids``) after the
    first ``cnt`` entries, slot by slot; returns the new count."""
    h = hits.to(tl.int32)
    in_vec = tl.cumsum(h, 2)  # inside a vector: registers
    per_vec = tl.sum(h, 2)  # [A, NG]
    before_vec = tl.cumsum(per_vec, 0) - per_vec  # earlier vectors of the slot: registers
    per_slot = tl.sum(per_vec, 0)  # [NG]
    before_slot = tl.cumsum(per_slot, 0) - per_slot  # earlier slots: one scan across the program
    pos = cnt + before_slot[None, :, None] + before_vec[:, :, None] + in_vec - 1
    tl.store(buf_v + pos, x, mask=hits)
    if WITH_IDS:
        tl.store(buf_i + pos, ids, mask=hits)
    return cnt + tl.sum(per_slot, 0)


@triton.jit
def _compact(
    buf_v,
    buf_i,
    cnt,
    k,
    WITH_IDS: tl.constexpr,
    BUF: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """Keep the entries ``>=`` the ``k``-th largest of the ``cnt >= k`` in the buffer (in place, order
    kept); returns ``(that value, how many are kept)``. The search streams the buffer in ``BLOCK``
    tiles (one entry per lane), which keeps the streaming loop it runs in light on registers."""
    tl.debug_barrier()  # the appends of every thread are visible
    i = tl.arange(0, BUF)
    inside = i < cnt
    v = tl.load(buf_v + i, mask=inside, other=float("-inf"))
    lo = tl.min(tl.where(inside, v, float("inf")), 0)
    t = S._narrow(
        buf_v, cnt, lo, tl.max(v, 0), cnt, 0.0, float("-inf"), 0, 0.0, k, 0.0, False, NP, BLOCK, MAX_PASSES
    )[0]
    keep = inside & (v >= t)
    pos = tl.cumsum(keep.to(tl.int32), 0) - 1
    if WITH_IDS:
        ids = tl.load(buf_i + i, mask=inside, other=0)
    tl.debug_barrier()  # every entry is read before any moves
    tl.store(buf_v + pos, v, mask=keep)
    if WITH_IDS:
        tl.store(buf_i + pos, ids, mask=keep)
    tl.debug_barrier()
    return t, tl.sum(keep.to(tl.int32), 0)


@triton.jit
def _take_tile(
    buf_v,
    buf_i,
    cnt,
    thr,
    ovf,
    x,
    ids,
    umax,
    k,
    first,
    WITH_IDS: tl.constexpr,
    BUF: tl.constexpr,
    NPB: tl.constexpr,
    BOUND_PASSES: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """One ``[A, NG, V]`` tile (``umax``: its unit maxima) into the buffer; returns
    ``(cnt, thr, ovf)``. The first tile of a program sets ``thr`` from its maxima."""
    if first:
        thr = _first_bound(umax, k, NPB, BOUND_PASSES)
    tile_max = tl.max(umax, 0)
    if (tile_max >= thr) & (tile_max > float("-inf")) & (ovf == 0):
        hits = (x >= thr) & (x > float("-inf"))
        n_hits = tl.sum(tl.sum(tl.sum(hits.to(tl.int32), 2), 0), 0)
        if (cnt + n_hits > BUF) & (cnt >= k):
            thr, cnt = _compact(buf_v, buf_i, cnt, k, WITH_IDS, BUF, NP, BLOCK, MAX_PASSES)
            hits = hits & (x >= thr)
            n_hits = tl.sum(tl.sum(tl.sum(hits.to(tl.int32), 2), 0), 0)
        if cnt + n_hits > BUF:
            ovf = 1
        else:
            cnt = _append(buf_v, buf_i, cnt, x, hits, ids, WITH_IDS)
    return cnt, thr, ovf


@triton.jit
def _merge(base_v, base_i, count_ptr, n_chunks, REGION, WITH_IDS: tl.constexpr, BLOCK: tl.constexpr):
    """Move the lists of a row's chunks (``count_ptr[c]`` entries at ``base + c * REGION``; a negative
    count: that chunk overflowed) into one list at ``base``; returns ``(n, overflowed, min, max)``."""
    n = tl.zeros([], tl.int32)
    ovf = tl.zeros([], tl.int32)
    lane_min = tl.full([BLOCK], float("inf"), tl.float32)
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    i = tl.arange(0, BLOCK)
    for c in range(0, n_chunks):
        cc = tl.load(count_ptr + c)
        ovf = tl.where(cc < 0, 1, ovf)
        cc = tl.maximum(cc, 0)
        src = c * REGION
        for s in range(0, cc, BLOCK):  # forward copy to lower addresses: each block is read first
            inside = s + i < cc
            v = tl.load(base_v + src + s + i, mask=inside, other=float("-inf"))
            lane_min = tl.minimum(lane_min, tl.where(inside, v, float("inf")))
            lane_max = tl.maximum(lane_max, v)
            if c > 0:
                if WITH_IDS:
                    ids = tl.load(base_i + src + s + i, mask=inside, other=0)
                tl.debug_barrier()
                tl.store(base_v + n + s + i, v, mask=inside)
                if WITH_IDS:
                    tl.store(base_i + n + s + i, ids, mask=inside)
                tl.debug_barrier()
        n += cc
    return n, ovf, tl.min(lane_min, 0), tl.max(lane_max, 0)
