"""Core's KV block layouts: the key / value views each gives over a layer's cache, and the errors."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.core.device.adaptor.kv_layout import (
    CPU_KERNEL,
    TOKEN_MAJOR,
    are_cpu_kernel_views,
    block_compact,
    held_views,
    kv_cache_views,
)


def _cache(blocks=3, heads=2, block_size=4, head=8):
    """vLLM's per-layer ``[blocks, Hkv, block_size, 2D]`` over token-major memory, every element distinct."""
    memory = torch.arange(blocks * block_size * heads * 2 * head, dtype=torch.float32)
    return memory.view(blocks, block_size, heads, 2 * head).transpose(1, 2), memory


def test_token_major_views_split_each_token_row() -> None:
    cache, _ = _cache()
    key, value = kv_cache_views(cache, 8, TOKEN_MAJOR)
    assert key.shape == value.shape == (3, 4, 2, 8)
    assert torch.equal(key[1, 2, 1], cache[1, 1, 2, :8]) and torch.equal(value[1, 2, 1], cache[1, 1, 2, 8:])


def test_cpu_kernel_views_read_each_head_keys_transposed_then_values() -> None:
    cache, memory = _cache()
    key, value = kv_cache_views(cache, 8, CPU_KERNEL)
    block, head_span = 2 * 4 * 2 * 8, 2 * 4 * 8
    b, t, h, d = 2, 3, 1, 5
    assert float(key[b, t, h, d]) == memory[b * block + h * head_span + d * 4 + t]
    assert float(value[b, t, h, d]) == memory[b * block + h * head_span + 4 * 8 + t * 8 + d]
    everything = torch.cat([key.flatten(), value.flatten()]).sort().values
    assert torch.equal(everything, memory)  # each element of the cache is one key or one value
    key[0, 0, 0, 0] = -1.0
    assert memory[0] == -1.0  # views, not copies


def test_unknown_layouts_and_caches_it_cannot_hold_are_refused() -> None:
    cache, _ = _cache()
    with pytest.raises(ValueError, match="'nz' is unknown; allowed: token_major, cpu_kernel"):
        kv_cache_views(cache, 8, "nz")
    with pytest.raises(ValueError, match="D == Dv"):
        kv_cache_views(cache, 6, CPU_KERNEL)  # keys of 6, values of 10
    strided = torch.zeros(3, 2, 8, 16)[:, :, :4]  # blocks padded past block_size: not one run
    assert not block_compact(tuple(strided.shape), tuple(strided.stride()))
    with pytest.raises(ValueError, match="one run of memory"):
        kv_cache_views(strided, 8, CPU_KERNEL)


def test_only_the_cpu_kernel_views_of_one_cache_are_recognised() -> None:
    cache, _ = _cache()
    key, value = kv_cache_views(cache, 8, CPU_KERNEL)
    assert are_cpu_kernel_views(key, value)
    other_value = kv_cache_views(_cache()[0], 8, CPU_KERNEL)[1]
    assert not are_cpu_kernel_views(key, other_value)  # two caches
    assert not are_cpu_kernel_views(value, key)  # swapped
    assert not are_cpu_kernel_views(*kv_cache_views(cache, 8, TOKEN_MAJOR))
    assert not are_cpu_kernel_views(key.contiguous(), value.contiguous())  # copies
    assert not are_cpu_kernel_views(key[:, :, :1], value[:, :, :1])  # one head of a two-head cache
    assert not are_cpu_kernel_views(key.flatten(), value.flatten())


def test_held_views_are_made_once_per_key_and_again_after_the_memory_moves() -> None:
    cache, _ = _cache()
    made = []

    def make(key):
        made.append(key)
        return kv_cache_views(cache, key, TOKEN_MAJOR)

    first = held_views(cache, "_test_views", 8, lambda: make(8))
    assert held_views(cache, "_test_views", 8, lambda: make(8)) is first
    assert made == [8]
    other = held_views(cache, "_test_views", 6, lambda: make(6))
    assert made == [8, 6] and other[0].shape[-1] == 6
    cache.set_(torch.zeros(cache.numel()).untyped_storage(), 0, cache.shape, cache.stride())
    moved = held_views(cache, "_test_views", 6, lambda: make(6))
    assert made == [8, 6, 6] and moved[0].data_ptr() == cache.data_ptr()
    assert not moved[0].any()
