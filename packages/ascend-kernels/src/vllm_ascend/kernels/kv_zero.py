"""Zeroing whole KV-cache blocks (on preemption / block reuse)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_ascend.kernels._backend import dispatch


def block_dims_for(kv_caches: Sequence[torch.Tensor], block_dim: int | Sequence[int]) -> list[int]:
    """One validated block dimension per cache tensor."""
    dims = [block_dim] * len(kv_caches) if isinstance(block_dim, int) else list(block_dim)
    if len(dims) != len(kv_caches):
        raise ValueError(f"block_dim has {len(dims)} entries for {len(kv_caches)} KV cache tensors")
    out = []
    for t, d in zip(kv_caches, dims, strict=True):
        if not -t.dim() <= d < t.dim():
            raise ValueError(f"block_dim {d} is out of range for a KV cache of shape {tuple(t.shape)}")
        out.append(d % t.dim())
    return out


def zero_kv_blocks_torch(
    kv_caches: Sequence[torch.Tensor], block_ids: torch.Tensor, block_dim: int | Sequence[int] = 0
) -> None:
    """Reference of :func:`zero_kv_blocks` (one ``index_fill_`` per tensor)."""
    ids = block_ids.to(device=kv_caches[0].device, dtype=torch.int64) if len(kv_caches) else block_ids
    for t, d in zip(kv_caches, block_dims_for(kv_caches, block_dim), strict=True):
        t.index_fill_(d, ids, 0)


def zero_kv_blocks(
    kv_caches: Sequence[torch.Tensor], block_ids: torch.Tensor, block_dim: int | Sequence[int] = 0
) -> None:
    """Zero blocks ``block_ids`` of every tensor in ``kv_caches``, in place, in one kernel launch.

    ``kv_caches``: tensors of any dtype on one device (e.g. per layer ``[2, num_blocks, block_size,
    heads, head_dim]`` with ``block_dim=1``, or separate K/V ``[num_blocks, ...]`` with ``block_dim=0``).
    The dimensions after ``block_dim`` must be contiguous (each block of a tensor is then
    ``prod(shape[:block_dim])`` contiguous segments); ``block_dim`` is one int or one per tensor.
    ``block_ids``: ``[N]`` int32/int64 block indices (duplicates allowed). Returns ``None``.
    The Triton path builds a segment table (one row per segment kind: offset from a common base,
    block stride, length) once per set of tensors and zeroes ``N x segments`` in a single launch.
    """
    if not kv_caches or block_ids.numel() == 0:
        return
    dispatch("kv_zero", "zero_kv_blocks", zero_kv_blocks_torch, kv_caches[0].device)(
        kv_caches, block_ids, block_dim
    )
