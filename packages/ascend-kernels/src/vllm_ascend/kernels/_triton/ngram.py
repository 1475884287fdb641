"""Triton :func:`vllm_ascend.kernels.ngram_propose`: one program per request, scanning its context
backwards in tiles of candidate continuation indices.

For a tile of indices ``stop``, the match length ``m`` (tokens before ``stop`` equal to the
context's last ones, at most ``max_n``) is built one step back at a time: step ``j`` compares the
tile's tokens at ``stop - 1 - j`` with the context's token ``total - 1 - j`` (one scalar load).
Tiles run from the most recent one, so a tile replaces the best only with a strictly longer match
and, inside a tile, ties go to the largest ``stop``; the scan ends as soon as a match reaches
``max_n`` (a repetitive context stops after its last tile). Then the (up to) ``k`` following tokens
are copied out. Integer arguments are not specialised: one compiled variant per token dtype covers
every ``min_n``, ``max_n``, ``max_model_len`` and ``k <= 16``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.ngram import NO_LIMIT

BLOCK = 32 if IS_INTERPRETED else 1024  # candidate indices per tile (the interpreter: several tiles per row)
LIVE_TILES = 6  # int32 tiles live at once (stop, alive, m, pos, got, the reduction's select)
MIN_DRAFT_BLOCK = 16  # draft tile: every k up to 16 shares one compiled variant
WARPS = 4


@triton.jit(do_not_specialize=["cols", "min_n", "max_n", "k", "limit"])
def _ngram_kernel(
    tok_ptr,
    row_stride,
    len_ptr,
    draft_ptr,
    count_ptr,
    cols,
    min_n,
    max_n,
    k,
    limit,
    BLOCK: tl.constexpr,
    KB: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = tok_ptr + row.to(tl.int64) * row_stride
    total = tl.minimum(tl.maximum(tl.load(len_ptr + row).to(tl.int32), 0), cols)
    lane = tl.arange(0, BLOCK)
    best_n = tl.zeros([], tl.int32)  # 0: no match yet
    best_stop = tl.zeros([], tl.int32)
    tile = tl.where(total < limit, (total + BLOCK - 1) // BLOCK, 0)
    while (tile > 0) & (best_n < max_n):
        tile -= 1
        stop = tile * BLOCK + lane
        alive = (stop >= 1) & (stop < total)
        m = tl.zeros([BLOCK], tl.int32)
        for j in range(0, max_n):
            pos = stop - 1 - j
            alive = alive & (pos >= 0)
            want = tl.load(row_ptr + tl.maximum(total - 1 - j, 0))
            got = tl.load(row_ptr + pos, mask=alive, other=0)
            alive = alive & (got == want)
            m += alive.to(tl.int32)
        m = tl.where(m >= min_n, m, 0)
        tile_n = tl.max(m, 0)
        tile_stop = tl.max(tl.where((m == tile_n) & (m > 0), stop, 0), 0)
        better = tile_n > best_n
        best_stop = tl.where(better, tile_stop, best_stop)
        best_n = tl.where(better, tile_n, best_n)
    count = tl.minimum(tl.minimum(total - best_stop, limit - total), k)
    count = tl.where(best_n > 0, count, 0)
    offs = tl.arange(0, KB)
    drafts = tl.load(row_ptr + best_stop + offs, mask=offs < count, other=-1)
    tl.store(draft_ptr + row.to(tl.int64) * k + offs, drafts.to(tl.int64), mask=offs < k)
    tl.store(count_ptr + row, count)


def ngram_propose(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = token_ids.shape
    drafts = torch.empty((rows, k), dtype=torch.int64, device=token_ids.device)
    counts = torch.empty(rows, dtype=torch.int32, device=token_ids.device)
    if rows == 0:
        return drafts, counts
    if token_ids.stride(1) != 1:
        token_ids = token_ids.contiguous()
    _ngram_kernel[(rows,)](
        token_ids,
        token_ids.stride(0),
        num_tokens,
        drafts,
        counts,
        cols,
        min_n,
        max_n,
        k,
        NO_LIMIT if max_model_len is None else max_model_len,
        BLOCK=ub_cap(token_ids.device, BLOCK, LIVE_TILES),
        KB=max(MIN_DRAFT_BLOCK, triton.next_power_of_2(k)),
        **launch(token_ids.device, WARPS),
    )
    return drafts, counts
