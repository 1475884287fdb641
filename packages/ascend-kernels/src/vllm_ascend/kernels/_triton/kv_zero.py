"""Triton :func:`vllm_ascend.kernels.zero_kv_blocks`: one launch over (block id, segment kind).

A segment kind is one contiguous run of bytes per block in one tensor (e.g. the K half and the V
half of a ``[2, num_blocks, ...]`` layer). Its row in the segment table holds its start offset
from a common base address, the byte stride between consecutive blocks and its length, all in
units of the widest word (8/4/2/1 bytes) that divides every address (the base's too), stride and length. Tables
are cached per set of tensors (same pointers, shapes, strides and dtypes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import launch
from vllm_ascend.kernels.kv_zero import block_dims_for

_UNITS = {8: tl.int64, 4: tl.int32, 2: tl.int16, 1: tl.int8}
_MAX_CACHED_TABLES = 16
_tables: dict[tuple, tuple[torch.Tensor, int, int]] = {}


def _segments(t: torch.Tensor, dim: int) -> list[tuple[int, int, int]]:
    """``(start address, block stride, length)`` in bytes for each segment of one block of ``t``."""
    es = t.element_size()
    expected = 1
    for size, stride in zip(reversed(t.shape[dim + 1 :]), reversed(t.stride()[dim + 1 :]), strict=True):
        if size > 1 and stride != expected:
            raise ValueError(
                f"zero_kv_blocks: dims after block_dim {dim} must be contiguous; shape {tuple(t.shape)} "
                f"stride {t.stride()}"
            )
        expected *= size
    outer = [0]
    for size, stride in zip(t.shape[:dim], t.stride()[:dim], strict=True):
        outer = [o + i * stride for o in outer for i in range(size)]
    return [(t.data_ptr() + o * es, t.stride(dim) * es, expected * es) for o in outer]


def _table(kv_caches: Sequence[torch.Tensor], dims: list[int]) -> tuple[torch.Tensor, int, int]:
    key = tuple(
        (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, d) for t, d in zip(kv_caches, dims, strict=True)
    )
    cached = _tables.get(key)
    if cached is not None:
        return cached
    base = kv_caches[0].data_ptr()
    segs = [s for t, d in zip(kv_caches, dims, strict=True) for s in _segments(t, d)]
    unit = next(u for u in _UNITS if all(a % u == 0 and b % u == 0 and n % u == 0 for a, b, n in segs))
    rows = [((a - base) // unit, b // unit, n // unit) for a, b, n in segs]
    table = torch.tensor(rows, dtype=torch.int64, device=kv_caches[0].device)
    if len(_tables) >= _MAX_CACHED_TABLES:
        _tables.clear()
    _tables[key] = (table, unit, max(n for _, _, n in rows))
    return _tables[key]


@triton.jit
def _zero_blocks_kernel(base_ptr, table_ptr, ids_ptr, UNIT: tl.constexpr, BLOCK: tl.constexpr):
    block = tl.load(ids_ptr + tl.program_id(0)).to(tl.int64)
    seg = tl.program_id(1)
    start = tl.load(table_ptr + seg * 3) + block * tl.load(table_ptr + seg * 3 + 1)
    length = tl.load(table_ptr + seg * 3 + 2)
    ptr = base_ptr.to(tl.pointer_type(UNIT), bitcast=True) + start
    zeros = tl.zeros([BLOCK], UNIT)
    for off in range(tl.program_id(2) * BLOCK, length, tl.num_programs(2) * BLOCK):
        offs = off + tl.arange(0, BLOCK)
        tl.store(ptr + offs, zeros, mask=offs < length)


def zero_kv_blocks(
    kv_caches: Sequence[torch.Tensor], block_ids: torch.Tensor, block_dim: int | Sequence[int] = 0
) -> None:
    dims = block_dims_for(kv_caches, block_dim)
    device = kv_caches[0].device
    if any(t.device != device for t in kv_caches):
        raise ValueError("zero_kv_blocks: all KV cache tensors must be on one device")
    table, unit, longest = _table(kv_caches, dims)
    block = min(4096, triton.next_power_of_2(longest))
    splits = max(1, min(8, triton.cdiv(longest, block * 4)))
    ids = block_ids.to(device)
    _zero_blocks_kernel[(ids.numel(), table.shape[0], splits)](
        kv_caches[0], table, ids, UNIT=_UNITS[unit], BLOCK=block, **launch(device, 4)
    )
