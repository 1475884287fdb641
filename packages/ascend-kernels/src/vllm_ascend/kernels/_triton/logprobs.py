"""Triton logprob kernels: an online log-sum-exp per row chunk, then a tiny combine.

Large batches and short rows run one program per row (one chunk) and write the result directly.
Batches of fewer rows than multiprocessors with long rows split each row into chunks so that every
multiprocessor streams; each program writes its chunk's ``(max, sum of exp(x - max)[, #{x >
chosen}])`` and a combine kernel (one program per row) merges them. The chunk count is a runtime
argument (not a compile-time specialisation).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._triton.common import (
    IS_INTERPRETED,
    ROW_WARPS,
    SMALL_BATCH_ROWS,
    check_logits,
    row_block,
    row_split,
    scratch,
)

COMBINE_BLOCK = 128
PER_SM = 1  # split only batches of fewer rows than multiprocessors (H200: B = 256 runs best unsplit)
# ... and only rows of at least this many tiles: the combine launch costs ~2 us, so on an H200 a
# split 64 x 32000 row set took 11.2 us against 9.2 unsplit, while 64 x 151936 gained (24.3 -> 22.8).
MIN_SPLIT_TILES = 1 if IS_INTERPRETED else 16


@triton.jit
def _chunk_lse(row_ptr, begin, end, chosen, COUNT_ABOVE: tl.constexpr, BLOCK: tl.constexpr):
    """``(max, sum of exp(x - max), #{x > chosen})`` over ``[begin, end)`` of a row (float32)."""
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    above = tl.zeros([BLOCK], tl.int32)
    offs = begin + tl.arange(0, BLOCK)
    nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
    for start in range(begin, end, BLOCK):
        x = nxt.to(tl.float32)
        offs = start + BLOCK + tl.arange(0, BLOCK)
        nxt = tl.load(row_ptr + offs, mask=offs < end, other=float("-inf"))
        new_max = tl.maximum(run_max, x)
        safe = tl.where(new_max > float("-inf"), new_max, 0.0)
        run_sum = run_sum * tl.exp(run_max - safe) + tl.exp(x - safe)
        run_max = new_max
        if COUNT_ABOVE:
            above += (x > chosen).to(tl.int32)
    m = tl.max(run_max, 0)
    safe = tl.where(m > float("-inf"), m, 0.0)
    return m, tl.sum(run_sum * tl.exp(run_max - safe), 0), tl.sum(above, 0)


@triton.jit
def _combine(
    part_m_ptr, part_s_ptr, part_a_ptr, base, num_chunks, COUNT_ABOVE: tl.constexpr, CB: tl.constexpr
):
    """Log-sum-exp and count of one row from its ``num_chunks`` partials at ``base``."""
    m = tl.full([], float("-inf"), tl.float32)
    for c0 in range(0, num_chunks, CB):
        c = c0 + tl.arange(0, CB)
        m = tl.maximum(m, tl.max(tl.load(part_m_ptr + base + c, mask=c < num_chunks, other=float("-inf")), 0))
    safe = tl.where(m > float("-inf"), m, 0.0)
    total = tl.zeros([], tl.float32)
    above = tl.zeros([], tl.int32)
    for c0 in range(0, num_chunks, CB):
        c = c0 + tl.arange(0, CB)
        mask = c < num_chunks
        pm = tl.load(part_m_ptr + base + c, mask=mask, other=float("-inf"))
        ps = tl.load(part_s_ptr + base + c, mask=mask, other=0.0)
        total += tl.sum(ps * tl.exp(pm - safe), 0)
        if COUNT_ABOVE:
            above += tl.sum(tl.load(part_a_ptr + base + c, mask=mask, other=0), 0)
    return m + tl.log(total), above


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
    vocab,
    chunk,
    num_chunks,
    IDS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    begin = part * chunk
    m, s, _ = _chunk_lse(row_ptr, begin, tl.minimum(begin + chunk, vocab), 0.0, False, BLOCK)
    if num_chunks == 1:
        _store_token_logprobs(row_ptr, row, m + tl.log(s), ids_ptr, num_ids, out_ptr, IDS)
    else:
        tl.store(part_m_ptr + row * num_chunks + part, m)
        tl.store(part_s_ptr + row * num_chunks + part, s)


@triton.jit(do_not_specialize=["num_chunks"])
def _token_logprob_combine_kernel(
    logits_ptr,
    row_stride,
    ids_ptr,
    num_ids,
    out_ptr,
    part_m_ptr,
    part_s_ptr,
    num_chunks,
    IDS: tl.constexpr,
    CB: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    lse, _ = _combine(part_m_ptr, part_s_ptr, part_s_ptr, row * num_chunks, num_chunks, False, CB)
    _store_token_logprobs(row_ptr, row, lse, ids_ptr, num_ids, out_ptr, IDS)


@triton.jit(do_not_specialize=["num_chunks"])
def _lse_rank_kernel(
    logits_ptr,
    row_stride,
    chosen_ptr,
    lse_ptr,
    rank_ptr,
    part_m_ptr,
    part_s_ptr,
    part_a_ptr,
    vocab,
    chunk,
    num_chunks,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    chosen = tl.load(row_ptr + tl.load(chosen_ptr + row)).to(tl.float32)
    begin = part * chunk
    m, s, above = _chunk_lse(row_ptr, begin, tl.minimum(begin + chunk, vocab), chosen, True, BLOCK)
    if num_chunks == 1:
        tl.store(lse_ptr + row, m + tl.log(s))
        tl.store(rank_ptr + row, above.to(tl.int64) + 1)
    else:
        tl.store(part_m_ptr + row * num_chunks + part, m)
        tl.store(part_s_ptr + row * num_chunks + part, s)
        tl.store(part_a_ptr + row * num_chunks + part, above)


@triton.jit(do_not_specialize=["num_chunks"])
def _lse_rank_combine_kernel(
    lse_ptr, rank_ptr, part_m_ptr, part_s_ptr, part_a_ptr, num_chunks, CB: tl.constexpr
):
    row = tl.program_id(0)
    lse, above = _combine(part_m_ptr, part_s_ptr, part_a_ptr, row * num_chunks, num_chunks, True, CB)
    tl.store(lse_ptr + row, lse)
    tl.store(rank_ptr + row, above.to(tl.int64) + 1)


def _split(rows: int, vocab: int, device: torch.device) -> tuple[int, int, int]:
    """``(BLOCK, chunks, chunk)``; unsplit rows keep the one-program-per-row tiles (few rows: each
    program needs more bytes in flight, H200: 8192 best up to ~128 rows)."""
    block = row_block(vocab, 4096)
    chunks, chunk = row_split(rows, vocab, block, device, PER_SM)
    if chunks > 1 and triton.cdiv(vocab, block) >= MIN_SPLIT_TILES:
        return block, chunks, chunk
    block = row_block(vocab, 8192 if rows <= SMALL_BATCH_ROWS else 4096)
    return block, 1, triton.cdiv(vocab, block) * block


def _partials(rows: int, chunks: int, device: torch.device, n: int) -> list[torch.Tensor]:
    kinds = (("lse_m", torch.float32), ("lse_s", torch.float32), ("lse_a", torch.int32))[:n]
    return [scratch(name, rows * chunks, dtype, device) for name, dtype in kinds]


def compute_token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    ids = token_ids.reshape(rows, -1).contiguous()
    out = torch.empty(ids.shape, dtype=torch.float32, device=logits.device)
    if out.numel():
        block, chunks, chunk = _split(rows, vocab, logits.device)
        part_m, part_s = _partials(rows, chunks, logits.device, 2)
        n_ids = ids.shape[1]
        width = triton.next_power_of_2(n_ids)
        _token_logprob_kernel[(rows, chunks)](
            logits, logits.stride(0), ids, n_ids, out, part_m, part_s, vocab, chunk, chunks,
            IDS=width, BLOCK=block, num_warps=ROW_WARPS,
        )  # fmt: skip
        if chunks > 1:
            _token_logprob_combine_kernel[(rows,)](
                logits, logits.stride(0), ids, n_ids, out, part_m, part_s, chunks, IDS=width, CB=COMBINE_BLOCK
            )
    return out.reshape(token_ids.shape)


def compute_topk_logprobs(
    logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_logits(logits)
    rows, vocab = logits.shape
    chosen = token_ids.to(torch.int64).contiguous()
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    ranks = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        block, chunks, chunk = _split(rows, vocab, logits.device)
        parts = _partials(rows, chunks, logits.device, 3)
        _lse_rank_kernel[(rows, chunks)](
            logits, logits.stride(0), chosen, lse, ranks, *parts, vocab, chunk, chunks,
            BLOCK=block, num_warps=ROW_WARPS,
        )  # fmt: skip
        if chunks > 1:
            _lse_rank_combine_kernel[(rows,)](lse, ranks, *parts, chunks, CB=COMBINE_BLOCK)
    top_x, top_ids = logits.topk(num_logprobs, dim=1)
    ids = torch.cat([chosen.unsqueeze(1), top_ids], dim=1)
    vals = torch.cat([logits.gather(1, chosen.unsqueeze(1)), top_x], dim=1).to(torch.float32)
    return ids, vals - lse.unsqueeze(1), ranks
