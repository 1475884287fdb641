"""Triton logprob kernels: per-chunk (max, sum-exp, count above the chosen logit), then per-row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from vllm_ascend.kernels._triton.common import check_logits, vocab_block


@triton.jit
def _lse_chunk_kernel(
    logits_ptr, row_stride, chosen_ptr, part_max_ptr, part_sum_ptr, part_cnt_ptr, vocab, num_chunks,
    COUNT_ABOVE: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    out = row * num_chunks + chunk
    tl.store(part_max_ptr + out, m)
    tl.store(part_sum_ptr + out, tl.sum(tl.exp(x - m), 0))
    if COUNT_ABOVE:
        chosen = tl.load(row_ptr + tl.load(chosen_ptr + row)).to(tl.float32)
        tl.store(part_cnt_ptr + out, tl.sum((x > chosen).to(tl.int32), 0))


@triton.jit
def _combine_lse(part_max_ptr, part_sum_ptr, row, num_chunks, CHUNKS: tl.constexpr):
    c = tl.arange(0, CHUNKS)
    valid = c < num_chunks
    pm = tl.load(part_max_ptr + row * num_chunks + c, mask=valid, other=float("-inf"))
    ps = tl.load(part_sum_ptr + row * num_chunks + c, mask=valid, other=0.0)
    m = tl.max(pm, 0)
    return m + tl.log(tl.sum(tl.where(valid, ps * tl.exp(pm - m), 0.0), 0))


@triton.jit
def _token_logprob_kernel(
    logits_ptr, row_stride, ids_ptr, num_ids, out_ptr, part_max_ptr, part_sum_ptr, num_chunks,
    CHUNKS: tl.constexpr, IDS: tl.constexpr,
):
    row = tl.program_id(0)
    lse = _combine_lse(part_max_ptr, part_sum_ptr, row, num_chunks, CHUNKS)
    k = tl.arange(0, IDS)
    valid = k < num_ids
    ids = tl.load(ids_ptr + row * num_ids + k, mask=valid, other=0)
    x = tl.load(logits_ptr + row.to(tl.int64) * row_stride + ids, mask=valid).to(tl.float32)
    tl.store(out_ptr + row * num_ids + k, x - lse, mask=valid)


@triton.jit
def _lse_rank_kernel(
    part_max_ptr, part_sum_ptr, part_cnt_ptr, lse_ptr, rank_ptr, num_chunks, CHUNKS: tl.constexpr
):
    row = tl.program_id(0)
    tl.store(lse_ptr + row, _combine_lse(part_max_ptr, part_sum_ptr, row, num_chunks, CHUNKS))
    c = tl.arange(0, CHUNKS)
    cnt = tl.load(part_cnt_ptr + row * num_chunks + c, mask=c < num_chunks, other=0)
    tl.store(rank_ptr + row, tl.sum(cnt, 0).to(tl.int64) + 1)


def _partials(logits: torch.Tensor, chosen: torch.Tensor | None):
    rows, vocab = logits.shape
    block = vocab_block(vocab, 4096)
    chunks = triton.cdiv(vocab, block)
    dev = logits.device
    part_max = torch.empty(rows, chunks, dtype=torch.float32, device=dev)
    part_sum = torch.empty(rows, chunks, dtype=torch.float32, device=dev)
    part_cnt = torch.empty(rows, chunks, dtype=torch.int32, device=dev) if chosen is not None else part_max
    _lse_chunk_kernel[(rows, chunks)](
        logits, logits.stride(0), chosen if chosen is not None else part_max, part_max, part_sum, part_cnt,
        vocab, chunks, COUNT_ABOVE=chosen is not None, BLOCK=block, num_warps=8,
    )
    return part_max, part_sum, part_cnt, chunks


def compute_token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    check_logits(logits)
    rows = logits.shape[0]
    ids = token_ids.reshape(rows, -1).contiguous()
    out = torch.empty(ids.shape, dtype=torch.float32, device=logits.device)
    if out.numel() == 0:
        return out.reshape(token_ids.shape)
    part_max, part_sum, _, chunks = _partials(logits, None)
    _token_logprob_kernel[(rows,)](
        logits, logits.stride(0), ids, ids.shape[1], out, part_max, part_sum, chunks,
        CHUNKS=triton.next_power_of_2(chunks), IDS=triton.next_power_of_2(ids.shape[1]),
    )
    return out.reshape(token_ids.shape)


def compute_topk_logprobs(
    logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_logits(logits)
    rows = logits.shape[0]
    chosen = token_ids.to(torch.int64).contiguous()
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    ranks = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        part_max, part_sum, part_cnt, chunks = _partials(logits, chosen)
        _lse_rank_kernel[(rows,)](part_max, part_sum, part_cnt, lse, ranks, chunks, CHUNKS=triton.next_power_of_2(chunks))
    top_x, top_ids = logits.topk(num_logprobs, dim=1)
    ids = torch.cat([chosen.unsqueeze(1), top_ids], dim=1)
    vals = torch.cat([logits.gather(1, chosen.unsqueeze(1)), top_x], dim=1).to(torch.float32)
    return ids, vals - lse.unsqueeze(1), ranks
