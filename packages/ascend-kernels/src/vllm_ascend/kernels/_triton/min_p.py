"""Triton :func:`vllm_ascend.kernels.apply_min_p`: a max pass that keeps per-slot maxima, then a
masking pass that reads only the slots that can hold a kept token.

Tiles are ``[A, NG, V]`` slot tiles (:func:`.common.slots`): the max pass writes each slot's max (in
the logits' dtype, so exact) beside the row max; the masking pass writes ``-inf`` over every slot
whose max is below the threshold ``max + log(min_p)`` (``max + T * log(min_p)`` with a temperature)
without reading it, and reads the few others.
A row is read once and written once. Batches of at least one row per multiprocessor run one program
per row (both passes, a barrier between them); smaller batches split each row into chunks: a first
launch writes per-chunk maxima, a second one reduces the row's few partials and masks its chunk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels._triton.common import (
    IS_INTERPRETED,
    check_logits,
    cores,
    row_split,
    scratch,
    slot_shape,
    slots,
)

COMBINE_BLOCK = 128
PER_SM = 4  # batches of fewer rows than multiprocessors: split for this many programs per multiprocessor
# (elements per tile, warps): one program per row / split rows (H200: 32-element slots either way; H100:
# a row tile of 8192 x 8 warps or 32768 x 16 ran 1-32 % slower at B >= 256)
ROW_TILE = (128, 4) if IS_INTERPRETED else (16384, 16)
SPLIT_TILE = (128, 4) if IS_INTERPRETED else (4096, 4)


@triton.jit
def _max_pass(row_ptr, smax_ptr, begin, end, A: tl.constexpr, NG: tl.constexpr, V: tl.constexpr):
    """Row max over ``[begin, end)``; writes every slot's max to ``smax_ptr`` (slot ``begin // TILE *
    NG + lane``)."""
    TILE: tl.constexpr = A * NG * V
    local = slots(A, NG, V)
    lane = tl.arange(0, NG)
    run = tl.full([NG], float("-inf"), tl.float32)
    nxt = tl.load(row_ptr + begin + local, mask=begin + local < end, other=float("-inf"))
    for start in range(begin, end, TILE):
        x = nxt
        offs = start + TILE + local
        nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
        m = tl.max(tl.max(x, 2), 0)
        tl.store(smax_ptr + start // TILE * NG + lane, m)
        run = tl.maximum(run, m.to(tl.float32))
    return tl.max(run, 0)


@triton.jit
def _mask_pass(row_ptr, smax_ptr, begin, end, threshold, A: tl.constexpr, NG: tl.constexpr, V: tl.constexpr):
    """Write ``-inf`` over ``[begin, end)`` where ``x < threshold``. Slots whose max is below it are
    written without being read (their store waits on nothing); the next tile's slot maxima are
    loaded before this tile is written."""
    TILE: tl.constexpr = A * NG * V
    local = slots(A, NG, V)
    lane = tl.arange(0, NG)
    nxt = tl.load(smax_ptr + begin // TILE * NG + lane, mask=begin + 0 * lane < end, other=float("-inf"))
    for start in range(begin, end, TILE):
        live = nxt.to(tl.float32) >= threshold
        nxt = tl.load(
            smax_ptr + (start // TILE + 1) * NG + lane,
            mask=start + TILE + 0 * lane < end,
            other=float("-inf"),
        )
        offs = start + local
        inb = offs < end
        tl.store(
            row_ptr + offs,
            tl.full(offs.shape, float("-inf"), row_ptr.dtype.element_ty),
            mask=inb & (live[None, :, None] == 0),
        )
        x = tl.load(row_ptr + offs, mask=inb & live[None, :, None])
        tl.store(
            row_ptr + offs,
            tl.where(x.to(tl.float32) < threshold, float("-inf"), x),
            mask=inb & live[None, :, None],
        )


@triton.jit
def _log_p(minp_ptr, temp_ptr, row, HAS_TEMPERATURE: tl.constexpr):
    """``log(min_p)`` of the row, times its temperature (``T <= 0`` as 1) with ``HAS_TEMPERATURE``."""
    mp = tl.load(minp_ptr + row)
    log_p = tl.log(tl.where(mp > 0, mp, 1.0))
    if HAS_TEMPERATURE:
        t = tl.load(temp_ptr + row)
        log_p = log_p * tl.where(t > 0, t, 1.0)
    return log_p


@triton.jit
def _min_p_kernel(
    logits_ptr,
    row_stride,
    minp_ptr,
    temp_ptr,
    smax_ptr,
    n_slots,
    vocab,
    A: tl.constexpr,
    NG: tl.constexpr,
    V: tl.constexpr,
    HAS_TEMPERATURE: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    row_smax = smax_ptr + row.to(tl.int64) * n_slots
    mp = tl.load(minp_ptr + row)
    limit = tl.where(mp > 0, vocab, 0)
    log_p = _log_p(minp_ptr, temp_ptr, row, HAS_TEMPERATURE)
    threshold = _max_pass(row_ptr, row_smax, 0, limit, A, NG, V) + log_p
    tl.debug_barrier()  # the slot maxima written by every thread
    _mask_pass(row_ptr, row_smax, 0, limit, threshold, A, NG, V)


@triton.jit(do_not_specialize=["num_chunks"])
def _chunk_max_kernel(
    logits_ptr, row_stride, minp_ptr, temp_ptr, smax_ptr, n_slots, part_ptr, vocab, chunk, num_chunks,
    A: tl.constexpr, NG: tl.constexpr, V: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    begin = part * chunk
    end = tl.where(tl.load(minp_ptr + row) > 0, tl.minimum(begin + chunk, vocab), begin)
    m = _max_pass(row_ptr, smax_ptr + row.to(tl.int64) * n_slots, begin, end, A, NG, V)
    tl.store(part_ptr + row * num_chunks + part, m)


@triton.jit(do_not_specialize=["num_chunks"])
def _chunk_mask_kernel(
    logits_ptr, row_stride, minp_ptr, temp_ptr, smax_ptr, n_slots, part_ptr, vocab, chunk, num_chunks,
    A: tl.constexpr, NG: tl.constexpr, V: tl.constexpr, CB: tl.constexpr, HAS_TEMPERATURE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    mp = tl.load(minp_ptr + row)
    begin = part * chunk
    end = tl.where(mp > 0, tl.minimum(begin + chunk, vocab), begin)
    top = tl.full([], float("-inf"), tl.float32)
    for c0 in range(0, num_chunks, CB):
        c = c0 + tl.arange(0, CB)
        v = tl.load(part_ptr + row * num_chunks + c, mask=c < num_chunks, other=float("-inf"))
        top = tl.maximum(top, tl.max(v, 0))
    threshold = top + _log_p(minp_ptr, temp_ptr, row, HAS_TEMPERATURE)
    _mask_pass(row_ptr, smax_ptr + row.to(tl.int64) * n_slots, begin, end, threshold, A, NG, V)


def apply_min_p(
    logits: torch.Tensor, min_p: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    if not rows:
        return logits
    mp = min_p.to(torch.float32)
    temp = mp if temperature is None else temperature.to(torch.float32)
    tile, warps = SPLIT_TILE
    chunks, chunk = 1, vocab
    # H200: 256 rows ran best unsplit, 64 split 9 ways (H100: 256 rows split in 2 ran as fast to 28 % slower).
    if rows < cores(logits.device):
        chunks, chunk = row_split(rows, vocab, tile, logits.device, PER_SM)
    if chunks == 1:
        tile, warps = ROW_TILE
        chunk = triton.cdiv(vocab, tile) * tile
    a, ng, v = slot_shape(tile, warps, logits.dtype)
    n_slots = triton.cdiv(vocab, a * ng * v) * ng
    smax = scratch("min_p.smax", rows * n_slots, logits.dtype, logits.device)
    shape = dict(A=a, NG=ng, V=v, **launch(logits.device, warps))
    scaled = temperature is not None
    if chunks == 1:
        _min_p_kernel[(rows,)](
            logits, logits.stride(0), mp, temp, smax, n_slots, vocab, HAS_TEMPERATURE=scaled, **shape
        )
        return logits
    part = scratch("min_p", rows * chunks, torch.float32, logits.device)
    args = (logits, logits.stride(0), mp, temp, smax, n_slots, part, vocab, chunk, chunks)
    _chunk_max_kernel[(rows, chunks)](*args, **shape)
    _chunk_mask_kernel[(rows, chunks)](*args, CB=COMBINE_BLOCK, HAS_TEMPERATURE=scaled, **shape)
    return logits
