"""Triton kernels of :mod:`vllm_ascend.kernels.rejection`.

One program per request verifies all of its draft positions at once: a ``[SPEC]`` vector of
positions (``SPEC`` = :func:`spec_block`, a power of two of at least ``MIN_SPEC``, so that every
draft length up to it shares one compiled variant), the first rejected position as a min-reduction,
then one masked store for the written prefix and one for the bonus token. No loop carries state
from one position to the next. Recovered tokens take one program per (request, position), each
streaming its vocabulary row in tiles with a running (max, lowest index).

Block verification is the exception: its weight carries from each position to the next, so one
program per request walks its positions in order, streaming each row once for the residual sums,
then the stop row once more for the residual draw.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._triton.common import IS_INTERPRETED, vocab_block

MIN_SPEC = 16  # draft lengths up to this share one compiled variant
EXPAND_BLOCK = 128
NO_INDEX = tl.constexpr(2**31 - 1)


def spec_block(max_spec_len: int) -> int:
    """Positions per program: a power of two, at least :data:`MIN_SPEC`."""
    return max(MIN_SPEC, triton.next_power_of_2(max(max_spec_len, 1)))


@triton.jit
def _span(cu_ptr, req):
    """``[start, end)`` of request ``req``'s tokens from the inclusive cumulative counts."""
    end = tl.load(cu_ptr + req).to(tl.int64)
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0).to(tl.int64)
    return start, end


@triton.jit
def _write_prefix(out_ptr, out_stride, req, pos, n, tokens, rejected, bonus_ptr):
    """Write ``tokens`` up to and including the first rejected position; the bonus token after
    ``n`` accepted positions."""
    first = tl.min(tl.where(rejected & (pos < n), pos, NO_INDEX), 0)
    row = out_ptr + req.to(tl.int64) * out_stride
    tl.store(row + pos, tokens.to(out_ptr.dtype.element_ty), mask=(pos < n) & (pos <= first))
    if first == NO_INDEX:
        tl.store(row + n, tl.load(bonus_ptr + req).to(out_ptr.dtype.element_ty))


@triton.jit
def _uniform(ptr, mask, UP: tl.constexpr):
    """The uniform at ``ptr`` as float32, with no float64 arithmetic (triton-ascend refuses float64 casts
    on Ascend before A5). A float64 ``u >= 0`` is read as its bits and rounded to the nearest float32
    above it (``UP``) or below it, which keeps every comparison with a float32 ``x`` exact:
    ``x >= u`` iff ``x >= up(u)``, ``u < x`` iff ``down(u) < x``."""
    if ptr.dtype.element_ty == tl.float64:
        bits = tl.load(ptr.to(tl.pointer_type(tl.int64), bitcast=True), mask=mask, other=0)
        exp = bits >> 52
        full = (bits & 0xFFFFFFFFFFFFF) | ((exp > 0).to(tl.int64) << 52)
        # float32 steps: 24 significant bits, or 2**-149 below 2**-126 (926 = 1075 - 149)
        shift = tl.minimum(tl.maximum(926 - tl.maximum(exp, 1), 29), 63)
        kept = full >> shift
        f32 = (tl.maximum(exp - 897, 0) << 23) + kept
        if UP:
            f32 += ((kept << shift) != full).to(tl.int64)
        return f32.to(tl.int32).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _greedy_kernel(
    out_ptr,
    out_stride,
    cu_ptr,
    draft_ptr,
    argmax_ptr,
    bonus_ptr,
    is_greedy_ptr,
    HAS_IS_GREEDY: tl.constexpr,
    SPEC: tl.constexpr,
):
    req = tl.program_id(0)
    greedy = True
    if HAS_IS_GREEDY:
        greedy = tl.load(is_greedy_ptr + req) != 0
    if greedy:
        start, end = _span(cu_ptr, req)
        n = end - start
        pos = tl.arange(0, SPEC)
        inside = pos < n
        draft = tl.load(draft_ptr + start + pos, mask=inside, other=0).to(tl.int64)
        target = tl.load(argmax_ptr + start + pos, mask=inside, other=0).to(tl.int64)
        _write_prefix(out_ptr, out_stride, req, pos, n, target, draft != target, bonus_ptr)


@triton.jit
def _random_kernel(
    out_ptr,
    out_stride,
    cu_ptr,
    draft_ptr,
    draft_probs_ptr,
    target_probs_ptr,
    bonus_ptr,
    recovered_ptr,
    uniform_ptr,
    is_greedy_ptr,
    vocab,
    HAS_DRAFT_PROBS: tl.constexpr,
    SPEC: tl.constexpr,
):
    req = tl.program_id(0)
    if tl.load(is_greedy_ptr + req) == 0:
        start, end = _span(cu_ptr, req)
        n = end - start
        pos = tl.arange(0, SPEC)
        inside = pos < n
        token = start + pos
        draft = tl.load(draft_ptr + token, mask=inside, other=-1).to(tl.int64)
        valid = inside & (draft >= 0)
        at = token * vocab + tl.where(valid, draft, 0)
        p = tl.load(target_probs_ptr + at, mask=valid, other=0.0)
        q = tl.full([SPEC], 1.0, tl.float32)
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_probs_ptr + at, mask=valid, other=0.0)
        u = _uniform(uniform_ptr + token, inside, True)
        accepted = valid & (q > 0) & (p / tl.where(q > 0, q, 1.0) >= u)
        recovered = tl.load(recovered_ptr + token, mask=inside, other=0).to(tl.int64)
        _write_prefix(
            out_ptr, out_stride, req, pos, n, tl.where(accepted, draft, recovered), accepted == 0, bonus_ptr
        )


@triton.jit
def _recovered_kernel(
    out_ptr,
    cu_ptr,
    draft_ptr,
    draft_probs_ptr,
    target_probs_ptr,
    inv_q_ptr,
    vocab,
    HAS_DRAFT_PROBS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    start, end = _span(cu_ptr, req)
    token = start + tl.program_id(1)
    if token < end:
        draft = tl.load(draft_ptr + token).to(tl.int64)
        best = tl.full([], -1.0, tl.float32)
        best_id = tl.full([], 0, tl.int64)
        row = token * vocab
        for v0 in range(0, vocab, BLOCK):
            v = v0 + tl.arange(0, BLOCK)
            inside = v < vocab
            prob = tl.load(target_probs_ptr + row + v, mask=inside, other=0.0)
            if HAS_DRAFT_PROBS:
                prob = tl.maximum(prob - tl.load(draft_probs_ptr + row + v, mask=inside, other=0.0), 0.0)
            else:
                prob = tl.where(v == draft, 0.0, prob)
            score = prob * tl.load(inv_q_ptr + req.to(tl.int64) * vocab + v, mask=inside, other=0.0)
            score = tl.where(inside, score, -1.0)
            top = tl.max(score, 0)
            if top > best:  # earlier tiles win ties: the lowest id overall
                best = top
                best_id = tl.min(tl.where(score == top, v, NO_INDEX), 0).to(tl.int64)
        tl.store(out_ptr + token, best_id.to(out_ptr.dtype.element_ty))


@triton.jit
def _block_row_sums(
    draft_probs_ptr,
    target_probs_ptr,
    row,
    draft,
    w,
    vocab,
    HAS_DRAFT_PROBS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``(sum (w p - q)+, sum (q - w p)+)`` over one vocabulary row."""
    num = tl.zeros([], tl.float32)
    den = tl.zeros([], tl.float32)
    for v0 in range(0, vocab, BLOCK):
        v = v0 + tl.arange(0, BLOCK)
        inside = v < vocab
        scaled = w * tl.load(target_probs_ptr + row + v, mask=inside, other=0.0)
        if HAS_DRAFT_PROBS:
            q = tl.where(draft >= 0, tl.load(draft_probs_ptr + row + v, mask=inside, other=0.0), 0.0)
        else:
            q = tl.where(v == draft, 1.0, 0.0)
        num += tl.sum(tl.maximum(scaled - q, 0.0), 0)
        den += tl.sum(tl.maximum(q - scaled, 0.0), 0)
    return num, den


@triton.jit
def _block_kernel(
    out_ptr,
    out_stride,
    cu_ptr,
    draft_ptr,
    draft_probs_ptr,
    target_probs_ptr,
    bonus_ptr,
    uniform_ptr,
    inv_q_ptr,
    is_greedy_ptr,
    vocab,
    HAS_DRAFT_PROBS: tl.constexpr,
    BLOCK: tl.constexpr,
    SPEC: tl.constexpr,
):
    req = tl.program_id(0)
    if tl.load(is_greedy_ptr + req) == 0:
        start, end = _span(cu_ptr, req)
        n = end - start
        w = tl.full([], 1.0, tl.float32)
        stop = n * 0
        stop_w = w
        for j in range(0, n):
            token = start + j
            draft = tl.load(draft_ptr + token).to(tl.int64)
            if j > 0:
                num, den = _block_row_sums(
                    draft_probs_ptr, target_probs_ptr, token * vocab, draft, w, vocab, HAS_DRAFT_PROBS, BLOCK
                )
                h = tl.where(den > 0, num / tl.where(den > 0, den, 1.0), tl.where(num > 0, 1.0, 0.0))
                if _uniform(uniform_ptr + token - 1, True, True) <= tl.minimum(h, 1.0):
                    stop = j
                    stop_w = w
            at = token * vocab + tl.maximum(draft, 0)
            p = tl.load(target_probs_ptr + at)
            q = tl.where(draft >= 0, 1.0, 0.0)
            if HAS_DRAFT_PROBS:
                q = tl.where(draft >= 0, tl.load(draft_probs_ptr + at), 0.0)
            ratio = tl.where(q > 0, p / tl.where(q > 0, q, 1.0), 0.0)
            w = tl.minimum(w * ratio, 1.0)
        if n > 0:
            if _uniform(uniform_ptr + end - 1, True, True) <= w:
                stop = n
                stop_w = w
        best_id = tl.full([], 0, tl.int64)
        if stop < n:
            token = start + stop
            draft = tl.load(draft_ptr + token).to(tl.int64)
            row = token * vocab
            best = tl.full([], -1.0, tl.float32)
            for v0 in range(0, vocab, BLOCK):
                v = v0 + tl.arange(0, BLOCK)
                inside = v < vocab
                scaled = stop_w * tl.load(target_probs_ptr + row + v, mask=inside, other=0.0)
                if HAS_DRAFT_PROBS:
                    q = tl.where(draft >= 0, tl.load(draft_probs_ptr + row + v, mask=inside, other=0.0), 0.0)
                else:
                    q = tl.where(v == draft, 1.0, 0.0)
                inv = tl.load(inv_q_ptr + req.to(tl.int64) * vocab + v, mask=inside, other=0.0)
                score = tl.where(inside, tl.maximum(scaled - q, 0.0) * inv, -1.0)
                top = tl.max(score, 0)
                if top > best:  # earlier tiles win ties: the lowest id overall
                    best = top
                    best_id = tl.min(tl.where(score == top, v, NO_INDEX), 0).to(tl.int64)
        pos = tl.arange(0, SPEC)
        drafts = tl.load(draft_ptr + start + pos, mask=pos < n, other=0).to(tl.int64)
        tokens = tl.where(pos < stop, drafts, best_id)
        _write_prefix(out_ptr, out_stride, req, pos, n, tokens, pos == stop, bonus_ptr)


@triton.jit
def _entropy_threshold_kernel(out_ptr, probs_ptr, vocab, epsilon, alpha, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    entropy = tl.zeros([], tl.float32)
    for v0 in range(0, vocab, BLOCK):
        v = v0 + tl.arange(0, BLOCK)
        p = tl.load(probs_ptr + row * vocab + v, mask=v < vocab, other=0.0)
        entropy += tl.sum(tl.where(p > 0, -p * tl.log(tl.where(p > 0, p, 1.0)), 0.0), 0)
    tl.store(out_ptr + row, tl.minimum(epsilon, alpha * tl.exp(-entropy)))


@triton.jit
def _synthetic_kernel(
    out_ptr,
    out_stride,
    cu_ptr,
    draft_ptr,
    replacement_ptr,
    bonus_ptr,
    uniform_ptr,
    rates_ptr,
    num_rates,
    SPEC: tl.constexpr,
):
    req = tl.program_id(0)
    start, end = _span(cu_ptr, req)
    n = end - start
    pos = tl.arange(0, SPEC)
    inside = pos < n
    draft = tl.load(draft_ptr + start + pos, mask=inside, other=-1).to(tl.int64)
    u = _uniform(uniform_ptr + start + pos, inside, False)
    rate = tl.load(rates_ptr + pos, mask=pos < num_rates, other=0.0)
    accepted = inside & (draft >= 0) & (pos < num_rates) & (u < rate)
    replacement = tl.load(replacement_ptr + start + pos, mask=inside, other=0).to(tl.int64)
    _write_prefix(
        out_ptr, out_stride, req, pos, n, tl.where(accepted, draft, replacement), accepted == 0, bonus_ptr
    )


@triton.jit(do_not_specialize=["replace_from", "replace_to"])
def _expand_kernel(out_ptr, x_ptr, cu_ptr, replace_from, replace_to, BLOCK: tl.constexpr):
    req = tl.program_id(0)
    start, end = _span(cu_ptr, req)
    x = tl.load(x_ptr + req)
    x = tl.where(x == replace_from, replace_to, x).to(out_ptr.dtype.element_ty)
    for s in range(start, end, BLOCK):
        offs = s + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.full([BLOCK], 0, out_ptr.dtype.element_ty) + x, mask=offs < end)


def rejection_greedy_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None = None,
) -> torch.Tensor:
    if output.shape[0]:
        _greedy_kernel[(output.shape[0],)](
            output,
            output.stride(0),
            cu_num_draft_tokens,
            draft_token_ids,
            target_argmax,
            bonus_token_ids.reshape(-1),
            output if is_greedy is None else is_greedy,
            HAS_IS_GREEDY=is_greedy is not None,
            SPEC=spec_block(output.shape[1] - 1),
        )
    return output


def rejection_random_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor,
) -> torch.Tensor:
    if output.shape[0]:
        _random_kernel[(output.shape[0],)](
            output,
            output.stride(0),
            cu_num_draft_tokens,
            draft_token_ids,
            target_probs if draft_probs is None else draft_probs.contiguous(),
            target_probs.contiguous(),
            bonus_token_ids.reshape(-1),
            recovered_token_ids,
            uniform_probs,
            is_greedy,
            target_probs.shape[-1],
            HAS_DRAFT_PROBS=draft_probs is not None,
            SPEC=spec_block(output.shape[1] - 1),
        )
    return output


def sample_recovered_tokens(
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    inv_q: torch.Tensor,
) -> torch.Tensor:
    out = torch.empty_like(draft_token_ids)
    batch = cu_num_draft_tokens.numel()
    if out.numel() and batch and max_spec_len > 0:
        vocab = target_probs.shape[-1]
        _recovered_kernel[(batch, max_spec_len)](
            out,
            cu_num_draft_tokens,
            draft_token_ids,
            target_probs if draft_probs is None else draft_probs.contiguous(),
            target_probs.contiguous(),
            inv_q.to(torch.float32).contiguous(),
            vocab,
            HAS_DRAFT_PROBS=draft_probs is not None,
            BLOCK=vocab_block(vocab, 1024 if not IS_INTERPRETED else 64),
        )
    return out


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    out = torch.empty(num_tokens, dtype=x.dtype, device=x.device)
    if num_tokens and x.numel():
        _expand_kernel[(x.numel(),)](out, x, cu_num_tokens, replace_from, replace_to, BLOCK=EXPAND_BLOCK)
    return out


def rejection_block_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    inv_q: torch.Tensor,
    is_greedy: torch.Tensor,
) -> torch.Tensor:
    if output.shape[0]:
        vocab = target_probs.shape[-1]
        _block_kernel[(output.shape[0],)](
            output,
            output.stride(0),
            cu_num_draft_tokens,
            draft_token_ids,
            target_probs if draft_probs is None else draft_probs.contiguous(),
            target_probs.contiguous(),
            bonus_token_ids.reshape(-1),
            uniform_probs,
            inv_q.to(torch.float32).contiguous(),
            is_greedy,
            vocab,
            HAS_DRAFT_PROBS=draft_probs is not None,
            BLOCK=vocab_block(vocab, 1024 if not IS_INTERPRETED else 64),
            SPEC=spec_block(output.shape[1] - 1),
        )
    return output


def typical_acceptance_threshold(target_probs: torch.Tensor, epsilon: float, alpha: float) -> torch.Tensor:
    out = torch.empty(target_probs.shape[0], dtype=torch.float32, device=target_probs.device)
    if out.numel():
        vocab = target_probs.shape[-1]
        _entropy_threshold_kernel[(out.numel(),)](
            out,
            target_probs.contiguous(),
            vocab,
            float(epsilon),
            float(alpha),
            BLOCK=vocab_block(vocab, 1024 if not IS_INTERPRETED else 64),
        )
    return out


def rejection_synthetic_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    replacement_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    conditional_rates: torch.Tensor,
) -> torch.Tensor:
    if output.shape[0]:
        _synthetic_kernel[(output.shape[0],)](
            output,
            output.stride(0),
            cu_num_draft_tokens,
            draft_token_ids,
            replacement_token_ids,
            bonus_token_ids.reshape(-1),
            uniform_probs,
            conditional_rates.contiguous(),
            conditional_rates.numel(),
            SPEC=spec_block(output.shape[1] - 1),
        )
    return output
