"""Byte copies between device addresses: the block copies of mamba-style state.

Hybrid models (Gated DeltaNet, Mamba) keep one recurrent state per sequence in cache blocks. With prefix
caching (vLLM's ``mamba_cache_mode="align"``) a sequence's running state moves to a new block as it crosses
a block boundary, so the block it leaves keeps the state of an aligned prefix for later requests to reuse.
vLLM describes those moves as addresses and byte counts (``vllm/v1/worker/mamba_utils.py``);
:func:`batch_memcpy` performs a batch of them in one launch. The Model Runner V2 forms of the same copies
(which read the addresses from vLLM's state metadata) are in ``vllm_ascend.kernels.v2.mamba_utils``.
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch
from vllm_ascend.kernels.v2._launch import tensor_at


def copy_bytes_torch(src: int, dst: int, nbytes: int, device: torch.device) -> None:
    """Copy ``nbytes`` bytes from address ``src`` to ``dst`` (host memory; overlapping ranges as memmove)."""
    if nbytes <= 0 or src == dst:
        return
    data = tensor_at(src, torch.uint8, nbytes, device).clone()
    tensor_at(dst, torch.uint8, nbytes, device).copy_(data)


def batch_memcpy_torch(src_ptrs: torch.Tensor, dst_ptrs: torch.Tensor, sizes: torch.Tensor) -> None:
    """Reference of :func:`batch_memcpy` (host addresses: the reference device)."""
    for src, dst, size in zip(src_ptrs.tolist(), dst_ptrs.tolist(), sizes.tolist(), strict=True):
        copy_bytes_torch(int(src), int(dst), int(size), src_ptrs.device)


def batch_memcpy(src_ptrs: torch.Tensor, dst_ptrs: torch.Tensor, sizes: torch.Tensor) -> None:
    """For each ``i``, copy ``sizes[i]`` bytes from address ``src_ptrs[i]`` to ``dst_ptrs[i]``, in order of
    the copies; a copy whose destination starts below its source inside it (a shift left) is safe.

    ``src_ptrs``, ``dst_ptrs``: ``[N]`` int64 / uint64 device addresses on the device that owns the memory;
    ``sizes``: ``[N]`` int32 / int64 byte counts. Copies of distinct entries must not overlap. Returns ``None``.
    """
    if not src_ptrs.shape == dst_ptrs.shape == sizes.shape or src_ptrs.dim() != 1:
        raise ValueError(
            f"batch_memcpy: src_ptrs {tuple(src_ptrs.shape)}, dst_ptrs {tuple(dst_ptrs.shape)} and sizes "
            f"{tuple(sizes.shape)} must be one [N] shape"
        )
    if src_ptrs.numel() == 0:
        return
    dispatch("state_copy", "batch_memcpy", batch_memcpy_torch, src_ptrs.device)(src_ptrs, dst_ptrs, sizes)
