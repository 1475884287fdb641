"""Triton logprob kernels: one program per row computes the log-sum-exp in one online pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._triton.common import ROW_WARPS, SMALL_BATCH_ROWS, check_logits, row_block


@triton.jit
def _row_lse(row_ptr, vocab, chosen, COUNT_ABOVE: tl.constexpr, BLOCK: tl.constexpr):
    """Online log-sum-exp of a row (float32) and, optionally, ``#{x > chosen}``."""
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    above = tl.zeros([BLOCK], tl.int32)
    offs = tl.arange(0, BLOCK)
    nxt = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf"))
    for start in range(0, vocab, BLOCK):
        x = nxt.to(tl.float32)
        offs = start + BLOCK + tl.arange(0, BLOCK)
        nxt = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf"))
        new_max = tl.maximum(run_max, x)
        safe = tl.where(new_max > float("-inf"), new_max, 0.0)
        run_sum = run_sum * tl.exp(run_max - safe) + tl.exp(x - safe)
        run_max = new_max
        if COUNT_ABOVE:
            above += (x > chosen).to(tl.int32)
    m = tl.max(run_max, 0)
    total = tl.sum(run_sum * tl.exp(run_max - m), 0)
    return m + tl.log(total), tl.sum(above, 0)


@triton.jit
def _token_logprob_kernel(
    logits_ptr, row_stride, ids_ptr, num_ids, out_ptr, vocab, IDS: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    lse, _ = _row_lse(row_ptr, vocab, 0.0, False, BLOCK)
    k = tl.arange(0, IDS)
    valid = k < num_ids
    ids = tl.load(ids_ptr + row * num_ids + k, mask=valid, other=0)
    x = tl.load(row_ptr + ids, mask=valid).to(tl.float32)
    tl.store(out_ptr + row * num_ids + k, x - lse, mask=valid)


@triton.jit
def _lse_rank_kernel(logits_ptr, row_stride, chosen_ptr, lse_ptr, rank_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    chosen = tl.load(row_ptr + tl.load(chosen_ptr + row)).to(tl.float32)
    lse, above = _row_lse(row_ptr, vocab, chosen, True, BLOCK)
    tl.store(lse_ptr + row, lse)
    tl.store(rank_ptr + row, above.to(tl.int64) + 1)


def _lse_block(rows: int, vocab: int) -> int:
    # Few rows: few programs, so each needs more bytes in flight (H200: 8192 best up to ~128 rows).
    return row_block(vocab, 8192 if rows <= SMALL_BATCH_ROWS else 4096)


def compute_token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    check_logits(logits)
    rows, vocab = logits.shape
    ids = token_ids.reshape(rows, -1).contiguous()
    out = torch.empty(ids.shape, dtype=torch.float32, device=logits.device)
    if out.numel():
        _token_logprob_kernel[(rows,)](
            logits,
            logits.stride(0),
            ids,
            ids.shape[1],
            out,
            vocab,
            IDS=triton.next_power_of_2(ids.shape[1]),
            BLOCK=_lse_block(rows, vocab),
            num_warps=ROW_WARPS,
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
        _lse_rank_kernel[(rows,)](
            logits,
            logits.stride(0),
            chosen,
            lse,
            ranks,
            vocab,
            BLOCK=_lse_block(rows, vocab),
            num_warps=ROW_WARPS,
        )
    top_x, top_ids = logits.topk(num_logprobs, dim=1)
    ids = torch.cat([chosen.unsqueeze(1), top_ids], dim=1)
    vals = torch.cat([logits.gather(1, chosen.unsqueeze(1)), top_x], dim=1).to(torch.float32)
    return ids, vals - lse.unsqueeze(1), ranks
