"""Triton :func:`vllm_ascend.kernels.batch_memcpy` and the byte copy the state-copy kernels share.

A copy moves 4-byte words when its source, destination and length are all multiples of 4 (every state
block of a float32 / 16-bit cache with an even inner size), else bytes. Copies run in ``TILE``-element
steps from low to high addresses, each step loading its tile before storing it (a barrier between them
where the destination starts inside the source: a shift left within one block), so overlapping left shifts
are safe. The copies are taken grid-stride (a program per vector core on Ascend, per copy on CUDA).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap

#: Elements one step of a copy moves (a power of two; bounded by the UB on Ascend).
TILE = 16 if IS_INTERPRETED else 4096


def copy_tile(device: torch.device) -> int:
    """The step of :func:`copy_bytes` on ``device``: :data:`TILE`, lowered to fit the UB (two tiles live)."""
    return ub_cap(device, TILE, live_tiles=2)


@triton.jit
def _copy_units(src, dst, units, part, parts, overlap, TILE: tl.constexpr):
    """Elements ``[lo, hi)`` of part ``part`` of ``parts`` (``TILE``-aligned shares) from ``src`` to ``dst``."""
    share = tl.cdiv(tl.cdiv(units, parts), TILE) * TILE
    lo = part * share
    hi = tl.minimum(lo + share, units)
    for start in range(lo, hi, TILE):
        offs = start + tl.arange(0, TILE)
        inside = offs < hi
        data = tl.load(src + offs, mask=inside)
        if overlap:
            tl.debug_barrier()
        tl.store(dst + offs, data, mask=inside)


@triton.jit
def copy_bytes(src_addr, dst_addr, nbytes, part, parts, TILE: tl.constexpr):
    """Part ``part`` of ``parts`` of the copy of ``nbytes`` bytes from address ``src_addr`` to ``dst_addr``
    (int64 scalars): 4-byte words where all three are multiples of 4, else bytes."""
    overlap = (dst_addr < src_addr) & (dst_addr + nbytes > src_addr)
    if ((src_addr | dst_addr | nbytes) & 3) == 0:
        _copy_units(
            src_addr.to(tl.pointer_type(tl.int32)),
            dst_addr.to(tl.pointer_type(tl.int32)),
            nbytes // 4,
            part,
            parts,
            overlap,
            TILE,
        )
    else:
        _copy_units(
            src_addr.to(tl.pointer_type(tl.uint8)),
            dst_addr.to(tl.pointer_type(tl.uint8)),
            nbytes,
            part,
            parts,
            overlap,
            TILE,
        )


@triton.jit
def _batch_memcpy_kernel(src_ptrs, dst_ptrs, sizes, num_copies, TILE: tl.constexpr):
    for i in range(tl.program_id(0), num_copies, tl.num_programs(0)):
        src = tl.load(src_ptrs + i).to(tl.int64)
        dst = tl.load(dst_ptrs + i).to(tl.int64)
        size = tl.load(sizes + i).to(tl.int64)
        copy_bytes(src, dst, size, 0, 1, TILE)


def batch_memcpy(src_ptrs: torch.Tensor, dst_ptrs: torch.Tensor, sizes: torch.Tensor) -> None:
    device = src_ptrs.device
    num_copies = src_ptrs.shape[0]
    _batch_memcpy_kernel[(_geometry.programs(device, num_copies),)](
        src_ptrs, dst_ptrs, sizes, num_copies, TILE=copy_tile(device)
    )
