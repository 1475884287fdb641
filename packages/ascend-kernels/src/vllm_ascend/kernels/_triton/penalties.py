"""Triton kernels of :mod:`vllm_ascend.kernels.penalties`: the kept counts, added to, cleared and applied.

- add: one lane per entry. The prompt bit is set with an atomic OR, an output occurrence added with an
  atomic add; the lane that finds the word at zero (exactly one per new token) takes a position in its
  slot's ``seen`` list with an atomic add on ``num_seen`` and writes the token there.
- clear: one program per slot, zeroing the words its ``seen`` list names.
- apply: programs ``(row, part)``, each over ``BLOCK`` entries of the row's ``seen`` list: gather the
  words and logits of those tokens, apply, store. Every distinct token is one entry, so no two lanes
  write one logit and nothing is atomic. Draft tokens of the row (``extra``) add to the counts of
  listed tokens; those not listed are applied by part 0, once per distinct token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import penalties as ref
from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, check_logits, ub_cap

PROMPT_BIT = tl.constexpr(ref.PROMPT_BIT)
COUNT_MASK = tl.constexpr(ref.COUNT_MASK)
ADD_BLOCK = 64 if IS_INTERPRETED else 1024
CLEAR_BLOCK = 64 if IS_INTERPRETED else 1024
APPLY_BLOCK = 32 if IS_INTERPRETED else 1024  # small under the interpreter: the tests cover several parts
WARPS = 4


@triton.jit
def _add_kernel(
    counts_ptr,
    counts_stride,
    seen_ptr,
    seen_stride,
    capacity,
    num_seen_ptr,
    slot_ptr,
    tok_ptr,
    prompt_ptr,
    n,
    vocab,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    slot = tl.load(slot_ptr + offs, mask=m, other=-1).to(tl.int64)
    tok = tl.load(tok_ptr + offs, mask=m, other=-1).to(tl.int64)
    is_prompt = tl.load(prompt_ptr + offs, mask=m, other=0).to(tl.int32) != 0
    ok = m & (slot >= 0) & (tok >= 0) & (tok < vocab)
    safe_slot = tl.where(ok, slot, 0)
    word_ptr = counts_ptr + safe_slot * counts_stride + tl.where(ok, tok, 0)
    old_prompt = tl.atomic_or(word_ptr, tl.full([BLOCK], PROMPT_BIT, tl.int32), mask=ok & is_prompt)
    old_output = tl.atomic_add(word_ptr, tl.full([BLOCK], 1, tl.int32), mask=ok & (is_prompt == 0))
    new = ok & (tl.where(is_prompt, old_prompt, old_output) == 0)
    pos = tl.atomic_add(num_seen_ptr + safe_slot, tl.full([BLOCK], 1, tl.int32), mask=new)
    tl.store(seen_ptr + safe_slot * seen_stride + pos, tok.to(tl.int32), mask=new & (pos < capacity))


@triton.jit
def _clear_kernel(
    counts_ptr, counts_stride, seen_ptr, seen_stride, capacity, num_seen_ptr, slot_ptr, BLOCK: tl.constexpr
):
    slot = tl.load(slot_ptr + tl.program_id(0)).to(tl.int64)
    n = tl.minimum(tl.load(num_seen_ptr + slot), capacity)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        tok = tl.load(seen_ptr + slot * seen_stride + offs, mask=m, other=0).to(tl.int64)
        tl.store(counts_ptr + slot * counts_stride + tok, tl.zeros([BLOCK], tl.int32), mask=m)
    tl.store(num_seen_ptr + slot, 0)


@triton.jit
def _penalize(x, in_prompt, count, rep, freq, pres):
    """The penalties of tokens with output ``count`` (int32) and prompt membership, in float32."""
    in_output = count > 0
    x = tl.where(in_prompt | in_output, tl.where(x > 0, x / rep, x * rep), x)
    return x - freq * count.to(tl.float32) - pres * in_output.to(tl.float32)


@triton.jit(do_not_specialize=["n_extra"])
def _apply_kernel(
    logits_ptr,
    row_stride,
    slot_ptr,
    counts_ptr,
    counts_stride,
    seen_ptr,
    seen_stride,
    capacity,
    num_seen_ptr,
    rep_ptr,
    freq_ptr,
    pres_ptr,
    extra_ptr,
    extra_stride,
    n_extra,
    vocab,
    BLOCK: tl.constexpr,
    EB: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    rep = tl.load(rep_ptr + row).to(tl.float32)
    freq = tl.load(freq_ptr + row).to(tl.float32)
    pres = tl.load(pres_ptr + row).to(tl.float32)
    active = (slot >= 0) & ((rep != 1.0) | (freq != 0.0) | (pres != 0.0))
    slot = tl.where(active, slot, 0)
    n = tl.where(active, tl.minimum(tl.load(num_seen_ptr + slot), capacity), 0)
    row_ptr = logits_ptr + row * row_stride
    words_ptr = counts_ptr + slot * counts_stride
    offs = part * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tok = tl.load(seen_ptr + slot * seen_stride + offs, mask=m, other=0).to(tl.int64)
    word = tl.load(words_ptr + tok, mask=m, other=0)
    x = tl.load(row_ptr + tok, mask=m, other=0.0).to(tl.float32)
    count = word & COUNT_MASK
    if HAS_EXTRA:
        for k in range(n_extra):
            count += (tok == tl.load(extra_ptr + row * extra_stride + k).to(tl.int64)).to(tl.int32)
    x = _penalize(x, (word & PROMPT_BIT) != 0, count, rep, freq, pres)
    tl.store(row_ptr + tok, x.to(logits_ptr.dtype.element_ty), mask=m)
    if HAS_EXTRA:
        # Draft tokens the slot has not seen: applied once each, by the first draft naming it.
        j = tl.arange(0, EB)
        live = j < tl.where(active & (part == 0), n_extra, 0)
        e = tl.load(extra_ptr + row * extra_stride + j, mask=live, other=-1).to(tl.int64)
        ok = live & (e >= 0) & (e < vocab)
        unseen = tl.load(words_ptr + tl.where(ok, e, 0), mask=ok, other=1) == 0
        same = (e[:, None] == e[None, :]) & ok[None, :]
        drafts = tl.sum(same.to(tl.int32), 1)
        earlier = tl.sum((same & (j[None, :] < j[:, None])).to(tl.int32), 1)
        own = ok & unseen & (earlier == 0)
        y = tl.load(row_ptr + e, mask=own, other=0.0).to(tl.float32)
        in_prompt = tl.zeros([EB], tl.int32) != 0  # a token the slot has not seen is in no prompt
        y = _penalize(y, in_prompt, drafts, rep, freq, pres)
        tl.store(row_ptr + e, y.to(logits_ptr.dtype.element_ty), mask=own)


def penalty_counts_add(
    counts: torch.Tensor,
    seen: torch.Tensor,
    num_seen: torch.Tensor,
    slots: torch.Tensor,
    tokens: torch.Tensor,
    is_prompt: torch.Tensor,
) -> None:
    n = tokens.numel()
    if n == 0:
        return
    block = min(triton.next_power_of_2(n), ADD_BLOCK)
    _add_kernel[(triton.cdiv(n, block),)](
        counts,
        counts.stride(0),
        seen,
        seen.stride(0),
        seen.shape[1],
        num_seen,
        slots,
        tokens,
        is_prompt,
        n,
        counts.shape[1],
        BLOCK=block,
        **launch(counts.device, WARPS),
    )


def penalty_counts_clear(
    counts: torch.Tensor, seen: torch.Tensor, num_seen: torch.Tensor, slots: torch.Tensor
) -> None:
    if slots.numel() == 0:
        return
    _clear_kernel[(slots.numel(),)](
        counts,
        counts.stride(0),
        seen,
        seen.stride(0),
        seen.shape[1],
        num_seen,
        slots,
        BLOCK=CLEAR_BLOCK,
        **launch(counts.device, WARPS),
    )


def apply_penalties(
    logits: torch.Tensor,
    slots: torch.Tensor,
    counts: torch.Tensor,
    seen: torch.Tensor,
    num_seen: torch.Tensor,
    repetition_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
    extra_output_ids: torch.Tensor | None = None,
    max_seen: int | None = None,
) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    capacity = seen.shape[1]
    bound = capacity if max_seen is None else min(max_seen, capacity)
    block = min(triton.next_power_of_2(max(bound, 1)), ub_cap(logits.device, APPLY_BLOCK))
    has_extra = extra_output_ids is not None and extra_output_ids.numel() > 0
    parts = max(triton.cdiv(bound, block), int(has_extra))  # part 0 applies the drafts the slots lack
    if rows == 0 or parts == 0:
        return logits
    extra = extra_output_ids if has_extra else slots
    assert extra is not None
    n_extra = extra.shape[1] if has_extra else 0
    f32 = torch.float32
    _apply_kernel[(rows, parts)](
        logits,
        logits.stride(0),
        slots,
        counts,
        counts.stride(0),
        seen,
        seen.stride(0),
        capacity,
        num_seen,
        repetition_penalty.to(f32),
        frequency_penalty.to(f32),
        presence_penalty.to(f32),
        extra,
        extra.stride(0),
        n_extra,
        vocab,
        BLOCK=block,
        EB=triton.next_power_of_2(max(n_extra, 1)),
        HAS_EXTRA=has_extra,
        **launch(logits.device, WARPS),
    )
    return logits
