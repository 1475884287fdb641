"""Triton :func:`vllm_ascend.kernels.apply_top_k_top_p`: a threshold search instead of a sort.

One program per row, one launch. The kept set is ``{x >= t}``; the search narrows an interval
``[lo, top]`` known to hold ``t`` by testing ``NP`` pivots spread over it per pass:

1. Row pass: max, smallest finite value, finite count and the softmax normaliser.
2. Coarse passes over the whole row: per pivot, the count (top-k) or probability mass (top-p) of
   ``{x >= pivot}``; the last pivot still reaching the target becomes ``lo`` and the next one the
   exclusive bound ``hi``. They stop once the bucket ``[lo, hi)`` holds at most ``CAP`` elements.
3. One pass copies the candidates to a per-row scratch: every element ``>= lo`` when they fit
   (top-p then reuses them after top-k), else the bucket, whose count and mass above ``hi`` are
   carried as a base.
4. Exact passes over the scratch also gather, per pivot, the smallest element ``>= pivot`` and the
   largest ``< pivot``, so ``lo`` and ``top`` become element values; the search ends when they
   meet. Ties are therefore kept exactly as a sort would keep them. Top-p runs on the distribution
   left by top-k.
5. A last pass writes ``-inf`` below the threshold (only dropped elements are written).

Rows whose bucket never fits ``CAP`` (massive ties) run the exact passes on the whole row. The
scratch (``rows x CAP`` values per device and dtype) is cached and shared: calls must not run
concurrently on two streams of one device. Masses
are float32 sums, so a top-p threshold can differ from a float64 sort where the cumulative mass
is within rounding of ``p``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._triton.common import IS_INTERPRETED, SMALL_BATCH_ROWS, check_logits

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
    offs = tl.arange(0, BLOCK)
    nxt = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf"))
    for start in range(0, vocab, BLOCK):
        x = nxt.to(tl.float32)
        offs = start + BLOCK + tl.arange(0, BLOCK)
        nxt = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf"))
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
def _pivot_pass(
    src_ptr,
    n,
    piv,
    row_max,
    floor,
    lo,
    EXACT: tl.constexpr,
    BY_MASS: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Per pivot: count and mass of ``{x >= pivot}``; with ``EXACT`` also the nearest elements
    above/below it and the mass of ``{x >= lo}``. Elements under ``floor`` count as ``-inf``."""
    cnt = tl.zeros([NP], tl.int32)
    mass = tl.zeros([NP], tl.float32)
    above_min = tl.full([NP], float("inf"), tl.float32)
    below_max = tl.full([NP], float("-inf"), tl.float32)
    mass_lo = tl.zeros([BLOCK], tl.float32)
    offs = tl.arange(0, BLOCK)
    nxt = tl.load(src_ptr + offs, mask=offs < n, other=float("-inf"))
    for start in range(0, n, BLOCK):
        x = nxt.to(tl.float32)
        offs = start + BLOCK + tl.arange(0, BLOCK)
        nxt = tl.load(src_ptr + offs, mask=offs < n, other=float("-inf"))
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
    # Coarse passes over the row until the bucket [lo, hi) fits the scratch.
    searching = (n_ready < 0) & (count_lo - count_hi > cap) & (lo < row_max)
    while searching:
        top = tl.minimum(hi, row_max)
        piv = _pivots(lo, top, NP)
        cnt, mass, _, _, _ = _pivot_pass(row_ptr, vocab, piv, row_max, floor, lo, False, BY_MASS, NP, BLOCK)
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
    passes = tl.zeros([], tl.int32)
    searching = lo < top
    while searching:
        piv = _pivots(lo, top, NP)
        cnt, mass, above_min, below_max, _ = _pivot_pass(
            src_ptr, n, piv, row_max, floor, lo, True, BY_MASS, NP, BLOCK
        )
        j = tl.sum(
            _reached(cnt, mass, base_count, base_mass, target_count, target_mass, BY_MASS).to(tl.int32), 0
        )
        count_lo = tl.where(j == 0, count_lo, _take(cnt, idx, j - 1, 0) + base_count)
        new_lo = tl.where(j == 0, lo, _take(above_min, idx, j - 1, 0.0))
        new_top = _take(below_max, idx, j, -inf)
        done = (j == NP) | (new_lo >= new_top)
        answer = tl.where(j == NP, top, new_lo)
        lo = tl.where(done, answer, new_lo)
        top = tl.where(done, answer, new_top)
        passes += 1
        searching = (lo < top) & (passes < MAX_PASSES)
    return lo, count_lo, tl.where(tail_in_scratch == 1, n, -1)


@triton.jit
def _top_k_top_p_kernel(
    logits_ptr,
    row_stride,
    k_ptr,
    p_ptr,
    scratch_ptr,
    vocab,
    cap,
    HAS_K: tl.constexpr,
    HAS_P: tl.constexpr,
    NP: tl.constexpr,
    BLOCK: tl.constexpr,
    MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    cand_ptr = scratch_ptr + row.to(tl.int64) * cap
    row_max, row_min, finite, z = _row_stats(row_ptr, vocab, BLOCK)
    threshold = tl.full([], float("-inf"), tl.float32)
    count = finite
    n_ready = tl.full([], -1, tl.int32)
    if HAS_K:
        k = tl.load(k_ptr + row).to(tl.int32)
        if (k > 0) & (k < finite):
            threshold, count, n_ready = _select(
                row_ptr,
                vocab,
                cand_ptr,
                n_ready,
                cap,
                row_min,
                finite,
                row_max,
                float("-inf"),
                k,
                0.0,
                False,
                NP,
                BLOCK,
                MAX_PASSES,
            )
    if HAS_P:
        p = tl.load(p_ptr + row)
        if (p < 1.0) & (finite > 0):
            target = p * z
            if threshold > float("-inf"):  # top-p over what top-k kept
                if n_ready >= 0:
                    _, _, _, _, kept = _pivot_pass(
                        cand_ptr,
                        n_ready,
                        _pivots(threshold, row_max, NP),
                        row_max,
                        threshold,
                        threshold,
                        False,
                        True,
                        NP,
                        BLOCK,
                    )
                else:
                    _, _, _, _, kept = _pivot_pass(
                        row_ptr,
                        vocab,
                        _pivots(threshold, row_max, NP),
                        row_max,
                        threshold,
                        threshold,
                        False,
                        True,
                        NP,
                        BLOCK,
                    )
                target = p * kept
            threshold, count, n_ready = _select(
                row_ptr,
                vocab,
                cand_ptr,
                n_ready,
                cap,
                tl.maximum(threshold, row_min),
                count,
                row_max,
                threshold,
                0,
                target,
                True,
                NP,
                BLOCK,
                MAX_PASSES,
            )
    if threshold > float("-inf"):
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < vocab
            x = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(
                row_ptr + offs,
                tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty),
                mask=mask & (x < threshold),
            )


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
    # H200: few rows want big tiles (bytes in flight per program), many rows want small ones.
    block, warps = (4096, 16) if rows <= SMALL_BATCH_ROWS else (1024, 4)
    block = min(triton.next_power_of_2(vocab), 128 if IS_INTERPRETED else block)
    _top_k_top_p_kernel[(rows,)](
        logits,
        logits.stride(0),
        k if k is not None else logits,
        p.to(torch.float32) if p is not None else logits,
        _candidates(rows, logits),
        vocab,
        CAP,
        HAS_K=k is not None,
        HAS_P=p is not None,
        NP=NUM_PIVOTS,
        BLOCK=block,
        MAX_PASSES=MAX_PASSES,
        num_warps=warps,
    )
    return logits
