"""Triton logprob kernels.

Token logprobs: an online log-sum-exp per row chunk. Large batches and short rows run one program
per row (one chunk) and write the result directly. Batches of fewer rows than multiprocessors with
long rows split each row into chunks so that every multiprocessor streams; each program writes its
chunk's ``(max, sum of exp(x - max))`` and the row's last program to finish (:func:`.common.last_chunk`)
merges them and writes the row: one launch either way. The chunk count is a runtime argument.

Top-``n`` logprobs reuse the top-k machinery of :mod:`.top_k_top_p`: its summary launch gives the
log-sum-exp, the chosen token's rank (elements above it, per chunk) and the sub-tile maxima; one
program per row then finds ``t``, the ``n``-th largest value, exactly (a bound from the maxima, the
few sub-tiles that reach it, exact passes), lists the sub-tiles whose max reaches ``t`` and takes
their elements ``> t`` and, in token order, as many ``== t`` as ``n`` needs; the fewer than ``n``
elements above ``t`` are ordered by pairwise ranks (larger first, the lower token id among equals).
A row is read once; the search touches the maxima and a few sub-tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels._triton import top_k_top_p as tkp
from vllm_ascend.kernels._triton.common import (
    IS_INTERPRETED,
    ROW_WARPS,
    SMALL_BATCH_ROWS,
    check_logits,
    cores,
    counters,
    last_chunk,
    row_block,
    row_split,
    scratch,
    slot_shape,
    slots,
    ub_cap,
)

COMBINE_BLOCK = 128
PER_SM = 2  # batches of fewer rows than multiprocessors: split for this many programs per multiprocessor
# (H200: 64 x 151936 took 23.7 us split 3 ways, 20.9 split 5 ways; 256 rows run best unsplit)
# ... and only rows of at least this many tiles (H200, with a separate combine launch then: a split
# 64 x 32000 row set took 11.2 us against 9.2 unsplit, while 64 x 151936 gained, 24.3 -> 22.8).
MIN_SPLIT_TILES = 1 if IS_INTERPRETED else 16


@triton.jit
def _chunk_lse(row_ptr, begin, end, A: tl.constexpr, NG: tl.constexpr, V: tl.constexpr):
    """``(max, sum of exp(x - max))`` over ``[begin, end)`` of a row (float32). Slot tiles: each thread
    rescales its running sum once per tile (by its slot's max), so a token costs one exponential."""
    TILE: tl.constexpr = A * NG * V
    local = slots(A, NG, V)
    run_max = tl.full([NG], float("-inf"), tl.float32)
    run_sum = tl.zeros([NG], tl.float32)
    nxt = tl.load(row_ptr + begin + local, mask=begin + local < end, other=float("-inf"))
    for start in range(begin, end, TILE):
        x = nxt.to(tl.float32)
        offs = start + TILE + local
        nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
        new_max = tl.maximum(run_max, tl.max(tl.max(x, 2), 0))
        safe = tl.where(new_max > float("-inf"), new_max, 0.0)
        run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(tl.sum(tl.exp(x - safe[None, :, None]), 2), 0)
        run_max = new_max
    m = tl.max(run_max, 0)
    safe = tl.where(m > float("-inf"), m, 0.0)
    return m, tl.sum(run_sum * tl.exp(run_max - safe), 0)


@triton.jit
def _combine(part_m_ptr, part_s_ptr, base, num_chunks, CB: tl.constexpr):
    """Log-sum-exp of one row from its ``num_chunks`` partials at ``base``."""
    m = tl.full([], float("-inf"), tl.float32)
    for c0 in range(0, num_chunks, CB):
        c = c0 + tl.arange(0, CB)
        m = tl.maximum(m, tl.max(tl.load(part_m_ptr + base + c, mask=c < num_chunks, other=float("-inf")), 0))
    safe = tl.where(m > float("-inf"), m, 0.0)
    total = tl.zeros([], tl.float32)
    for c0 in range(0, num_chunks, CB):
        c = c0 + tl.arange(0, CB)
        mask = c < num_chunks
        pm = tl.load(part_m_ptr + base + c, mask=mask, other=float("-inf"))
        ps = tl.load(part_s_ptr + base + c, mask=mask, other=0.0)
        total += tl.sum(ps * tl.exp(pm - safe), 0)
    return m + tl.log(total)


@triton.jit
def _store_token_logprobs(row_ptr, row, lse, ids_ptr, num_ids, out_ptr, IDS: tl.constexpr):
    k = tl.arange(0, IDS)
    valid = k < num_ids
    ids = tl.load(ids_ptr + row * num_ids + k, mask=valid, other=0)
    x = tl.load(row_ptr + ids, mask=valid).to(tl.float32)
    tl.store(out_ptr + row * num_ids + k, x - lse, mask=valid)


@triton.jit(do_not_specialize=["num_chunks"])
def _token_logprob_kernel(
    logits_ptr,
    row_stride,
    ids_ptr,
    num_ids,
    out_ptr,
    part_m_ptr,
    part_s_ptr,
    counter_ptr,
    vocab,
    chunk,
    num_chunks,
    IDS: tl.constexpr,
    CB: tl.constexpr,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    begin = part * chunk
    m, s = _chunk_lse(row_ptr, begin, tl.minimum(begin + chunk, vocab), A, NG, V)
    if num_chunks == 1:
        _store_token_logprobs(row_ptr, row, m + tl.log(s), ids_ptr, num_ids, out_ptr, IDS)
    else:
        tl.store(part_m_ptr + row * num_chunks + part, m)
        tl.store(part_s_ptr + row * num_chunks + part, s)
        if last_chunk(counter_ptr, row, num_chunks):
            lse = _combine(part_m_ptr, part_s_ptr, row * num_chunks, num_chunks, CB)
            _store_token_logprobs(row_ptr, row, lse, ids_ptr, num_ids, out_ptr, IDS)


def _split(
    rows: int, vocab: int, dtype: torch.dtype, device: torch.device
) -> tuple[dict[str, int], int, int]:
    """``(slot shape, chunks, chunk)``; unsplit rows keep the one-program-per-row tiles (few rows: each
    program needs more bytes in flight, H200: 8192 best up to ~128 rows)."""
    a, ng, v = slot_shape(row_block(vocab, ub_cap(device, 4096)), ROW_WARPS, dtype)
    tile = a * ng * v
    chunks, chunk = row_split(rows, vocab, tile, device, PER_SM)
    if rows < cores(device) and chunks > 1 and triton.cdiv(vocab, tile) >= MIN_SPLIT_TILES:
        return dict(A=a, NG=ng, V=v), chunks, chunk
    cap = ub_cap(device, 8192 if rows <= SMALL_BATCH_ROWS else 4096)
    a, ng, v = slot_shape(row_block(vocab, cap), ROW_WARPS, dtype)
    return dict(A=a, NG=ng, V=v), 1, triton.cdiv(vocab, a * ng * v) * a * ng * v


def compute_token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    ids = token_ids.reshape(rows, -1).contiguous()
    out = torch.empty(ids.shape, dtype=torch.float32, device=logits.device)
    if out.numel():
        shape, chunks, chunk = _split(rows, vocab, logits.dtype, logits.device)
        part_m, part_s = (
            scratch(name, rows * chunks, torch.float32, logits.device) for name in ("lse_m", "lse_s")
        )
        n_ids = ids.shape[1]
        width = triton.next_power_of_2(n_ids)
        _token_logprob_kernel[(rows, chunks)](
            logits, logits.stride(0), ids, n_ids, out, part_m, part_s,
            counters("lse_counter", rows, logits.device), vocab, chunk, chunks,
            IDS=width, CB=COMBINE_BLOCK, **launch(logits.device, ROW_WARPS), **shape,
        )  # fmt: skip
    return out.reshape(token_ids.shape)


RANK_BLOCK = 32  # entries compared per step when ranking the elements above t
MIN_PAD = 32  # one compiled variant serves every n up to this (vLLM's default max_logprobs is 20)


@triton.jit
def _collect(
    row_ptr,
    row_maxima,
    row_groups,
    n_sub,
    n_grp,
    vocab,
    t,
    n,
    gsel_ptr,
    sel_ptr,
    cap,
    buf_v_ptr,
    buf_i_ptr,
    SUB: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NPAD: tl.constexpr,
):
    """Copy the elements ``> t`` (value, token id) to ``buf[0:]`` and the first ``n`` elements ``== t``
    in token order to ``buf[NPAD:]``; returns how many are ``> t``.

    Only sub-tiles whose max reaches ``t`` are read: they are listed first; when more than ``cap``
    qualify (``t = -inf``, massive ties) every sub-tile is visited and the maxima mask the loads."""
    n_sel = tkp._list_subtiles(row_maxima, row_groups, n_sub, n_grp, t, gsel_ptr, sel_ptr, cap, GROUP, BLOCK)
    listed = n_sel <= cap
    total = tl.where(listed, n_sel, n_sub)
    NS: tl.constexpr = BLOCK_C // SUB
    col = tl.arange(0, SUB)
    c_gt = tl.zeros([], tl.int32)
    c_eq = tl.zeros([], tl.int32)
    for i0 in range(0, total, NS):
        i = i0 + tl.arange(0, NS)
        inside = i < total
        from_list = inside & (i < tl.where(listed, total, 0))
        s = tl.where(from_list, tl.load(sel_ptr + i, mask=from_list, other=0), i)
        ok = from_list | (inside & (tl.load(row_maxima + s, mask=inside, other=float("-inf")) >= t))
        offs = s[:, None] * SUB + col[None, :]
        valid = ok[:, None] & (offs < vocab)
        x = tl.load(row_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
        xs = tl.reshape(x, [BLOCK_C])
        ids = tl.reshape(offs, [BLOCK_C])
        gt = tl.reshape(valid & (x > t), [BLOCK_C])
        eq = tl.reshape(valid & (x == t), [BLOCK_C])
        gpos = c_gt + tl.cumsum(gt.to(tl.int32), 0) - 1
        tl.store(buf_v_ptr + gpos, xs, mask=gt & (gpos < NPAD))
        tl.store(buf_i_ptr + gpos, ids, mask=gt & (gpos < NPAD))
        epos = c_eq + tl.cumsum(eq.to(tl.int32), 0) - 1
        tl.store(buf_v_ptr + NPAD + epos, xs, mask=eq & (epos < n))
        tl.store(buf_i_ptr + NPAD + epos, ids, mask=eq & (epos < n))
        c_gt += tl.sum(gt.to(tl.int32), 0)
        c_eq += tl.sum(eq.to(tl.int32), 0)
    tl.debug_barrier()
    return c_gt


@triton.jit
def _store_ranked(buf_v_ptr, buf_i_ptr, c_gt, n, lse, ids_ptr, lp_ptr, NPAD: tl.constexpr, JB: tl.constexpr):
    """Write the collected entries in order: those ``> t`` by pairwise rank (larger value first, lower
    token id among equals), then the ``n - c_gt`` entries ``== t`` in token order."""
    gi = tl.arange(0, NPAD)
    in_g = gi < c_gt
    v = tl.load(buf_v_ptr + gi, mask=in_g, other=float("-inf"))
    ids = tl.load(buf_i_ptr + gi, mask=in_g, other=0)
    rank = tl.zeros([NPAD], tl.int32)
    for j0 in range(0, c_gt, JB):
        gj = j0 + tl.arange(0, JB)
        in_j = gj < c_gt
        vj = tl.load(buf_v_ptr + gj, mask=in_j, other=float("-inf"))[None, :]
        idj = tl.load(buf_i_ptr + gj, mask=in_j, other=0)[None, :]
        before = in_j[None, :] & ((vj > v[:, None]) | ((vj == v[:, None]) & (idj < ids[:, None])))
        rank += tl.sum(before.to(tl.int32), 1)
    tl.store(ids_ptr + rank, ids.to(tl.int64), mask=in_g)
    tl.store(lp_ptr + rank, v - lse, mask=in_g)
    take = gi < n - c_gt
    ve = tl.load(buf_v_ptr + NPAD + gi, mask=take, other=0.0)
    ide = tl.load(buf_i_ptr + NPAD + gi, mask=take, other=0)
    tl.store(ids_ptr + c_gt + gi, ide.to(tl.int64), mask=take)
    tl.store(lp_ptr + c_gt + gi, ve - lse, mask=take)


@triton.jit(do_not_specialize=["n", "n_chunks"])
def _topk_logprobs_kernel(
    logits_ptr,
    row_stride,
    chosen_ptr,
    n,
    maxima_ptr,
    groups_ptr,
    stats_ptr,
    above_ptr,
    cand_base_ptr,
    gsel_base_ptr,
    sel_base_ptr,
    buf_v_base_ptr,
    buf_i_base_ptr,
    ids_ptr,
    lp_ptr,
    rank_ptr,
    vocab,
    n_sub,
    n_grp,
    n_chunks,
    cap,
    NPAD: tl.constexpr,
    JB: tl.constexpr,
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
    r64 = row.to(tl.int64)
    row_ptr = logits_ptr + r64 * row_stride
    row_maxima = maxima_ptr + r64 * n_sub
    row_max, z, row_min, finite = tkp._row_stats(stats_ptr, row, n_chunks, CHUNKS)
    lse = row_max + tl.log(z)
    ci = tl.arange(0, CHUNKS)
    above = tl.sum(tl.load(above_ptr + r64 * n_chunks + ci, mask=ci < n_chunks, other=0), 0)
    chosen = tl.load(chosen_ptr + row)
    out = r64 * (n + 1)
    tl.store(ids_ptr + out, chosen)
    tl.store(lp_ptr + out, tl.load(row_ptr + chosen).to(tl.float32) - lse)
    tl.store(rank_ptr + row, above.to(tl.int64) + 1)
    if n > 0:
        sel_ptr = sel_base_ptr + r64 * cap
        gsel_ptr = gsel_base_ptr + r64 * n_grp
        row_groups = groups_ptr + r64 * n_grp
        t, _, _ = tkp._top_k_threshold(
            row_ptr,
            row_maxima,
            row_groups,
            cand_base_ptr + r64 * cap,
            gsel_ptr,
            sel_ptr,
            vocab,
            n_sub,
            n_grp,
            cap,
            n,
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
        buf_v = buf_v_base_ptr + r64 * (2 * NPAD)
        buf_i = buf_i_base_ptr + r64 * (2 * NPAD)
        c_gt = _collect(
            row_ptr,
            row_maxima,
            row_groups,
            n_sub,
            n_grp,
            vocab,
            t,
            n,
            gsel_ptr,
            sel_ptr,
            cap,
            buf_v,
            buf_i,
            SUB,
            GROUP,
            BLOCK,
            BLOCK_C,
            NPAD,
        )
        _store_ranked(buf_v, buf_i, c_gt, n, lse, ids_ptr + out + 1, lp_ptr + out + 1, NPAD, JB)


def compute_topk_logprobs(
    logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_logits(logits)
    rows, vocab = logits.shape
    dev = logits.device
    chosen = token_ids.to(torch.int64).contiguous()
    ids = torch.empty(rows, num_logprobs + 1, dtype=torch.int64, device=dev)
    lps = torch.empty(rows, num_logprobs + 1, dtype=torch.float32, device=dev)
    ranks = torch.empty(rows, dtype=torch.int64, device=dev)
    if rows == 0:
        return ids, lps, ranks
    sm = tkp.summarize(logits, need_sum=True, chosen=chosen)
    warps, search = tkp.search_settings(rows, vocab, sm, dev)
    npad = max(MIN_PAD, triton.next_power_of_2(num_logprobs))
    _topk_logprobs_kernel[(rows,)](
        logits,
        logits.stride(0),
        chosen,
        num_logprobs,
        sm.maxima,
        sm.groups,
        sm.stats,
        sm.above,
        scratch("top_k_top_p.candidates", rows * tkp.CAP, logits.dtype, dev),
        scratch("top_k_top_p.group_list", rows * sm.n_grp, torch.int32, dev),
        scratch("top_k_top_p.subtiles", rows * tkp.CAP, torch.int32, dev),
        scratch("logprobs.top_values", rows * 2 * npad, torch.float32, dev),
        scratch("logprobs.top_ids", rows * 2 * npad, torch.int32, dev),
        ids,
        lps,
        ranks,
        vocab,
        sm.n_sub,
        sm.n_grp,
        sm.chunks,
        tkp.CAP,
        NPAD=npad,
        JB=RANK_BLOCK,
        BOUND_NP=tkp.BOUND_PIVOTS,
        BOUND_PASSES=tkp.BOUND_PASSES,
        SUB=tkp.SUB,
        GROUP=sm.group,
        BLOCK_C=tkp.GATHER_BLOCK,
        **launch(dev, warps),
        **search,
    )
    return ids, lps, ranks
