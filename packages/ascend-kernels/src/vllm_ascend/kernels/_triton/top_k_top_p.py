"""Triton :func:`vllm_ascend.kernels.apply_top_k_top_p`: a threshold search instead of a sort.

One program per row, one launch. The kept set is ``{x >= t}``; the search narrows an interval
``[lo, top]`` known to hold ``t`` by testing ``NP`` pivots spread over it per pass:

1. Row pass: max, smallest finite value, finite count and the softmax normaliser.
2. Coarse passes over the whole row: per pivot, the count (top-k) or probability mass (top-p) of
   ``{x >= pivot}``; the last pivot still reaching the target becomes ``lo`` and the next one
   ``top``. They stop once at most ``CAP`` elements are ``>= lo``.
3. One pass copies those candidates to a per-row scratch.
4. Exact passes over the scratch (a few hundred to ``CAP`` values) also gather, per pivot, the
   smallest element ``>= pivot`` and the largest ``< pivot``, so ``lo`` and ``top`` become element
   values; the search ends when they meet. Ties are therefore kept exactly as a sort would keep them.
   Top-p runs on the distribution left by top-k (its candidates are already in the scratch).
5. A last pass writes ``-inf`` below the threshold (only dropped elements are written).

Rows whose candidates never fit in ``CAP`` (e.g. ``k > CAP``) run the exact passes on the whole row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, check_logits

NUM_PIVOTS = 8
CAP = 64 if IS_INTERPRETED else 16384
MAX_PASSES = 48
_scratch: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


@triton.jit
def _row_stats(row_ptr, vocab, BLOCK: tl.constexpr):
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    mn = tl.full([BLOCK], float("inf"), tl.float32)
    finite = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        ok = x > float("-inf")
        new_max = tl.maximum(run_max, x)
        safe = tl.where(new_max > float("-inf"), new_max, 0.0)
        run_sum = run_sum * tl.exp(run_max - safe) + tl.exp(x - safe)
        run_max = new_max
        mn = tl.minimum(mn, tl.where(ok, x, float("inf")))
        finite += ok.to(tl.int32)
    m = tl.max(run_max, 0)
    z = tl.sum(run_sum * tl.exp(run_max - m), 0)
    return m, tl.min(mn, 0), tl.sum(finite, 0), z


@triton.jit
def _pivots(lo, top, NP: tl.constexpr):
    i = tl.arange(0, NP) + 1
    piv = lo + (top - lo) * (i.to(tl.float32) / NP)
    return tl.where(i == NP, top, tl.minimum(piv, top))


@triton.jit
def _pivot_pass(src_ptr, n, piv, row_max, floor, lo, EXACT: tl.constexpr, BY_MASS: tl.constexpr,
                NP: tl.constexpr, BLOCK: tl.constexpr):
    """Per pivot: count and mass of ``{x >= pivot}``; with ``EXACT`` also the nearest elements
    above/below it and the mass of ``{x >= lo}``. Elements under ``floor`` count as ``-inf``."""
    cnt = tl.zeros([NP], tl.int32)
    mass = tl.zeros([NP], tl.float32)
    above_min = tl.full([NP], float("inf"), tl.float32)
    below_max = tl.full([NP], float("-inf"), tl.float32)
    mass_lo = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(src_ptr + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
        x = tl.where(x >= floor, x, float("-inf"))
        ge = x[:, None] >= piv[None, :]
        cnt += tl.sum(ge.to(tl.int32), 0)
        if BY_MASS:
            e = tl.exp(x - row_max)
            mass += tl.sum(tl.where(ge, e[:, None], 0.0), 0)
            mass_lo += tl.where(x >= lo, e, 0.0)
        if EXACT:
            above_min = tl.minimum(above_min, tl.min(tl.where(ge, x[:, None], float("inf")), 0))
            below_max = tl.maximum(below_max, tl.max(tl.where(ge, float("-inf"), x[:, None]), 0))
    return cnt, mass, above_min, below_max, tl.sum(mass_lo, 0)


@triton.jit
def _coarse_search(row_ptr, vocab, lo, top, count_lo, row_max, floor, target_count, target_mass, cap,
                   BY_MASS: tl.constexpr, NP: tl.constexpr, BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr):
    """Narrow ``[lo, top]`` over the whole row until at most ``cap`` elements are ``>= lo``."""
    idx = tl.arange(0, NP)
    passes = tl.zeros([], tl.int32)
    searching = (count_lo > cap) & (lo < top)
    while searching:
        piv = _pivots(lo, top, NP)
        cnt, mass, _, _, _ = _pivot_pass(row_ptr, vocab, piv, row_max, floor, lo, False, BY_MASS, NP, BLOCK)
        if BY_MASS:
            reached = mass >= target_mass
        else:
            reached = cnt >= target_count
        j = tl.sum(reached.to(tl.int32), 0)
        count_lo = tl.where(j == 0, count_lo, tl.sum(tl.where(idx == j - 1, cnt, 0), 0))
        new_lo = tl.where(j == 0, lo, tl.sum(tl.where(idx == j - 1, piv, 0.0), 0))
        top = tl.where(j == NP, top, tl.sum(tl.where(idx == j, piv, 0.0), 0))
        lo = tl.where(j == NP, top, new_lo)
        passes += 1
        searching = (count_lo > cap) & (lo < top) & (passes < MAX_PASSES)
    return lo, top, count_lo


@triton.jit
def _exact_search(src_ptr, n, lo, top, row_max, floor, target_count, target_mass, BY_MASS: tl.constexpr,
                  NP: tl.constexpr, BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr):
    """Largest element ``v`` in ``[lo, top]`` whose ``{x >= v}`` reaches the count or mass target.

    ``lo`` need not be an element (it stays put until a pivot above it reaches the target)."""
    idx = tl.arange(0, NP)
    passes = tl.zeros([], tl.int32)
    searching = lo < top
    while searching:
        piv = _pivots(lo, top, NP)
        cnt, mass, above_min, below_max, _ = _pivot_pass(src_ptr, n, piv, row_max, floor, lo, True, BY_MASS, NP,
                                                         BLOCK)
        if BY_MASS:
            reached = mass >= target_mass
        else:
            reached = cnt >= target_count
        j = tl.sum(reached.to(tl.int32), 0)
        new_lo = tl.where(j == 0, lo, tl.max(tl.where(idx == j - 1, above_min, float("-inf")), 0))
        new_top = tl.max(tl.where(idx == j, below_max, float("-inf")), 0)
        done = (j == NP) | (new_lo >= new_top)
        answer = tl.where(j == NP, top, new_lo)
        lo = tl.where(done, answer, new_lo)
        top = tl.where(done, answer, new_top)
        passes += 1
        searching = (lo < top) & (passes < MAX_PASSES)
    return lo


@triton.jit
def _compact(row_ptr, vocab, lo, dst_ptr, BLOCK: tl.constexpr):
    """Copy the row's elements ``>= lo`` to ``dst`` (order kept); returns how many."""
    base = tl.zeros([], tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        keep = x >= lo
        pos = tl.cumsum(keep.to(tl.int32), 0)
        tl.store(dst_ptr + base + pos - 1, x.to(dst_ptr.dtype.element_ty), mask=keep)
        base += tl.sum(keep.to(tl.int32), 0)
    return base


@triton.jit
def _top_k_top_p_kernel(
    logits_ptr, row_stride, k_ptr, p_ptr, scratch_ptr, vocab, cap,
    HAS_K: tl.constexpr, HAS_P: tl.constexpr, NP: tl.constexpr, BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    cand_ptr = scratch_ptr + row.to(tl.int64) * cap
    row_max, row_min, finite, z = _row_stats(row_ptr, vocab, BLOCK)
    threshold = tl.full([], float("-inf"), tl.float32)
    # Candidates for the exact search: the whole row until the scratch holds every element >= lo.
    src_ptr = row_ptr
    n = vocab
    compacted = tl.zeros([], tl.int32)
    lo = row_min
    if HAS_K:
        k = tl.load(k_ptr + row).to(tl.int32)
        if (k > 0) & (k < finite):
            lo, top, count_lo = _coarse_search(row_ptr, vocab, row_min, row_max, finite, row_max, float("-inf"), k,
                                               0.0, cap, False, NP, BLOCK, MAX_PASSES)
            if count_lo <= cap:
                n = _compact(row_ptr, vocab, lo, cand_ptr, BLOCK)
                src_ptr = cand_ptr
                compacted = 1
            threshold = _exact_search(src_ptr, n, lo, top, row_max, float("-inf"), k, 0.0, False, NP, BLOCK,
                                      MAX_PASSES)
    if HAS_P:
        p = tl.load(p_ptr + row)
        if (p < 1.0) & (finite > 0):
            lo = tl.maximum(threshold, row_min)
            if threshold > float("-inf"):
                _, _, _, _, kept_mass = _pivot_pass(src_ptr, n, _pivots(lo, row_max, NP), row_max, threshold, lo,
                                                    False, True, NP, BLOCK)
                target = p * kept_mass
            else:
                target = p * z
            top = row_max
            if compacted == 0:
                lo, top, count_lo = _coarse_search(row_ptr, vocab, lo, row_max, finite, row_max, threshold, 0,
                                                   target, cap, True, NP, BLOCK, MAX_PASSES)
                if count_lo <= cap:
                    n = _compact(row_ptr, vocab, lo, cand_ptr, BLOCK)
                    src_ptr = cand_ptr
            threshold = _exact_search(src_ptr, n, lo, top, row_max, threshold, 0, target, True, NP, BLOCK,
                                      MAX_PASSES)
    if threshold > float("-inf"):
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < vocab
            x = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(row_ptr + offs, tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty),
                     mask=mask & (x < threshold))


def _candidates(rows: int, like: torch.Tensor) -> torch.Tensor:
    """Per-row candidate scratch in the logits' dtype (values are copied exactly)."""
    key = (like.device, like.dtype)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < rows * CAP:
        buf = torch.empty(rows * CAP, dtype=like.dtype, device=like.device)
        _scratch[key] = buf
    return buf


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    if rows == 0 or (k is None and p is None):
        return logits
    block = min(triton.next_power_of_2(vocab), 128 if IS_INTERPRETED else 1024)
    _top_k_top_p_kernel[(rows,)](
        logits, logits.stride(0), k if k is not None else logits, p.to(torch.float32) if p is not None else logits,
        _candidates(rows, logits), vocab, CAP, HAS_K=k is not None, HAS_P=p is not None, NP=NUM_PIVOTS,
        BLOCK=block, MAX_PASSES=MAX_PASSES, num_warps=8,
    )
    return logits
