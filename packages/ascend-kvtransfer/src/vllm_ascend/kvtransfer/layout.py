"""Where each KV block lives in memory, and which byte ranges move between two instances.

A layer's cache tensor (any layout vLLM and the attention backend agreed on: K/V split or fused, MLA's
latent cache, int8 caches with their own dtype) is described from its shape and strides as *regions*:
one per index of the dimensions outside the block dimension (e.g. K and V), each a run of equally
spaced blocks. Inside a block, a grid of tokens x heads of contiguous cells (token- or head-major) allows moving
a slice of the heads (prefill and decode with different tensor parallel sizes) or between different in-block
orders (prefill and decode on different model runners); MLA's latent cache is the same on every rank
(``replicated``) and moves whole.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import msgspec
import torch


class Region(msgspec.Struct, frozen=True):
    """One run of blocks: block ``i`` is the ``block_len`` bytes at ``base + i * block_stride``.

    Inside a block, ``rows`` tokens x ``heads`` KV heads of ``cell_bytes`` each, token ``r``'s head ``h`` at
    ``r * row_stride + h * head_stride`` (token-major or head-major); ``heads == 0``: the block has no such
    structure (MLA's latent cache) and moves only whole.
    """

    base: int
    block_stride: int
    block_len: int
    rows: int = 0
    row_stride: int = 0
    heads: int = 0
    head_stride: int = 0
    cell_bytes: int = 0

    @property
    def geometry(self) -> tuple[int, int, int, int, int, int]:
        return (self.block_len, self.rows, self.row_stride, self.heads, self.head_stride, self.cell_bytes)


class LayerLayout(msgspec.Struct, frozen=True):
    """A layer's regions; ``replicated``: every tensor-parallel rank holds the same bytes (MLA)."""

    name: str
    regions: list[Region]
    replicated: bool


class LayoutError(ValueError):
    """A cache layout or a peer's layout that the connector cannot move blocks between."""


def describe_cache(
    name: str,
    cache: torch.Tensor,
    num_blocks: int,
    *,
    block_size: int,
    num_heads: int,
    replicated: bool,
) -> LayerLayout:
    """The regions of one layer's cache tensor, whose block dimension has ``num_blocks`` entries."""
    shape, strides = list(cache.shape), list(cache.stride())
    candidates = [d for d, size in enumerate(shape) if size == num_blocks]
    if not candidates:
        raise LayoutError(
            f"KV cache of layer {name!r} has shape {tuple(shape)}: no dimension of {num_blocks} blocks"
        )
    block_dim = max(candidates, key=lambda d: strides[d])
    outer = [d for d in range(len(shape)) if d != block_dim and strides[d] > strides[block_dim]]
    inner = [d for d in range(len(shape)) if d != block_dim and d not in outer and shape[d] > 1]
    element = cache.element_size()
    inner_sorted = sorted(inner, key=lambda d: strides[d])
    expected = 1
    for d in inner_sorted:
        if strides[d] != expected:
            raise LayoutError(
                f"KV cache of layer {name!r} (shape {tuple(shape)}, strides {tuple(strides)}): a block's "
                "elements are not contiguous, so blocks cannot be moved as byte ranges"
            )
        expected *= shape[d]
    block_len = expected * element
    within = [d for d in range(len(shape)) if d != block_dim and d not in outer]  # size-1 dimensions too
    cells = (0, 0, 0, 0, 0) if replicated else _cells(shape, strides, within, block_size, num_heads)
    rows, row_stride, heads, head_stride, cell = cells
    row_stride, head_stride, cell = row_stride * element, head_stride * element, cell * element
    base = cache.data_ptr()
    regions = []
    for index in itertools.product(*(range(shape[d]) for d in outer)):
        offset = sum(i * strides[d] for i, d in zip(index, outer, strict=True)) * element
        regions.append(
            Region(
                base + offset,
                strides[block_dim] * element,
                block_len,
                rows,
                row_stride,
                heads,
                head_stride,
                cell,
            )
        )
    return LayerLayout(name, regions, replicated)


def _cells(
    shape: list[int], strides: list[int], inner: list[int], block_size: int, num_heads: int
) -> tuple[int, int, int, int, int]:
    """(rows, row stride, heads, head stride, cell elements) of a block, in elements; zeros when the block is not
    a grid of ``block_size`` tokens x ``num_heads`` heads of contiguous cells. Dimensions of size 1 count (one
    head per rank); where both sizes are equal, vLLM's logical order ``[..., heads, tokens, head_dim]`` decides."""
    rows = [d for d in inner if shape[d] == block_size]
    if not rows or num_heads < 1:
        return (0, 0, 0, 0, 0)
    row_dim = rows[-1] if len(rows) > 1 else rows[0]
    heads = [d for d in inner if d != row_dim and shape[d] == num_heads]
    if not heads:
        return (0, 0, 0, 0, 0)
    head_dim = heads[0]
    rest = [d for d in inner if d not in (row_dim, head_dim) and shape[d] > 1]
    cell = 1
    for d in sorted(rest, key=lambda d: strides[d]):
        if strides[d] != cell:
            return (0, 0, 0, 0, 0)
        cell *= shape[d]
    head_stride = strides[head_dim] if num_heads > 1 else cell
    if min(strides[row_dim], head_stride) < cell:
        return (0, 0, 0, 0, 0)
    return (block_size, strides[row_dim], num_heads, head_stride, cell)


@dataclass(frozen=True)
class RankView:
    """One instance's side of a copy: a rank's layouts and its position in tensor parallelism."""

    layers: list[LayerLayout]
    tp_rank: int
    tp_size: int


def source_ranks(local_rank: int, local_tp: int, remote_tp: int, replicated: bool) -> list[int]:
    """The remote ranks whose heads make up ``local_rank``'s heads (one for replicated caches)."""
    if remote_tp >= local_tp:
        ratio = remote_tp // local_tp
        ranks = list(range(local_rank * ratio, (local_rank + 1) * ratio))
        return ranks[:1] if replicated else ranks
    return [local_rank * remote_tp // local_tp]


def notified_ranks(local_rank: int, local_tp: int, remote_tp: int) -> list[int]:
    """The remote ranks ``local_rank`` tells when its part of a request's transfer ended: every remote rank
    is told by exactly the local ranks covering its heads, so each remote rank hears from
    ``max(1, local_tp // remote_tp)`` of them."""
    return source_ranks(local_rank, local_tp, remote_tp, replicated=False)


def check_tp(local_tp: int, remote_tp: int) -> None:
    """Different tensor parallel sizes are served when one divides the other."""
    if max(local_tp, remote_tp) % min(local_tp, remote_tp):
        raise LayoutError(
            f"prefill and decode tensor parallel sizes must divide one another, got {local_tp} and {remote_tp}"
        )


def plan_copies(
    here: RankView, there: RankView, here_blocks: list[int], there_blocks: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """Byte ranges (here addresses, there addresses, lengths) that carry blocks ``there_blocks`` of ``there``
    to/from blocks ``here_blocks`` of ``here``, layer by layer; adjacent ranges are merged."""
    if len(here_blocks) != len(there_blocks):
        raise LayoutError(f"{len(here_blocks)} local blocks cannot take {len(there_blocks)} remote blocks")
    if [layer.name for layer in here.layers] != [layer.name for layer in there.layers]:
        raise LayoutError("prefill and decode hold different attention layers (not the same model?)")
    ranges: list[tuple[int, int, int]] = []
    for mine, theirs in zip(here.layers, there.layers, strict=True):
        if len(mine.regions) != len(theirs.regions):
            raise LayoutError(
                f"layer {mine.name!r}: {len(mine.regions)} local regions, {len(theirs.regions)} remote"
            )
        for a, b in zip(mine.regions, theirs.regions, strict=True):
            ranges.extend(_region_ranges(mine, a, b, here, there, here_blocks, there_blocks))
    return _merged(ranges)


def _region_ranges(
    layer: LayerLayout,
    a: Region,
    b: Region,
    here: RankView,
    there: RankView,
    here_blocks: list[int],
    there_blocks: list[int],
) -> list[tuple[int, int, int]]:
    pairs = list(zip(here_blocks, there_blocks, strict=True))
    same_heads = layer.replicated or here.tp_size == there.tp_size
    if same_heads and (a.geometry == b.geometry or not (a.heads and b.heads)):
        if a.geometry != b.geometry:
            raise LayoutError(
                f"layer {layer.name!r}: local blocks of {a.block_len} bytes, remote blocks of {b.block_len} (or laid "
                "out differently): different dtype, block size, heads or attention backend?"
            )
        return [(a.base + i * a.block_stride, b.base + j * b.block_stride, a.block_len) for i, j in pairs]
    # cell by cell: a slice of the heads (different TP sizes) or a different in-block order (another runner)
    if not (a.heads and b.heads) or a.cell_bytes != b.cell_bytes or a.rows != b.rows:
        if same_heads:
            raise LayoutError(
                f"layer {layer.name!r}: local blocks of {a.block_len} bytes, remote blocks of {b.block_len} (or laid "
                "out differently): different dtype, block size, heads or attention backend?"
            )
        raise LayoutError(
            f"layer {layer.name!r}: different tensor parallel sizes need blocks that are grids of tokens x heads "
            "with equal cells on both sides"
        )
    # the model's KV heads; a side with more ranks than heads holds one replicated head per rank (vLLM)
    total = min(a.heads * here.tp_size, b.heads * there.tp_size)
    h_here = _first_head(layer, here.tp_rank, a.heads, here.tp_size, total)
    h_there = _first_head(layer, there.tp_rank, b.heads, there.tp_size, total)
    lo, hi = max(h_here, h_there), min(h_here + a.heads, h_there + b.heads)
    if lo >= hi:
        return []
    cells = (
        [(r, h) for r in range(a.rows) for h in range(lo, hi)]
        if a.row_stride >= a.head_stride
        else [(r, h) for h in range(lo, hi) for r in range(a.rows)]
    )
    return [
        (
            a.base + i * a.block_stride + r * a.row_stride + (h - h_here) * a.head_stride,
            b.base + j * b.block_stride + r * b.row_stride + (h - h_there) * b.head_stride,
            a.cell_bytes,
        )
        for i, j in pairs
        for r, h in cells
    ]


def _first_head(layer: LayerLayout, rank: int, heads: int, tp_size: int, total: int) -> int:
    """The model's index of the first KV head ``rank`` holds."""
    if heads * tp_size == total:
        return rank * heads
    if heads == 1:  # more ranks than KV heads: each rank holds a copy of one head
        return rank * total // tp_size
    raise LayoutError(
        f"layer {layer.name!r}: {heads} KV heads on each of {tp_size} ranks on one side, {total} KV heads in "
        "all on the other (not the same model?)"
    )


def _merged(ranges: list[tuple[int, int, int]]) -> tuple[list[int], list[int], list[int]]:
    here: list[int] = []
    there: list[int] = []
    lengths: list[int] = []
    for h, t, n in ranges:
        if lengths and here[-1] + lengths[-1] == h and there[-1] + lengths[-1] == t:
            lengths[-1] += n
        else:
            here.append(h)
            there.append(t)
            lengths.append(n)
    return here, there, lengths
