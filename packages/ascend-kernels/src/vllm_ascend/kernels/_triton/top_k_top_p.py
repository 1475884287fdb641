"""Triton :func:`vllm_ascend.kernels.apply_top_k_top_p`: threshold search instead of a sort.

One program per row. Pass 0 finds the row's max, min finite value and finite count. Each search
pass then tests ``NP`` pivots spread over the candidate range ``[lo, top]`` (both logit values of
the row, the answer between them) and gathers per pivot: the count and the probability mass of
``{x >= pivot}``, the smallest element ``>= pivot`` and the largest element ``< pivot``. The last
pivot whose count (top-k) or mass (top-p) still reaches the target gives the new ``lo``; the
largest element under the next pivot gives the new ``top``. The search ends when ``lo == top``:
an exact element value, so ties are kept exactly as the reference keeps them. The top-p search
runs on the distribution left by top-k. A final pass writes ``-inf`` below the threshold (only
the dropped elements are written).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, check_logits

NUM_PIVOTS = 16
MAX_PASSES = 48


@triton.jit
def _row_stats(row_ptr, vocab, BLOCK: tl.constexpr):
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    mn = tl.full([BLOCK], float("inf"), tl.float32)
    finite = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        ok = x > float("-inf")
        mx = tl.maximum(mx, x)
        mn = tl.minimum(mn, tl.where(ok, x, float("inf")))
        finite += ok.to(tl.int32)
    return tl.max(mx, 0), tl.min(mn, 0), tl.sum(finite, 0)


@triton.jit
def _pivot_pass(row_ptr, vocab, lo, top, row_max, floor, NP: tl.constexpr, BLOCK: tl.constexpr):
    """Pivots over ``(lo, top]`` and their statistics; elements under ``floor`` count as ``-inf``."""
    i = tl.arange(0, NP) + 1
    piv = lo + (top - lo) * (i.to(tl.float32) / NP)
    piv = tl.where(i == NP, top, tl.minimum(piv, top))
    cnt = tl.zeros([NP], tl.int32)
    mass = tl.zeros([NP], tl.float32)
    above_min = tl.full([NP], float("inf"), tl.float32)
    below_max = tl.full([NP], float("-inf"), tl.float32)
    mass_lo = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        x = tl.where(x >= floor, x, float("-inf"))
        e = tl.exp(x - row_max)
        mass_lo += tl.where(x >= lo, e, 0.0)
        ge = x[:, None] >= piv[None, :]
        cnt += tl.sum(ge.to(tl.int32), 0)
        mass += tl.sum(tl.where(ge, e[:, None], 0.0), 0)
        above_min = tl.minimum(above_min, tl.min(tl.where(ge, x[:, None], float("inf")), 0))
        below_max = tl.maximum(below_max, tl.max(tl.where(ge, float("-inf"), x[:, None]), 0))
    return cnt, mass, above_min, below_max, tl.sum(mass_lo, 0)


@triton.jit
def _search(row_ptr, vocab, lo, top, row_max, floor, target_count, target_frac, BY_MASS: tl.constexpr,
            NP: tl.constexpr, BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr):
    """Largest element ``v`` in ``[lo, top]`` with count (or mass fraction) of ``{x >= v}`` at the target."""
    idx = tl.arange(0, NP)
    target_mass = tl.zeros([], tl.float32)
    passes = tl.zeros([], tl.int32)
    searching = lo < top
    while searching:
        cnt, mass, above_min, below_max, mass_lo = _pivot_pass(row_ptr, vocab, lo, top, row_max, floor, NP, BLOCK)
        if BY_MASS:
            target_mass = tl.where(passes == 0, target_frac * mass_lo, target_mass)
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
def _top_k_top_p_kernel(
    logits_ptr, row_stride, k_ptr, p_ptr, vocab,
    HAS_K: tl.constexpr, HAS_P: tl.constexpr, NP: tl.constexpr, BLOCK: tl.constexpr, MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    row_max, row_min, finite = _row_stats(row_ptr, vocab, BLOCK)
    threshold = tl.full([], float("-inf"), tl.float32)
    if HAS_K:
        k = tl.load(k_ptr + row).to(tl.int32)
        if (k > 0) & (k < finite):
            threshold = _search(row_ptr, vocab, row_min, row_max, row_max, float("-inf"), k, 0.0, False, NP, BLOCK,
                                MAX_PASSES)
    if HAS_P:
        p = tl.load(p_ptr + row)
        if (p < 1.0) & (finite > 0):
            lo = tl.maximum(threshold, row_min)
            threshold = _search(row_ptr, vocab, lo, row_max, row_max, threshold, 0, p, True, NP, BLOCK, MAX_PASSES)
    if threshold > float("-inf"):
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < vocab
            x = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(row_ptr + offs, tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty),
                     mask=mask & (x < threshold))


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    if rows == 0 or (k is None and p is None):
        return logits
    block = min(triton.next_power_of_2(vocab), 128 if IS_INTERPRETED else 512)
    _top_k_top_p_kernel[(rows,)](
        logits, logits.stride(0), k if k is not None else logits, p.to(torch.float32) if p is not None else logits,
        vocab, HAS_K=k is not None, HAS_P=p is not None, NP=NUM_PIVOTS, BLOCK=block, MAX_PASSES=MAX_PASSES,
        num_warps=8,
    )
    return logits
