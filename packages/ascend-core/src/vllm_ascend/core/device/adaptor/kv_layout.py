"""How a device lays out one block of a layer's paged KV cache, and the key / value views the attention ops take.

vLLM allocates a layer's cache as ``[blocks, Hkv, block_size, D + Dv]`` (each block one run of memory); what a
block's bytes mean is the device's (``BaseDeviceAdaptor.kv_block_layout``). Either way the ops receive
``[blocks, block_size, Hkv, D|Dv]`` key / value views, so code indexing tokens reads the same tokens, and whole
blocks stay the unit that moves between caches (prefix caching, swaps, KV transfer, offload).

- ``token_major``: each token's keys then values, token after token (the NPU's BSND paging);
- ``cpu_kernel``: per KV head, the block's keys transposed (``[D, block_size]``), then its values
  (``[block_size, D]``): the layout vLLM's CPU attention kernels read (``D == Dv``, blocks one run of memory).

The views are pure tensor code (no adaptor lookup), so they trace under ``torch.compile``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch

TOKEN_MAJOR = "token_major"
CPU_KERNEL = "cpu_kernel"
KV_BLOCK_LAYOUTS: tuple[str, ...] = (TOKEN_MAJOR, CPU_KERNEL)


def block_compact(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether each block (the first axis) of a cache with this shape and stride is one run of memory."""
    if stride[0] != math.prod(shape[1:]):
        return False
    expected = 1
    for step, size in sorted(zip(stride[1:], shape[1:], strict=True)):
        if step != expected:
            return False
        expected *= size
    return True


def kv_cache_views(kv_cache: torch.Tensor, head_size: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Key / value views ``[blocks, block_size, Hkv, D|Dv]`` of a layer's cache ``[blocks, Hkv, block_size,
    D + Dv]`` whose blocks are laid out as ``layout``."""
    if layout == TOKEN_MAJOR:
        token_major = kv_cache.transpose(1, 2)
        return token_major[..., :head_size], token_major[..., head_size:]
    if layout != CPU_KERNEL:
        raise ValueError(f"kv block layout {layout!r} is unknown; allowed: {', '.join(KV_BLOCK_LAYOUTS)}")
    blocks, num_kv_heads, block_size, width = kv_cache.shape
    if width != 2 * head_size or not block_compact(tuple(kv_cache.shape), tuple(kv_cache.stride())):
        raise ValueError(
            f"kv block layout {CPU_KERNEL!r} needs blocks of one run of memory and D == Dv; got a cache of shape "
            f"{tuple(kv_cache.shape)}, stride {tuple(kv_cache.stride())}, head_size={head_size}"
        )
    # as_strided from the cache's own offset (a storage offset read does not trace): keys at the block's start,
    # values from the second half of each head's run, reached through a view that starts there.
    block, head, half = kv_cache.stride(0), 2 * block_size * head_size, block_size * head_size
    key_stride, value_stride = _cpu_kernel_strides(block_size, num_kv_heads, head_size)
    shape = (blocks, block_size, num_kv_heads, head_size)
    key = kv_cache.as_strided(shape, key_stride)
    values = kv_cache.as_strided((blocks, num_kv_heads, 2, half), (block, head, half, 1)).select(2, 1)
    return key, values.as_strided(shape, value_stride)


def _cpu_kernel_strides(
    block_size: int, num_kv_heads: int, head_size: int
) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """The strides of the ``cpu_kernel`` key and value views (``[blocks, block_size, Hkv, D]``)."""
    head = 2 * block_size * head_size
    block = num_kv_heads * head
    return (block, 1, head, block_size), (block, head_size, head, 1)


def are_cpu_kernel_views(key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether ``key_cache`` / ``value_cache`` are the ``cpu_kernel`` views (:func:`kv_cache_views`) of one
    cache: the same storage, the strides that layout gives, and the values half a head's run after the keys."""
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        return False
    _, block_size, num_kv_heads, head_size = key_cache.shape
    key_stride, value_stride = _cpu_kernel_strides(block_size, num_kv_heads, head_size)
    return (
        key_cache.stride() == key_stride
        and value_cache.stride() == value_stride
        and value_cache.storage_offset() == key_cache.storage_offset() + block_size * head_size
        and key_cache.untyped_storage().data_ptr() == value_cache.untyped_storage().data_ptr()
    )


_T = TypeVar("_T")


def held_views(tensor: torch.Tensor, name: str, key: Any, make: Callable[[], _T]) -> _T:
    """``make()``'s views of ``tensor``, made once and kept on the tensor itself (attribute ``name``): they live
    as long as it does, and are made again for another ``key`` or when its memory moved (``set_``).

    For the views a layer derives from its cache at every step (vLLM hands it the same tensor each time)."""
    held = tensor.__dict__.get(name)
    stamp = (key, tensor.data_ptr())
    if held is None or held[0] != stamp:
        held = (stamp, make())
        setattr(tensor, name, held)
    return held[1]
