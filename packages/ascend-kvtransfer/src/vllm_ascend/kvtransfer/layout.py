"""Where each KV block lives in memory, and which byte ranges move between two instances.

A layer's cache tensor (any layout vLLM and the attention backend agreed on: K/V split or fused, MLA's
latent cache, int8 caches with their own dtype) is described from its shape and strides as *regions*:
one per index of the dimensions outside the block dimension (e.g. K and V), each a run of equally
spaced blocks. Inside a block, a token-major ``[rows, heads, head_bytes]`` layout allows moving a slice of
the heads (prefill and decode with different tensor parallel sizes); MLA's latent cache is the same on
every rank (``replicated``) and moves whole.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import msgspec
import torch


class Region(msgspec.Struct, frozen=True):
    """One run of blocks: block ``i`` is the ``block_len`` bytes at ``base + i * block_stride``.

    ``rows``/``row_stride``/``heads``/``head_bytes`` describe a token-major block (``heads == 0``: the
    block cannot be cut by heads, only moved whole).
    """

    base: int
    block_stride: int
    block_len: int
    rows: int = 0
    row_stride: int = 0
    heads: int = 0
    head_bytes: int = 0


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
    rows = row_stride = heads = head_bytes = 0
    if not replicated and num_heads == 1 and len(inner_sorted) >= 2 and shape[inner_sorted[-1]] == block_size:
        # one head per rank: its dimension (of size 1) has no stride to tell; each row is that head
        rows, row_stride = block_size, strides[inner_sorted[-1]] * element
        heads, head_bytes = 1, row_stride
    elif not replicated and len(inner_sorted) >= 2:
        # token-major: [..., rows(block_size), heads, head_dim] with the head dimension just inside the row;
        # as many heads as rows: vLLM's logical order [..., block_size, num_heads, head_size] tells which is which
        row_dim, head_dim = inner_sorted[-1], inner_sorted[-2]
        tied = block_size == num_heads and row_dim > head_dim
        if shape[row_dim] == block_size and shape[head_dim] == num_heads and not tied:
            rows, row_stride = block_size, strides[row_dim] * element
            heads, head_bytes = num_heads, strides[head_dim] * element
    base = cache.data_ptr()
    regions = []
    for index in itertools.product(*(range(shape[d]) for d in outer)):
        offset = sum(i * strides[d] for i, d in zip(index, outer, strict=True)) * element
        regions.append(
            Region(
                base + offset, strides[block_dim] * element, block_len, rows, row_stride, heads, head_bytes
            )
        )
    return LayerLayout(name, regions, replicated)


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
    whole = layer.replicated or here.tp_size == there.tp_size
    if whole:
        if a.block_len != b.block_len:
            raise LayoutError(
                f"layer {layer.name!r}: local blocks of {a.block_len} bytes, remote blocks of {b.block_len} "
                "(different dtype, block size or heads?)"
            )
        return [
            (a.base + i * a.block_stride, b.base + j * b.block_stride, a.block_len)
            for i, j in zip(here_blocks, there_blocks, strict=True)
        ]
    if not (a.heads and b.heads) or a.head_bytes != b.head_bytes or a.rows != b.rows:
        raise LayoutError(
            f"layer {layer.name!r}: different tensor parallel sizes need token-major blocks with equal head "
            "sizes on both sides"
        )
    # the model's KV heads; a side with more ranks than heads holds one replicated head per rank (vLLM)
    total = min(a.heads * here.tp_size, b.heads * there.tp_size)
    here_first = _first_head(layer, here.tp_rank, a.heads, here.tp_size, total)
    there_first = _first_head(layer, there.tp_rank, b.heads, there.tp_size, total)
    lo, hi = max(here_first, there_first), min(here_first + a.heads, there_first + b.heads)
    if lo >= hi:
        return []
    here_off = (lo - here_first) * a.head_bytes
    there_off = (lo - there_first) * b.head_bytes
    length = (hi - lo) * a.head_bytes
    out = []
    for i, j in zip(here_blocks, there_blocks, strict=True):
        for row in range(a.rows):
            out.append(
                (
                    a.base + i * a.block_stride + row * a.row_stride + here_off,
                    b.base + j * b.block_stride + row * b.row_stride + there_off,
                    length,
                )
            )
    return out


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
