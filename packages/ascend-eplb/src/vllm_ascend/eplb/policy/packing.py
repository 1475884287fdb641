"""Vectorised balancing primitives shared by the policies.

Every function works on all MoE layers at once (numpy arrays with a leading ``layers`` axis) so a
policy's Python loops run over items or swap steps, never over layers.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

SWAP_SEARCH = 1024
WIDE_SWAPS = 25
_FORBID = np.float32(1e30)
CHAIN_MAX_SLOTS = 8


def presence(table: np.ndarray, n: int) -> np.ndarray:
    """``[layers, ranks, n]`` bool: does the rank hold the expert (holes, i.e. -1, are ignored)?"""
    layers, ranks = table.shape[:2]
    has = np.zeros((layers, ranks, n + 1), dtype=bool)
    li, ri = np.meshgrid(np.arange(layers), np.arange(ranks), indexing="ij")
    has[li[..., None], ri[..., None], np.where(table < 0, n, table)] = True
    return has[..., :n]


def replica_counts_of(table: np.ndarray, n: int) -> np.ndarray:
    """``[layers, n]`` number of replicas of each logical expert."""
    layers = table.shape[0]
    flat = (np.arange(layers)[:, None] * n + table.reshape(layers, -1)).ravel()
    return np.bincount(flat, minlength=layers * n).reshape(layers, n)


def logical_load(table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
    """Sum per-slot workload ``[..., layers, ranks, slots]`` into logical loads ``[..., layers, n]``."""
    lead = workload.shape[:-3]
    layers = table.shape[0]
    w = workload.reshape(-1, layers, table[0].size)
    idx = (np.arange(layers)[:, None] * n + table.reshape(layers, -1)).ravel()
    out = np.stack([np.bincount(idx, weights=s.ravel(), minlength=layers * n) for s in w])
    return out.reshape(*lead, layers, n)


def replica_counts(load: np.ndarray, total_slots: int, max_per_expert: int) -> np.ndarray:
    """Give each expert one replica, then hand out the rest one by one to the expert with the
    highest per-replica load ``load / count``; no expert gets more than ``max_per_expert`` (one per
    rank). Minimises the largest per-replica load."""
    layers, n = load.shape
    counts = np.ones((layers, n), dtype=np.int64)
    rows = np.arange(layers)
    for _ in range(total_slots - n):
        prio = np.where(counts >= max_per_expert, -np.inf, load / counts)
        counts[rows, np.argmax(prio, axis=1)] += 1
    return counts


def capped_replica_counts(
    load: np.ndarray, total_slots: int, max_per_expert: int, cap: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Replica counts with per-replica loads held at about ``cap`` (per layer) instead of minimised:
    an expert above the cap gets ``ceil(load / cap)`` replicas (at most ``max_per_expert``), the
    others one, and the slots left go one by one to the other experts with the highest per-replica
    load (to the capped ones only when the others are full). Returns the counts and, per layer,
    whether they fit ``total_slots``."""
    layers = load.shape[0]
    hot = load > cap[:, None]
    counts = np.where(hot, np.minimum(max_per_expert, np.ceil(load / np.where(cap > 0, cap, 1)[:, None])), 1)
    counts = counts.astype(np.int64)
    left = total_slots - counts.sum(axis=1)
    rows = np.arange(layers)
    for _ in range(int(left.max(initial=0))):
        room = counts < max_per_expert
        cold_room = room & ~hot
        prio = np.where(cold_room, load / counts, -np.inf)
        prio = np.where(np.any(cold_room, axis=1)[:, None], prio, np.where(room, load / counts, -np.inf))
        act = left > 0
        counts[rows[act], np.argmax(prio, axis=1)[act]] += 1
        left -= act
    return counts, left == 0


def shift_replicas(
    load: np.ndarray, counts: np.ndarray, max_moves: np.ndarray, max_per_expert: int, margin: float = 0.05
) -> np.ndarray:
    """Up to ``max_moves`` times per layer, take a replica from the expert that would carry the least
    per-replica load without it and give it to the expert with the highest per-replica load, while
    the receiver's per-replica load exceeds the donor's would-be one by more than ``margin`` (so
    noise does not shuffle replicas back and forth)."""
    counts = counts.copy()
    rows = np.arange(load.shape[0])
    left = np.broadcast_to(max_moves, rows.shape).astype(np.int64)
    for _ in range(int(left.max(initial=0))):
        per = load / counts
        recv = np.argmax(np.where(counts < max_per_expert, per, -np.inf), axis=1)
        spare = np.where(counts > 1, load / np.maximum(counts - 1, 1), np.inf)
        spare[rows, recv] = np.inf
        donor = np.argmin(spare, axis=1)
        ok = (
            (left > 0)
            & (per[rows, recv] > spare[rows, donor] * (1 + margin))
            & (counts[rows, recv] < max_per_expert)
        )
        if not ok.any():
            break
        counts[rows[ok], recv[ok]] += 1
        counts[rows[ok], donor[ok]] -= 1
        left -= ok
    return counts


def expand_replicas(per_replica: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Items ``[layers, width]``: each expert repeated ``counts`` times, heaviest per-replica weight
    first, padded with -1 (weight 0) where layers have fewer items."""
    layers, n = counts.shape
    totals = counts.sum(axis=1)
    experts = np.repeat(np.tile(np.arange(n), layers), counts.ravel())
    layer_of = np.repeat(np.arange(layers), totals)
    pos = np.arange(experts.size) - np.repeat(np.cumsum(totals) - totals, totals)
    items = np.full((layers, int(totals.max(initial=0))), -1, dtype=np.int64)
    items[layer_of, pos] = experts
    weights = np.where(items >= 0, np.take_along_axis(per_replica, np.maximum(items, 0), axis=1), -np.inf)
    order = np.argsort(-weights, axis=1, kind="stable")
    weights = np.take_along_axis(weights, order, axis=1)
    return np.take_along_axis(items, order, axis=1), np.where(np.isfinite(weights), weights, 0.0)


def fill_holes(
    table: np.ndarray, slot_w: np.ndarray, items: np.ndarray, item_w: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LPT: put each item (in the given order; -1 = padding) on the least-loaded rank that has a
    hole (-1 slot) and does not hold that expert yet. A rank's holes must come after its experts
    (an empty table qualifies); they are filled in order.

    Returns the filled table, its per-slot weights and a per-layer flag for layers where some item
    found no rank (their table keeps holes and must be rejected by the caller).
    """
    table, slot_w = table.copy(), np.where(table < 0, 0.0, slot_w)
    layers, _, slots = table.shape
    rows = np.arange(layers)
    has = np.ascontiguousarray(presence(table, n).transpose(0, 2, 1))  # [layers, n, ranks]
    free = (table < 0).sum(axis=2)
    load = slot_w.sum(axis=2)
    open_load = np.where(free > 0, load, np.inf)  # a full rank takes nothing
    stuck = np.zeros(layers, dtype=bool)
    for k in range(items.shape[1]):
        e = items[:, k]
        ec = np.maximum(e, 0)
        cand = np.where(has[rows, ec], np.inf, open_load)
        r = np.argmin(cand, axis=1)
        ok = (e >= 0) & (cand[rows, r] < np.inf)
        if ok.all():
            li, ri, ei, w = rows, r, ec, item_w[:, k]
        else:
            for layer in np.flatnonzero((e >= 0) & ~ok):
                stuck[layer] |= not _relocate(
                    table[layer],
                    slot_w[layer],
                    has[layer].T,
                    load[layer],
                    free[layer],
                    int(e[layer]),
                    float(item_w[layer, k]),
                )
                open_load[layer] = np.where(free[layer] > 0, load[layer], np.inf)
            li, ri, ei, w = rows[ok], r[ok], ec[ok], item_w[ok, k]
        si = slots - free[li, ri]
        table[li, ri, si] = ei
        slot_w[li, ri, si] = w
        load[li, ri] += w
        free[li, ri] -= 1
        open_load[li, ri] = np.where(free[li, ri] > 0, load[li, ri], np.inf)
        has[li, ei, ri] = True
    return table, slot_w, stuck


def lpt_pack(
    load: np.ndarray, counts: np.ndarray, ranks: int, slots: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fresh LPT packing of every replica into an empty ``[layers, ranks, slots]`` table."""
    items, weights = expand_replicas(load / counts, counts)
    empty = np.full((load.shape[0], ranks, slots), -1, dtype=np.int64)
    return fill_holes(empty, np.zeros(empty.shape), items, weights, load.shape[1])


def _relocate(
    table: np.ndarray,
    slot_w: np.ndarray,
    has: np.ndarray,
    load: np.ndarray,
    free: np.ndarray,
    e: int,
    w: float,
) -> bool:
    """One layer, no hole-rank lacks ``e``: move some expert ``x`` from a rank ``b`` lacking ``e``
    into a hole on rank ``h`` lacking ``x``, then put ``e`` where ``x`` was. Updates in place."""
    holes = [h for h in np.argsort(load) if free[h] > 0]
    for b in np.argsort(load):
        if has[b, e]:
            continue
        for s in np.argsort(slot_w[b]):
            x = table[b, s]
            if x < 0:
                continue
            for h in holes:
                if h == b or has[h, x]:
                    continue
                hs = int(np.argmax(table[h] < 0))
                table[h, hs], slot_w[h, hs] = x, slot_w[b, s]
                has[h, x], free[h], load[h] = True, free[h] - 1, load[h] + slot_w[b, s]
                load[b] += w - slot_w[b, s]
                has[b, x], has[b, e] = False, True
                table[b, s], slot_w[b, s] = e, w
                return True
    return False


def keep_slots(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Reorder each rank of ``new`` so experts it shares with ``old`` keep their old slot; incoming
    experts take the remaining slots in order."""
    layers, ranks, slots = new.shape
    o = old.reshape(-1, slots)
    w = new.reshape(-1, slots)
    eq = o[:, :, None] == w[:, None, :]  # [rows, old slot, new slot]
    kept_old = eq.any(axis=2)
    kept_new = eq.any(axis=1)
    out = np.where(kept_old, o, -1)
    idx = np.arange(slots)
    free_order = np.argsort(np.where(kept_old, slots + idx, idx), axis=1, kind="stable")
    inc_order = np.argsort(np.where(kept_new, slots + idx, idx), axis=1, kind="stable")
    n_inc = (~kept_new).sum(axis=1)
    rows, pos = np.nonzero(idx[None, :] < n_inc[:, None])
    out[rows, free_order[rows, pos]] = w[rows, inc_order[rows, pos]]
    return out.reshape(layers, ranks, slots)


def align_ranks(old: np.ndarray, new: np.ndarray, n: int) -> np.ndarray:
    """Permute the ranks of ``new`` (Hungarian matching on shared experts) to keep most experts in
    place, then keep shared experts in their old slots."""
    layers = new.shape[0]
    old_has = presence(old, n).transpose(0, 2, 1)  # [layers, n, ranks]
    shared = old_has[np.arange(layers)[:, None, None], new].sum(axis=2)  # [layers, new rank, old rank]
    aligned = np.empty_like(new)
    for layer in range(layers):
        row, col = linear_sum_assignment(shared[layer], maximize=True)
        aligned[layer, col] = new[layer, row]
    return keep_slots(old, aligned)


def swap_refine(
    table: np.ndarray,
    slot_w: np.ndarray,
    n: int,
    max_swaps: int,
    min_gain: np.ndarray,
    max_moved: np.ndarray | None = None,
    candidates: int | None = 8,
    depth: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Swap one expert of the most-loaded rank with one of a lightly loaded rank while the pair's
    peak drops by more than ``min_gain`` (per layer); at most ``max_swaps`` steps, and at most
    ``max_moved`` changed slots per layer when given. The ``candidates`` lightest ranks are the partners;
    ``None`` picks at most the lighter half, as many as keep one step near ``SWAP_SEARCH`` candidate
    pairs per layer (at least 8). With ``depth`` > 1, a layer whose heaviest rank has no such swap
    tries its next-heaviest ranks (down to the ``depth``-th), so the ranks just below the peak are
    lowered too (the next window's peak is often one of them). The search runs in float32; loads are
    kept in float64."""
    table, slot_w = table.copy(), slot_w.copy()
    layers, ranks, slots = table.shape
    if ranks < 2:
        return table, slot_w
    k = min(ranks - 1, candidates or max(8, min(ranks // 2, SWAP_SEARCH // slots**2)))
    has = np.ascontiguousarray(presence(table, n))
    has_flat = has.reshape(-1)  # a view: updated together with ``has``
    w32 = slot_w.astype(np.float32)
    load = slot_w.sum(axis=2)
    moved = np.zeros(layers, dtype=np.int64)
    min_gain = np.broadcast_to(min_gain, (layers,))
    rows = np.arange(layers)
    level = np.zeros(layers, dtype=np.int64)
    dmax = min(depth, ranks)
    for _ in range(max_swaps):
        if max_moved is not None:
            rows = rows[moved[rows] + 2 <= max_moved[rows]]
        if not rows.size:
            break
        m, r1 = rows.size, rows[:, None]
        lr = load[rows]
        a = np.argmax(lr, axis=1)
        deeper = np.flatnonzero(level[rows] > 0)
        if deeper.size:  # the level-th heaviest rank where the heavier ones had no gain
            top = np.argpartition(-lr[deeper], dmax - 1, axis=1)[:, :dmax]
            top = np.take_along_axis(
                top, np.argsort(-np.take_along_axis(lr[deeper], top, axis=1), axis=1), axis=1
            )
            a[deeper] = top[np.arange(deeper.size), level[rows[deeper]]]
        la = lr[np.arange(m), a]
        light = np.argpartition(lr, k - 1, axis=1)[:, :k]  # [m, k]
        pair_rank = r1 * ranks + light  # [m, k] flat (layer, rank) index of each partner
        ea, eb = table[rows, a], table.reshape(-1, slots)[pair_rank]  # [m, slots], [m, k, slots]
        # forbidden exchanges (the expert is already on the other rank, a hole, or the partner is
        # the rank itself) get a huge finite weight, so their drop is hugely negative without a mask
        ea_on_b = has_flat[(pair_rank * n)[:, :, None] + ea[:, None, :]].transpose(0, 2, 1)  # [m, slots_a, k]
        wa = np.where(ea_on_b | (ea < 0)[:, :, None], -_FORBID, w32[rows, a][:, :, None])
        eb_on_a = has_flat[((rows * ranks + a) * n)[:, None, None] + eb]  # [m, k, slots_b]
        wb = np.where(eb_on_a | (eb < 0), _FORBID, w32.reshape(-1, slots)[pair_rank]).reshape(m, 1, -1)
        gap = np.where(light == a[:, None], -_FORBID, la[:, None] - lr[np.arange(m)[:, None], light])
        # delta[m, slots_a, (k, slots_b)]: flattened partner axis keeps numpy's inner loops long
        delta = np.repeat(wa, slots, axis=2) - wb
        # the pair's new peak is max(la - delta, lb + delta): its drop is min(delta, la - lb - delta)
        drop = np.repeat(gap.astype(np.float32), slots, axis=1)[:, None, :] - delta
        gain = np.minimum(delta, drop, out=delta).reshape(m, -1)
        best = np.argmax(gain, axis=1)
        go = gain[np.arange(m), best] > min_gain[rows]
        level[rows] = np.where(go, 0, level[rows] + 1)
        keep = rows[go | (level[rows] < min(depth, ranks - 1))]  # without a gain at any level: done
        rows, a, light, best = rows[go], a[go], light[go], best[go]
        if not rows.size:
            rows = keep
            continue
        i, kb, j = np.unravel_index(best, (slots, k, slots))
        _swap_slots(table, slot_w, w32, has, load, moved, rows, a, i, light[np.arange(rows.size), kb], j)
        rows = keep
    return table, slot_w


def _swap_slots(
    table: np.ndarray,
    slot_w: np.ndarray,
    w32: np.ndarray,
    has: np.ndarray,
    load: np.ndarray,
    moved: np.ndarray,
    layers: np.ndarray,
    r1: np.ndarray,
    s1: np.ndarray,
    r2: np.ndarray,
    s2: np.ndarray,
) -> None:
    """Exchange slot ``(r1, s1)`` with ``(r2, s2)`` per layer, updating the weights, presence and
    rank-load bookkeeping of the swap searches in place."""
    e1, e2 = table[layers, r1, s1], table[layers, r2, s2]
    w1, w2 = slot_w[layers, r1, s1], slot_w[layers, r2, s2]
    table[layers, r1, s1], table[layers, r2, s2] = e2, e1
    slot_w[layers, r1, s1], slot_w[layers, r2, s2] = w2, w1
    w32[layers, r1, s1], w32[layers, r2, s2] = w2, w1
    has[layers, r1, e1], has[layers, r2, e2] = False, False
    has[layers, r1, e2], has[layers, r2, e1] = True, True
    load[layers, r1] += w2 - w1
    load[layers, r2] += w1 - w2
    moved[layers] += 2


def chain_refine(
    table: np.ndarray,
    slot_w: np.ndarray,
    n: int,
    max_steps: int,
    min_gain: np.ndarray,
    max_moved: np.ndarray,
    firsts: int = 8,
    partners: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
    """Two-swap ejection chains off the peak rank, for placements where single swaps stall.

    The peak rank ``a`` hands an expert to a rank ``x`` for a lighter one, which may push ``x``
    above the old peak; ``x`` then swaps with one of the ``partners`` lightest ranks. The ``firsts``
    first swaps are picked by ``max(a after, min(x after, old peak))`` (x's best slot for each of
    a's slots and each rank x); among them the chain (or the plain swap, when ``x`` stays below
    the peak) with the lowest resulting max over the touched ranks is applied when it lowers the
    peak by more than ``min_gain``; at most
    four changed slots per step and ``max_moved`` per layer. Under strong skew with redundancy the
    peak rank often holds two hot replicas that no single swap can move (every other rank holds
    one too); a chain moves one to a rank whose light experts go on. So only layers whose peak rank
    holds two replicas of at least a third of the mean rank load each, and with at most
    ``CHAIN_MAX_SLOTS`` slots per rank, are searched (with many slots single swaps have enough small
    experts to work with, and the search grows with slots²). Runs in float32."""
    table, slot_w = table.copy(), slot_w.copy()
    layers, ranks, slots = table.shape
    if ranks < 3 or slots > CHAIN_MAX_SLOTS:
        return table, slot_w
    t_first, q_n = min(firsts, (ranks - 1) * slots), min(partners, ranks - 2) + 2
    has = np.ascontiguousarray(presence(table, n))
    has_flat = has.reshape(-1)
    w32 = slot_w.astype(np.float32)
    load = slot_w.sum(axis=2)
    moved = np.zeros(layers, dtype=np.int64)
    min_gain = np.broadcast_to(min_gain, (layers,))
    heavy = load.mean(axis=1) / 3
    rows = np.arange(layers)
    rank_ids = np.arange(ranks)
    for _ in range(max_steps):
        rows = rows[moved[rows] + 4 <= max_moved[rows]]
        a = np.argmax(load[rows], axis=1)
        rows, a = (v[(slot_w[rows, a] >= heavy[rows, None]).sum(axis=1) >= 2] for v in (rows, a))
        if not rows.size:
            break
        m, mi = rows.size, np.arange(rows.size)
        lr = load[rows].astype(np.float32)
        peak = lr[mi, a]
        light = np.argpartition(lr, q_n - 1, axis=1)[:, :q_n]  # [m, Q] (a or x may be among them)
        ea, tx = table[rows, a], table[rows]  # [m, slots], [m, ranks, slots]
        # first swap a's slot i <-> x's slot j; forbidden pairs priced out of reach
        ea_on_x = has_flat[((rows[:, None] * ranks + rank_ids) * n)[:, :, None] + ea[:, None, :]]  # [m, x, i]
        wa_x = np.where(ea_on_x.transpose(0, 2, 1), -_FORBID, w32[rows, a][:, :, None])  # [m, i, x]
        ex_on_a = has_flat[((rows * ranks + a) * n)[:, None, None] + tx] | (rank_ids == a[:, None])[..., None]
        wx_a = np.where(ex_on_a, _FORBID, w32[rows])  # [m, x, j]
        # layout [m, j, i, x]: the reductions over x's slot j and the inner loops run over i·x
        d = wa_x[:, None] - wx_a.transpose(0, 2, 1)[:, :, None, :]
        pk = peak[:, None, None, None]
        key = np.maximum(pk - d, np.minimum(lr[:, None, None, :] + d, pk))
        key_ix, jbest = key[:, 0], np.zeros((m, slots, ranks), dtype=np.int64)
        for jj in range(1, slots):  # x's best slot for each (i, x), slice by slice (fast in numpy)
            lower = key[:, jj] < key_ix
            key_ix, jbest = np.where(lower, key[:, jj], key_ix), np.where(lower, jj, jbest)
        key_ix = key_ix.reshape(m, -1)
        pick = np.argpartition(key_ix, t_first - 1, axis=1)[:, :t_first]  # [m, T]
        i, x = np.unravel_index(pick, (slots, ranks))
        j = np.take_along_axis(jbest.reshape(m, -1), pick, axis=1)
        dd = d[mi[:, None], j, i, x]
        na, nx = peak[:, None] - dd, lr[mi[:, None], x] + dd
        plain = np.where(nx < peak[:, None], np.maximum(na, nx), np.inf)  # [m, T]
        # fix: x (after the first swap) swaps its slot p with slot s of a light rank q
        mt = mi[:, None]
        e_in, w_in = ea[mt, i], w32[rows[:, None], a[:, None], i]  # [m, T]
        x_items, x_w = tx[mt, x].copy(), w32[rows[:, None], x].copy()  # [m, T, slots]
        np.put_along_axis(x_items, j[..., None], e_in[..., None], axis=2)
        np.put_along_axis(x_w, j[..., None], w_in[..., None], axis=2)
        qflat = (rows[:, None] * ranks + light) * n  # [m, Q]
        bad_q = (light[:, None, :] == x[..., None]) | (light == a[:, None])[:, None, :]  # [m, T, Q]
        xp_on_q = (
            has_flat[qflat[:, None, None, :] + x_items[..., None]] | bad_q[:, :, None, :]
        )  # [m, T, p, Q]
        x_wq = np.where(xp_on_q, -_FORBID, x_w[..., None])
        q_items = tx[mt, light]  # [m, Q, slots]
        eq_on_x = has_flat[((rows[:, None] * ranks + x) * n)[:, :, None, None] + q_items[:, None]]
        eq_on_x |= q_items[:, None] == e_in[:, :, None, None]  # [m, T, Q, s]
        q_wx = np.where(eq_on_x, _FORBID, w32[rows[:, None], light][:, None])  # [m, T, Q, s]
        # d2[m, T, p, (Q, s)]: flattened partner axis keeps numpy's inner loops long
        d2 = np.repeat(x_wq, slots, axis=3) - q_wx.reshape(m, t_first, 1, -1)
        lq = np.repeat(lr[mt, light], slots, axis=1)[:, None, None, :]
        val = np.maximum(nx[:, :, None, None] - d2, lq + d2).reshape(m, t_first, -1)
        fix = np.argmin(val, axis=2)  # [m, T]
        chained = np.maximum(na, np.take_along_axis(val, fix[..., None], axis=2)[..., 0])
        use_chain = chained < plain
        value = np.minimum(plain, chained)
        best = np.argmin(value, axis=1)
        go = value[mi, best] < peak - min_gain[rows]
        if not go.any():
            break
        g = np.flatnonzero(go)
        li, bi = rows[g], best[g]
        p, qk, si = np.unravel_index(fix[g, bi], (slots, q_n, slots))
        steps = (
            (a[g], i[g, bi], x[g, bi], j[g, bi], np.ones(g.size, dtype=bool)),
            (x[g, bi], p, light[g, qk], si, use_chain[g, bi]),
        )
        for r1, s1, r2, s2, sel in steps:
            _swap_slots(table, slot_w, w32, has, load, moved, li[sel], r1[sel], s1[sel], r2[sel], s2[sel])
        rows = rows[go]
    return table, slot_w


def swap_threshold(
    load: np.ndarray, counts: np.ndarray, ranks: int, coarse: float, fine: float
) -> np.ndarray:
    """Per-layer least peak drop a swap must bring: ``fine`` × the mean rank load where one replica
    alone outweighs the mean (its rank's peak is that replica plus partners, so every lighter
    partner is a real reduction), else ``coarse`` × the mean (smaller swaps of a layer that can
    reach the mean mostly chase the window's noise and cost moves and time)."""
    mean = load.sum(axis=1) / ranks
    dominant = (load / np.maximum(counts, 1)).max(axis=1) > mean
    return np.where(dominant, fine, coarse) * mean


def slot_weights(table: np.ndarray, load: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
    """Per-slot share ``load[e] / count[e]`` for a table (replicas split their expert's load evenly)."""
    n = load.shape[-1]
    if counts is None:
        counts = replica_counts_of(table, n)
    per = load / np.maximum(counts, 1)
    layers = table.shape[0]
    return np.take_along_axis(per, table.reshape(layers, -1), axis=1).reshape(table.shape)


def rank_loads(table: np.ndarray, load: np.ndarray) -> np.ndarray:
    """``[layers, ranks]`` load per rank when replicas split their expert's load evenly."""
    return slot_weights(table, load).sum(axis=2)


def risk_peak(slot_w: np.ndarray, spread: float, z: float) -> np.ndarray:
    """Per layer: the largest rank load plus ``z`` standard deviations, when every replica's load may be off by
    ``spread`` (relative) independently of the other experts on its rank: ``max_r Σw + z·spread·√(Σw²)`` over
    the per-slot weights ``[layers, ranks, slots]``. With ``spread`` 0 it is the peak rank load."""
    return (slot_w.sum(axis=2) + z * spread * np.sqrt((slot_w**2).sum(axis=2))).max(axis=1)


def imbalance(table: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Per-layer max/mean rank load (1.0 for an idle layer)."""
    r = rank_loads(table, load)
    mean = r.mean(axis=1)
    return np.where(mean > 0, r.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)


def moved_slots(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Per layer: number of slots whose logical expert changed."""
    return (old != new).sum(axis=(1, 2))


def retarget_replicas(
    table: np.ndarray, load: np.ndarray, target: np.ndarray, max_moved: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Move towards the replica counts ``target`` one changed slot at a time: each missing replica
    (heaviest per-replica share first) overwrites a surplus replica of another expert, picking, among
    all slots of experts that still have a surplus, the one whose rank ends up least loaded (and does
    not hold the expert yet); at most ``max_moved`` slots per layer.

    The landing rank is not fixed by which surplus copy would be dropped first: under strong skew a new replica of a hot expert weighs about a whole rank's mean
    load and must land where the rest of the rank is light. Returns the table and its per-slot
    weights (shares under the counts actually reached)."""
    layers, ranks, slots = table.shape
    n = load.shape[1]
    rows = np.arange(layers)
    current = replica_counts_of(table, n)
    surplus = np.maximum(current - target, 0)
    per = load / np.maximum(target, 1)
    items, item_w = expand_replicas(per, np.maximum(target - current, 0))
    flat = table.reshape(layers, -1).copy()
    w = np.take_along_axis(per, flat, axis=1)
    rank_load = w.reshape(layers, ranks, slots).sum(axis=2)
    has = presence(table, n)
    rank_of = np.repeat(np.arange(ranks), slots)
    budget = np.broadcast_to(max_moved, (layers,))
    for k in range(min(items.shape[1], int(budget.max(initial=0)))):
        e = items[:, k]
        act = (e >= 0) & (k < budget)
        if not act.any():
            break
        ec = np.maximum(e, 0)
        cand = (surplus[rows[:, None], flat] > 0) & ~has[rows, :, ec][:, rank_of]
        after = np.where(cand, rank_load[:, rank_of] - w + item_w[:, k, None], np.inf)
        pick = np.argmin(after, axis=1)
        ok = act & np.isfinite(after[rows, pick])
        li, si = rows[ok], pick[ok]
        ri, old = rank_of[si], flat[li, si]
        surplus[li, old] -= 1
        has[li, ri, old], has[li, ri, ec[ok]] = False, True
        rank_load[li, ri] += item_w[ok, k] - w[li, si]
        flat[li, si], w[li, si] = ec[ok], item_w[ok, k]
    out = flat.reshape(table.shape)
    return out, slot_weights(out, load)


def swap_refine_widening(
    table: np.ndarray,
    slot_w: np.ndarray,
    n: int,
    max_swaps: int,
    min_gain: np.ndarray,
    max_moved: np.ndarray,
    depth: int = 1,
) -> np.ndarray:
    """:func:`swap_refine` with the default partner width, then (at most ``WIDE_SWAPS`` swaps) with
    every rank as a partner for the layers that stalled (changed fewer than ``2·max_swaps`` slots),
    within one shared move budget."""
    first, first_w = swap_refine(
        table, slot_w, n, max_swaps, min_gain, max_moved, candidates=None, depth=depth
    )
    used = moved_slots(table, first)
    left = np.where(used >= 2 * max_swaps, 0, max_moved - used)
    return swap_refine(first, first_w, n, WIDE_SWAPS, min_gain, left, candidates=table.shape[1] - 1)[0]


def better(old: np.ndarray, new: np.ndarray, load: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """Per layer: does ``new`` lower max/mean by more than ``margin`` (relative), or keep it while
    lowering the spread of rank loads (progress hidden behind a tie at the peak)?"""
    r_old, r_new = rank_loads(old, load), rank_loads(new, load)
    peak_old, peak_new = r_old.max(axis=1), r_new.max(axis=1)
    spread_old, spread_new = (r_old**2).sum(axis=1), (r_new**2).sum(axis=1)
    return (peak_new * (1 + margin) < peak_old) | (
        (peak_new <= peak_old) & (spread_new < spread_old * (1 - 1e-9))
    )


def repack_extremes(
    table: np.ndarray, slot_w: np.ndarray, n: int, max_moved: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Large-neighbourhood step for placements where single swaps stall: pool the items of the
    ``k`` heaviest and ``k`` lightest ranks, re-pack them by LPT, match the new ranks to the old
    ones (Hungarian) and keep stayers in their slots. Accepted per layer when the pooled peak
    drops and the changed slots fit ``max_moved``; ``k`` is the largest with ``2·k·slots`` in budget."""
    layers, ranks, slots = table.shape
    k = int(min(ranks // 2, max_moved.max(initial=0) // (2 * slots)))
    if k < 1:
        return table, slot_w
    order = np.argsort(slot_w.sum(axis=2), axis=1)
    pick = np.concatenate([order[:, -k:], order[:, :k]], axis=1)  # [layers, 2k]
    rows = np.arange(layers)[:, None]
    sub, sub_w = table[rows, pick], slot_w[rows, pick]  # [layers, 2k, slots]
    flat, flat_w = sub.reshape(layers, -1), sub_w.reshape(layers, -1)
    by_weight = np.argsort(-flat_w, axis=1, kind="stable")
    items, weights = (
        np.take_along_axis(flat, by_weight, axis=1),
        np.take_along_axis(flat_w, by_weight, axis=1),
    )
    packed, _, stuck = fill_holes(np.full_like(sub, -1), np.zeros(sub.shape), items, weights, n)
    aligned = align_ranks(sub, np.where(stuck[:, None, None], sub, packed), n)
    per_slot = expert_weights_of(sub, sub_w, n)
    aligned_w = np.take_along_axis(per_slot, aligned.reshape(layers, -1), axis=1).reshape(sub.shape)
    ok = ~stuck & (aligned_w.sum(axis=2).max(axis=1) < sub_w.sum(axis=2).max(axis=1) * (1 - 1e-9))
    ok &= (aligned != sub).sum(axis=(1, 2)) <= max_moved
    table, slot_w = table.copy(), slot_w.copy()
    li = np.flatnonzero(ok)
    table[li[:, None], pick[li]] = aligned[li]
    slot_w[li[:, None], pick[li]] = aligned_w[li]
    return table, slot_w


def expert_weights_of(table: np.ndarray, slot_w: np.ndarray, n: int) -> np.ndarray:
    """``[layers, n]`` per-replica weight of each expert as found in ``table`` (0 where absent)."""
    layers = table.shape[0]
    out = np.zeros((layers, n))
    out[np.arange(layers)[:, None], table.reshape(layers, -1)] = slot_w.reshape(layers, -1)
    return out


def risk_load(
    mu: np.ndarray, var: np.ndarray, counts: np.ndarray, ranks: int, z: float, horizon: int
) -> np.ndarray:
    """Loads ``[layers, n]`` whose per-replica share ``load / counts`` prices a rank's risk additively.

    Over ``horizon`` steps a rank's load has mean ``h·m_r`` (``m_r = Σ μ/c``) and variance ``h·v_r``
    (``v_r = Σ var/c²``, replicas of one expert move together). Linearising ``h·m_r + z·√(h·v_r)``
    around the average rank variance ``v̄`` gives per replica ``μ/c + β·var/c²`` with
    ``β = z / (2·√(h·v̄))``, which the additive packing primitives can use directly."""
    counts = np.maximum(counts, 1)
    vbar = (var / counts).sum(axis=1, keepdims=True) / ranks
    beta = np.where(vbar > 0, z / (2 * np.sqrt(horizon * np.where(vbar > 0, vbar, 1))), 0.0)
    return mu + beta * var / counts


def aggregate_score(table: np.ndarray, samples: np.ndarray, z: float) -> np.ndarray:
    """Per layer: ``max_r(T_r + z·σ_r) / mean_r T_r`` of the window aggregate.

    ``samples`` ``[k, layers, n]`` are consecutive load samples; ``T_r`` is a rank's summed load
    over them and ``σ_r = √k ·`` the standard deviation of its per-sample loads, which includes the
    covariance between the experts the rank holds."""
    layers, ranks, slots = table.shape
    k, _, n = samples.shape
    counts = replica_counts_of(table, n)
    share = (samples / np.maximum(counts, 1)).reshape(k, -1)
    flat = (np.arange(layers)[:, None] * n + table.reshape(layers, -1)).ravel()
    per_rank = share[:, flat].reshape(k, layers, ranks, slots).sum(-1)
    total = per_rank.sum(axis=0)
    risk = total + z * np.sqrt(k) * per_rank.std(axis=0)
    mean = total.mean(axis=1)
    return np.where(mean > 0, risk.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
