"""Triton logprob kernels.

Token logprobs: an online log-sum-exp per row chunk. Large batches and short rows run one program
per row (one chunk) and write the result directly. Batches of fewer rows than multiprocessors with
long rows split each row into chunks so that every multiprocessor streams; each program writes its
chunk's ``(max, sum of exp(x - max))`` and the row's last program to finish (:func:`.common.last_chunk`)
merges them and writes the row: one launch either way. The chunk count is a runtime argument.

Top-``n`` logprobs, one launch reading each row once: per chunk the online log-sum-exp, the count of
elements above the chosen token (its rank) and a candidate buffer (:mod:`.candidates`) that ends
with every element ``>=`` the chunk's ``n``-th largest value and its token id. The row's last
program merges the chunks (their candidates hold every element ``>=`` the row's ``n``-th largest
value) and ranks them pairwise (larger first, the lower token id among equals). Rows with fewer
finite elements than ``n`` (filled with ``-inf`` tokens in token order) or whose buffer overflowed
(massive ties) are searched and read again whole by that program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels._triton import candidates as C
from vllm_ascend.kernels._triton import threshold_search as S
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
    vector,
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


RANK_BLOCK = 32  # entries compared per step when ranking
MIN_PAD = 32  # one compiled variant serves every n up to this (vLLM's default max_logprobs is 20)
TOPK_UNIT = 8  # top-n: elements per slot per tile (A * V)
TOPK_WARPS = 4
TOPK_PER_SM = 4  # top-n: split rows for this many programs per multiprocessor


@triton.jit
def _collect_row(row_ptr, vocab, t, n, buf_v_ptr, buf_i_ptr, NPAD: tl.constexpr, BLOCK: tl.constexpr):
    """Copy the row's elements ``> t`` (value, token id) to ``buf[0:]`` and its first ``n`` elements
    ``== t`` in token order to ``buf[NPAD:]``, reading the whole row; returns how many are ``> t``."""
    c_gt = tl.zeros([], tl.int32)
    c_eq = tl.zeros([], tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("nan")).to(tl.float32)
        gt = x > t
        eq = x == t
        gpos = c_gt + tl.cumsum(gt.to(tl.int32), 0) - 1
        tl.store(buf_v_ptr + gpos, x, mask=gt & (gpos < NPAD))
        tl.store(buf_i_ptr + gpos, offs, mask=gt & (gpos < NPAD))
        epos = c_eq + tl.cumsum(eq.to(tl.int32), 0) - 1
        tl.store(buf_v_ptr + NPAD + epos, x, mask=eq & (epos < n))
        tl.store(buf_i_ptr + NPAD + epos, offs, mask=eq & (epos < n))
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


@triton.jit
def _rank_merged(base_v, base_i, count, n, lse, ids_ptr, lp_ptr, RB: tl.constexpr, JB: tl.constexpr):
    """Write the ``n`` first of ``count`` candidates in order (larger value first, the lower token id
    among equals), ranked pairwise: the candidates hold every element ``>=`` the row's ``n``-th
    largest value, so their ranks among themselves are their ranks in the row."""
    for i0 in range(0, count, RB):
        gi = i0 + tl.arange(0, RB)
        in_i = gi < count
        v = tl.load(base_v + gi, mask=in_i, other=float("-inf"))
        ids = tl.load(base_i + gi, mask=in_i, other=0)
        rank = tl.zeros([RB], tl.int32)
        for j0 in range(0, count, JB):
            gj = j0 + tl.arange(0, JB)
            in_j = gj < count
            vj = tl.load(base_v + gj, mask=in_j, other=float("-inf"))[None, :]
            idj = tl.load(base_i + gj, mask=in_j, other=0)[None, :]
            before = in_j[None, :] & ((vj > v[:, None]) | ((vj == v[:, None]) & (idj < ids[:, None])))
            rank += tl.sum(before.to(tl.int32), 1)
        keep = in_i & (rank < n)
        tl.store(ids_ptr + rank, ids.to(tl.int64), mask=keep)
        tl.store(lp_ptr + rank, v - lse, mask=keep)


@triton.jit(do_not_specialize=["n", "chunk", "n_chunks"])
def _topk_logprobs_kernel(
    logits_ptr,
    row_stride,
    chosen_ptr,
    n,
    vocab,
    chunk,
    n_chunks,
    part_m_ptr,
    part_s_ptr,
    above_ptr,
    count_ptr,
    cand_v_ptr,
    cand_i_ptr,
    buf_v_base_ptr,
    buf_i_base_ptr,
    counter_ptr,
    ids_ptr,
    lp_ptr,
    rank_ptr,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
    BUF: tl.constexpr,
    NPAD: tl.constexpr,
    RB: tl.constexpr,
    JB: tl.constexpr,
    CB: tl.constexpr,
    BOUND_NP: tl.constexpr,
    BOUND_PASSES: tl.constexpr,
    S_NP: tl.constexpr,
    BLOCK: tl.constexpr,
    NP_C: tl.constexpr,
    EXACT_BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    """One chunk of a row, read once: online log-sum-exp, elements above the chosen token, and the
    candidates for the ``n`` largest (:mod:`.candidates`, with token ids). The row's last program
    combines the chunks and writes the row."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    r64 = row.to(tl.int64)
    row_ptr = logits_ptr + r64 * row_stride
    TILE: tl.constexpr = A * NG * V
    local = slots(A, NG, V)
    begin = c * chunk
    end = tl.minimum(begin + chunk, vocab)
    chosen = tl.load(chosen_ptr + row)
    cx = tl.load(row_ptr + chosen).to(tl.float32)
    region_v = cand_v_ptr + (r64 * n_chunks + c) * BUF
    region_i = cand_i_ptr + (r64 * n_chunks + c) * BUF
    run_max = tl.full([NG], float("-inf"), tl.float32)
    run_sum = tl.zeros([NG], tl.float32)
    above = tl.zeros([A, NG, V], tl.int32)
    thr = tl.full([], float("-inf"), tl.float32)
    cnt = tl.zeros([], tl.int32)
    ovf = tl.zeros([], tl.int32)
    nxt = tl.load(row_ptr + begin + local, mask=begin + local < end, other=float("-inf"))
    for start in range(begin, end, TILE):
        x = nxt.to(tl.float32)
        offs = start + local
        nxt = tl.load(row_ptr + offs + TILE, mask=offs + TILE < end, other=float("-inf"))
        umax = tl.max(tl.max(x, 2), 0)
        new_max = tl.maximum(run_max, umax)
        safe = tl.where(new_max > float("-inf"), new_max, 0.0)
        run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(tl.sum(tl.exp(x - safe[None, :, None]), 2), 0)
        run_max = new_max
        above += (x > cx).to(tl.int32)
        if n > 0:
            cnt, thr, ovf = C._take_tile(
                region_v, region_i, cnt, thr, ovf, x, offs, umax, n, start == begin, True, BUF,
                BOUND_NP, BOUND_PASSES, S_NP, EXACT_BLOCK, MAX_PASSES,
            )  # fmt: skip
    if (n > 0) & (ovf == 0) & (cnt > n) & (n_chunks > 1):  # one row program: its ranking does it
        cnt = C._compact(region_v, region_i, cnt, n, True, BUF, S_NP, EXACT_BLOCK, MAX_PASSES)[1]
    m = tl.max(run_max, 0)
    safe_m = tl.where(m > float("-inf"), m, 0.0)
    part = r64 * n_chunks + c
    tl.store(part_m_ptr + part, m)
    tl.store(part_s_ptr + part, tl.sum(run_sum * tl.exp(run_max - safe_m), 0))
    tl.store(above_ptr + part, tl.sum(tl.sum(tl.sum(above, 2), 0), 0))
    tl.store(count_ptr + part, tl.where(ovf != 0, -1, cnt))
    last = n_chunks == 1
    if n_chunks > 1:
        last = last_chunk(counter_ptr, row, n_chunks)
    if last:
        lse = _combine(part_m_ptr, part_s_ptr, r64 * n_chunks, n_chunks, CB)
        ci = tl.arange(0, CB)
        ranked_above = tl.zeros([], tl.int32)
        for c0 in range(0, n_chunks, CB):
            ranked_above += tl.sum(
                tl.load(above_ptr + r64 * n_chunks + c0 + ci, mask=c0 + ci < n_chunks, other=0), 0
            )
        out = r64 * (n + 1)
        tl.store(ids_ptr + out, chosen)
        tl.store(lp_ptr + out, cx - lse)
        tl.store(rank_ptr + row, ranked_above.to(tl.int64) + 1)
        if n > 0:
            base_v = cand_v_ptr + r64 * n_chunks * BUF
            base_i = cand_i_ptr + r64 * n_chunks * BUF
            total, overflowed, _lo, _hi = C._merge(
                base_v, base_i, count_ptr + r64 * n_chunks, n_chunks, BUF, True, BUF
            )
            if (overflowed == 0) & (total >= n):
                _rank_merged(base_v, base_i, total, n, lse, ids_ptr + out + 1, lp_ptr + out + 1, RB, JB)
            else:  # fewer finite elements than n, or a buffer overflowed: the whole row
                t = tl.full([], float("-inf"), tl.float32)
                if overflowed != 0:
                    lo, finite = tkp._row_min_count(row_ptr, vocab, BLOCK)
                    if n < finite:
                        t = S._select(
                            row_ptr, vocab, base_v.to(row_ptr.dtype), n_chunks * BUF, lo, finite, m, float("-inf"), n, 0.0, False,
                            S_NP, BLOCK, NP_C, EXACT_BLOCK, WIDE, MAX_PASSES,
                        )[0]  # fmt: skip
                buf_v = buf_v_base_ptr + r64 * (2 * NPAD)
                buf_i = buf_i_base_ptr + r64 * (2 * NPAD)
                c_gt = _collect_row(row_ptr, vocab, t, n, buf_v, buf_i, NPAD, BLOCK)
                _store_ranked(buf_v, buf_i, c_gt, n, lse, ids_ptr + out + 1, lp_ptr + out + 1, NPAD, JB)


def _topk_layout(
    rows: int, vocab: int, dtype: torch.dtype, device: torch.device
) -> tuple[dict[str, int], int, int]:
    """``(slot shape, chunks, chunk)``: ``TOPK_UNIT``-element slots per tile, rows split so that
    ``TOPK_PER_SM`` programs per multiprocessor stream when the batch is small."""
    v = vector(dtype)
    ng = 8 if IS_INTERPRETED else 32 * TOPK_WARPS
    a = max(1, TOPK_UNIT // v)
    bound = ub_cap(device, a * ng * v)
    while a * ng * v > bound and a > 1:
        a //= 2
    while a * ng * v > bound and ng > 1:
        ng //= 2
    chunks, chunk = row_split(rows, vocab, tkp.MIN_CHUNK_TILES * a * ng * v, device, TOPK_PER_SM)
    return dict(A=a, NG=ng, V=v), chunks, chunk


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
    shape, chunks, chunk = _topk_layout(rows, vocab, logits.dtype, dev)
    tile = shape["A"] * shape["NG"] * shape["V"]
    npad = max(MIN_PAD, triton.next_power_of_2(num_logprobs))
    buf = max(4 * npad, 2 * tile) if IS_INTERPRETED else 4 * npad
    programs = rows * chunks
    _topk_logprobs_kernel[(rows, chunks)](
        logits, logits.stride(0), chosen, num_logprobs, vocab, chunk, chunks,
        scratch("lse_m", programs, torch.float32, dev), scratch("lse_s", programs, torch.float32, dev),
        scratch("logprobs.above", programs, torch.int32, dev), scratch("logprobs.counts", programs, torch.int32, dev),
        scratch("logprobs.candidates", programs * buf, torch.float32, dev),
        scratch("logprobs.candidate_ids", programs * buf, torch.int32, dev),
        scratch("logprobs.top_values", rows * 2 * npad, torch.float32, dev),
        scratch("logprobs.top_ids", rows * 2 * npad, torch.int32, dev),
        counters("logprobs.topk_counter", rows, dev), ids, lps, ranks, BUF=buf, NPAD=npad, RB=128, JB=RANK_BLOCK,
        CB=COMBINE_BLOCK, BOUND_NP=tkp.BOUND_PIVOTS, BOUND_PASSES=tkp.BOUND_PASSES, **shape,
        **tkp.search_constexprs(TOPK_WARPS), **tkp.launch_kwargs(dev, TOPK_WARPS),
    )  # fmt: skip
    return ids, lps, ranks
