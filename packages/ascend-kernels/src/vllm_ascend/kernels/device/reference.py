"""The reference adaptor: every device op in plain PyTorch, following the torch_npu op's documented semantics.

It is the executable specification the NPU adaptors are checked against and what
``VLLM_ASCEND_DEVICE=reference`` runs. Ops are device-agnostic torch code computed in fp32.
``fused_infer_attention`` attends all decode requests (and prefills of similar shape) in one padded,
masked SDPA call; a request's result then equals its one-request result up to fp32 rounding. In
batch-invariant mode (``VLLM_ASCEND_BATCH_INVARIANT=1``) every request is attended alone, so its
result is bitwise independent of the rest of the batch.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup
from torch.distributed.distributed_c10d import ProcessGroupGloo
from torch.utils.weak import WeakIdKeyDictionary

from vllm_ascend.core.sdk import (
    CPU_KERNEL,
    GROUP_LIST_TYPES,
    SCORING_FUNCS,
    WEIGHT_FORMATS,
    BaseDeviceAdaptor,
    DeviceOpError,
    GroupListType,
    TaggedMemoryPool,
    check_choice,
    check_clipped_swiglu,
    check_group_bias,
    check_moe_gating,
    check_mrope,
    check_packed_attention,
    check_window_sinks,
    envs,
    seq_blocks,
)
from vllm_ascend.kernels.device import host_attention
from vllm_ascend.kernels.device.graph import ReferenceGraph
from vllm_ascend.kernels.device.mc2_reference import mc2_combine, mc2_dispatch
from vllm_ascend.kernels.device.mla import MLAReferenceOps
from vllm_ascend.kernels.device.sparse import SparseAttentionReferenceOps

__all__ = [
    "ReferenceDeviceAdaptor",
    "cached_int8_weight",
    "gather_paged_kv",
    "group_bounds",
    "grouped_top_k",
    "int8_weight",
    "pack_int4",
    "quant_matmul_int32",
    "unpack_int4",
]

INT8_MAX = 127.0
#: Largest K for which an int8 x int8 dot product of K terms is exact in an int32 accumulator.
MAX_EXACT_INT32_K = 2**31 // (128 * 128)


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise DeviceOpError(message)


def check_group_backend(backend: str, served: str) -> None:
    """A stateless group is built for the device's collective backend only."""
    if backend != served:
        raise DeviceOpError(
            f"stateless process group backend={backend!r} is not served here; allowed: {served!r}"
        )


def stateless_group(
    prefix_store: Any, group_rank: int, group_size: int, impl: Any, backend_type: str, device: str
) -> ProcessGroup:
    """A ``ProcessGroup`` outside torch's global state whose collectives on ``device`` run on ``impl`` (a torch
    backend object built over the same store, rank and size); ``backend_type``: a ``ProcessGroup.BackendType``."""
    group = ProcessGroup(prefix_store, group_rank, group_size)
    kind = getattr(ProcessGroup.BackendType, backend_type)
    group._set_default_backend(kind)
    impl._set_sequence_number_for_group()
    group._register_backend(torch.device(device), kind, impl)
    return group


def group_bounds(group_list: torch.Tensor, group_list_type: str, num_rows: int) -> list[tuple[int, int]]:
    """``[(start, end)]`` row ranges per group from counts or running ends; checks they fit in ``num_rows``."""
    check_choice("group_list_type", group_list_type, GROUP_LIST_TYPES)
    _require(group_list.dim() == 1, f"group_list must be 1-D, got shape {tuple(group_list.shape)}")
    values = [int(v) for v in group_list.tolist()]
    ends = list(itertools.accumulate(values)) if group_list_type == "count" else values
    bounds, start = [], 0
    for g, end in enumerate(ends):
        _require(
            end >= start,
            f"group_list ({group_list_type}) must be non-negative/non-decreasing; group {g} ends at {end} < {start}",
        )
        bounds.append((start, end))
        start = end
    _require(start <= num_rows, f"group_list covers {start} rows but x has only {num_rows}")
    return bounds


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack int4 values (int8 ``[..., N]`` in ``[-8, 7]``, ``N % 8 == 0``) into int32 ``[..., N/8]``.

    Element ``j`` of each run of 8 goes to bits ``4j..4j+3`` as a two's complement nibble (the int32
    carrier torch_npu's int4 matmuls read). :func:`unpack_int4` inverts it exactly.
    """
    if q.dtype != torch.int8:
        raise DeviceOpError(f"pack_int4 needs int8 values in [-8, 7], got dtype {q.dtype}")
    if q.dim() == 0 or q.shape[-1] % 8:
        raise DeviceOpError(
            f"pack_int4 needs a last dim divisible by 8, got shape {tuple(q.shape)} (int4 [..., N] -> int32 [..., N/8])"
        )
    if q.numel():
        low, high = (int(v) for v in torch.aminmax(q))
        if low < -8 or high > 7:
            raise DeviceOpError(f"pack_int4 needs values in [-8, 7], got values in [{low}, {high}]")
    nibbles = q.to(torch.int32).reshape(*q.shape[:-1], q.shape[-1] // 8, 8)
    # Low 7 nibbles as unsigned 4-bit fields; the top one signed (q * 2**28): the sum is the int32's
    # two's complement value and never leaves int32's range.
    shifts = torch.arange(0, 28, 4, dtype=torch.int32, device=q.device)
    low_bits = torch.bitwise_left_shift(nibbles[..., :7] & 0xF, shifts).sum(dim=-1, dtype=torch.int32)
    return low_bits + nibbles[..., 7] * (1 << 28)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., N/8]`` from :func:`pack_int4` → int8 ``[..., N]`` in ``[-8, 7]``."""
    if packed.dtype != torch.int32:
        raise DeviceOpError(f"unpack_int4 needs int32 packed int4 [..., N/8], got dtype {packed.dtype}")
    if packed.dim() == 0:
        raise DeviceOpError("unpack_int4 needs at least one dim ([..., N/8]), got a scalar")
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nibbles = torch.bitwise_right_shift(packed.unsqueeze(-1), shifts) & 0xF
    signed = nibbles - ((nibbles >= 8).to(torch.int32) << 4)
    return signed.to(torch.int8).reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def int8_weight(weight: torch.Tensor, name: str, shape: str) -> torch.Tensor:
    """An int8 weight, or int4 packed in int32 unpacked to int8; ``shape`` names the int8 layout."""
    if weight.dtype == torch.int8:
        return weight
    if weight.dtype == torch.int32:
        return unpack_int4(weight)
    packed = shape[:-1] + "/8]"
    raise DeviceOpError(
        f"{name} must be int8 {shape} or int4 packed in int32 {packed}, got dtype {weight.dtype}"
    )


#: Each int4-packed weight the reference ops have unpacked -> (its version counter then, the int8 unpack).
#: Keyed weakly by tensor identity: an entry goes when its weight does.
_UNPACKED_INT4: WeakIdKeyDictionary = WeakIdKeyDictionary()


def cached_int8_weight(weight: torch.Tensor, name: str, shape: str) -> torch.Tensor:
    """:func:`int8_weight`, keeping the int8 unpack of an int4-packed weight for the next call with it.

    The plain-PyTorch ops cannot compute on packed int4, so without this every call re-unpacks the same
    weights. An in-place write to the weight (or a view of it) bumps its version counter and the next call
    unpacks again; writes through ``.data`` bypass that counter (as they bypass autograd) and are not seen.
    The unpack is host memory of this spec, not a model parameter: an NPU reads the packed int4 directly.
    """
    if weight.dtype != torch.int32 or weight.is_inference():  # inference tensors have no version counter
        return int8_weight(weight, name, shape)
    version = weight._version
    cached = _UNPACKED_INT4.get(weight)
    if cached is not None and cached[0] == version:
        return cached[1]
    unpacked = unpack_int4(weight)
    _UNPACKED_INT4[weight] = (version, unpacked)
    return unpacked


def _check_int32_exact(k_dim: int) -> None:
    _require(
        k_dim <= MAX_EXACT_INT32_K,
        f"K={k_dim} is too large for an exact int32 accumulator of int8 products (max {MAX_EXACT_INT32_K})",
    )


def quant_matmul_int32(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    pertoken_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    output_dtype: torch.dtype,
) -> torch.Tensor:
    """``quant_matmul`` in device-agnostic torch: int32 accumulation, then the documented dequantisation."""
    _require(x.dtype == torch.int8, f"x must be int8 [..., K], got dtype {x.dtype}")
    weight = int8_weight(weight, "weight", "[K, N]")
    _require(
        weight.dim() == 2 and x.dim() >= 1 and x.shape[-1] == weight.shape[0],
        f"x [..., K] and weight [K, N] disagree: {tuple(x.shape)} vs {tuple(weight.shape)}",
    )
    k_dim, n_dim = weight.shape
    _check_int32_exact(k_dim)
    _require(
        weight_scale.is_floating_point() and weight_scale.numel() in (1, n_dim),
        f"weight_scale must be float [{n_dim}] (or one element), got {weight_scale.dtype} "
        f"{tuple(weight_scale.shape)}",
    )
    _require(output_dtype.is_floating_point, f"output_dtype must be a float dtype, got {output_dtype}")
    x2 = x.reshape(-1, k_dim)
    acc = x2.to(torch.int32) @ weight.to(torch.int32)
    float_bias = None
    if bias is not None:
        _require(
            bias.numel() == n_dim and (bias.dtype == torch.int32 or bias.is_floating_point()),
            f"bias must be int32 or float [{n_dim}], got {bias.dtype} {tuple(bias.shape)}",
        )
        if bias.dtype == torch.int32:
            acc = acc + bias.reshape(-1)  # into the int32 accumulator, before scaling
        else:
            float_bias = bias.double().reshape(-1)
    out = acc.double() * weight_scale.double().reshape(-1)
    if pertoken_scale is not None:
        _require(
            pertoken_scale.numel() == x2.shape[0] and pertoken_scale.is_floating_point(),
            f"pertoken_scale must be float [M] = [{x2.shape[0]}], got {pertoken_scale.dtype} "
            f"{tuple(pertoken_scale.shape)}",
        )
        out = out * pertoken_scale.double().reshape(-1, 1)
    if float_bias is not None:
        out = out + float_bias
    return out.to(output_dtype).reshape(*x.shape[:-1], n_dim)


def _per_token_int8(xf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = xf.abs().amax(dim=-1) / INT8_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(xf / safe.unsqueeze(-1)).clamp_(-128, 127).to(torch.int8)
    return q, scale


def _silu_mul(xf: torch.Tensor) -> torch.Tensor:
    d = xf.shape[-1] // 2
    return F.silu(xf[..., :d]).mul_(xf[..., d:])


def clipped_swiglu_torch(
    x: torch.Tensor, *, alpha: float, limit: float, bias: float, interleaved: bool
) -> torch.Tensor:
    """``clipped_swiglu``'s semantics in plain PyTorch (fp32 math), on arguments already checked."""
    xf = x.float()
    if interleaved:
        gate, up = xf[..., 0::2], xf[..., 1::2]
    else:
        gate, up = xf.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return ((up + bias) * (gate * torch.sigmoid(gate * alpha))).to(x.dtype)


def _check_paged_cache(name: str, cache: torch.Tensor, num_kv_heads: int | None = None) -> None:
    if cache.dim() != 4:
        raise DeviceOpError(
            f"{name} must be [num_blocks, block_size, num_kv_heads, head_size], got shape {tuple(cache.shape)}"
        )
    if num_kv_heads is not None:
        if cache.shape[2] != num_kv_heads:
            raise DeviceOpError(f"{name} has {cache.shape[2]} KV heads, expected {num_kv_heads}")


def _blocks_for(block_table: torch.Tensor, b: int, seq_len: int, block_size: int) -> torch.Tensor:
    return block_table[b, : seq_blocks(block_table, b, seq_len, block_size)].long()


def _padded_query_rows(
    reqs: list[int], starts: list[int], q_lens: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The query rows of requests ``reqs`` padded to the longest: ``q_lens [B]``, ``keep [B, Q]`` (real rows),
    ``jq [B, Q]`` (row within the request; padding repeats the last) and ``q_idx [B, Q]`` (row in ``query``)."""
    q_lens_t = torch.tensor([q_lens[b] for b in reqs], device=device)
    j = torch.arange(max(q_lens[b] for b in reqs), device=device)
    keep = j < q_lens_t.unsqueeze(1)
    jq = torch.minimum(j, q_lens_t.unsqueeze(1) - 1)
    q_idx = torch.tensor([starts[b] for b in reqs], device=device).unsqueeze(1) + jq
    return q_lens_t, keep, jq, q_idx


def rope_rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, is_neox: bool
) -> torch.Tensor:
    """Rotate the first ``rot_dim = 2 * cos.shape[-1]`` dims of every head of ``x [T, H*D]`` by per-token
    angles ``cos``/``sin [T, rot_dim/2]`` (fp32): neox halves or GPT-J interleaved pairs; in ``x``'s dtype."""
    half = cos.shape[-1]
    rot_dim = 2 * half
    if x.shape[-1] % head_size != 0:
        raise DeviceOpError(f"tensor of shape {tuple(x.shape)} is not a multiple of head_size={head_size}")
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    # (first, second) halves of the rotated dims: neox halves, GPT-J interleaved pairs
    first, second = (
        (slice(0, half), slice(half, rot_dim)) if is_neox else (slice(0, rot_dim, 2), slice(1, rot_dim, 2))
    )
    heads = x.reshape(x.shape[0], -1, head_size).float()
    x1, x2 = heads[..., first], heads[..., second]
    # functional (no out= views), so a compiler can trace it: x1*cos - x2*sin, x2*cos + x1*sin
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotated = torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), dim=-1).flatten(-2)
    if rot_dim < head_size:
        rotated = torch.cat((rotated, heads[..., rot_dim:]), dim=-1)
    return rotated.reshape(x.shape).to(x.dtype)


def mrope_cos_sin(
    positions: torch.Tensor, cos_sin_cache: torch.Tensor, mrope_section: list[int], interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``cos``, ``sin [T, rot_dim/2]`` (fp32) of :meth:`BaseDeviceAdaptor.mrope`: each frequency's
    angle at its T/H/W position (``[T]`` positions: the same position for every frequency)."""
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    if positions.dim() == 1:
        return cos, sin
    half = cos.shape[-1]
    freq = torch.arange(half, device=cos.device)
    if interleaved:
        axis = torch.zeros(half, dtype=torch.long, device=cos.device)
        axis[(freq % 3 == 1) & (freq < 3 * mrope_section[1])] = 1
        axis[(freq % 3 == 2) & (freq < 3 * mrope_section[2])] = 2
    else:
        axis = torch.repeat_interleave(
            torch.arange(3, device=cos.device), torch.tensor(mrope_section, device=cos.device)
        )
    # cos/sin are [3, T, half]: frequency i reads row axis[i]
    pick = axis.view(1, 1, half).expand(1, cos.shape[1], half)
    return cos.gather(0, pick)[0], sin.gather(0, pick)[0]


def packed_attention_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bounds: list[int],
    scale: float,
    causal: bool,
    output: torch.Tensor | None,
) -> torch.Tensor:
    """:meth:`packed_attention` in plain torch: one fp32 SDPA call per run of equal-length sequences (a
    batch of same-size images or equal prompts is one call), written into ``output``."""
    num_tokens, num_heads = query.shape[:2]
    if output is None:
        output = query.new_zeros(num_tokens, num_heads, value.shape[2])
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    gqa = num_heads != key.shape[1]
    start, i = 0, 0
    while i < len(lengths):
        j = i
        while j < len(lengths) and lengths[j] == lengths[i]:
            j += 1
        length, count = lengths[i], j - i
        stop = start + length * count
        if length:
            q, k, v = (
                t[start:stop].float().view(count, length, t.shape[1], t.shape[2]).transpose(1, 2)
                for t in (query, key, value)
            )
            out = F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal, enable_gqa=gqa)
            output[start:stop] = out.transpose(1, 2).reshape(stop - start, num_heads, -1).to(output.dtype)
        start, i = stop, j
    return output


def _token_rows(cache: torch.Tensor) -> torch.Tensor | None:
    """``cache [blocks, block_size, *rest]`` viewed as ``[blocks * block_size, *rest]`` (one axis of token
    slots), or ``None`` where blocks and their tokens are not one run of memory."""
    if cache.stride(0) != cache.shape[1] * cache.stride(1):
        return None
    return cache.view(cache.shape[0] * cache.shape[1], *cache.shape[2:])


def _cache_rows(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``cache [blocks, block_size, H, D]`` at token slots ``slots`` (``block * block_size + offset``):
    ``[*slots.shape, H, D]``; one row gather where :func:`_token_rows` applies (2-3x faster than
    indexing by block and offset)."""
    flat = _token_rows(cache)
    if flat is not None:
        return flat.index_select(0, slots.reshape(-1)).view(*slots.shape, *cache.shape[2:])
    return cache[torch.div(slots, cache.shape[1], rounding_mode="floor"), slots % cache.shape[1]]


def _kv_rows(
    key_cache: torch.Tensor, value_cache: torch.Tensor, slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_cache_rows` of both caches. Where they interleave in one buffer (a token's keys and values
    in one run of memory, as in ``[blocks, block_size, H, 2, D]``), one gather of whole token rows serves
    both: a gather of strided rows costs 4x as much on the CPU."""
    joint = _joint_row(key_cache, value_cache)
    if joint is None:
        return _cache_rows(key_cache, slots), _cache_rows(value_cache, slots)
    start, span = joint
    tokens = key_cache.shape[0] * key_cache.shape[1]
    rows = key_cache.as_strided((tokens, span), (key_cache.stride(1), 1), start)
    rows = rows.index_select(0, slots.reshape(-1)).view(*slots.shape, span)
    shape = (*slots.shape, *key_cache.shape[2:])
    strides = (*rows.stride()[:-1], *key_cache.stride()[2:])
    return tuple(  # type: ignore[return-value]
        rows.as_strided(shape, strides, cache.storage_offset() - start) for cache in (key_cache, value_cache)
    )


def _joint_row(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int] | None:
    """``(first element, row length)`` of the one run of memory holding a token's keys and values, or
    ``None`` when the two caches do not share a buffer at one token stride."""
    if (
        key_cache.shape != value_cache.shape
        or key_cache.stride() != value_cache.stride()
        or key_cache.dtype != value_cache.dtype
        or _token_rows(key_cache) is None
        or min(key_cache.stride()) < 1
        or key_cache.untyped_storage().data_ptr() != value_cache.untyped_storage().data_ptr()
    ):
        return None
    extent = 1 + sum((n - 1) * s for n, s in zip(key_cache.shape[2:], key_cache.stride()[2:], strict=True))
    k0, v0 = key_cache.storage_offset(), value_cache.storage_offset()
    start, span = min(k0, v0), max(k0, v0) + extent - min(k0, v0)
    token = key_cache.stride(1)
    last = start + (key_cache.shape[0] * key_cache.shape[1] - 1) * token + span
    if span > token or last * key_cache.element_size() > key_cache.untyped_storage().nbytes():
        return None
    return start, span


def _attend_group(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    starts: list[int],
    q_lens: list[int],
    lens: list[int],
    reqs: list[int],
    scale: float,
    causal: bool,
    output: torch.Tensor,
) -> None:
    """Attention of requests ``reqs`` (each with ``q_len >= 1``) in one fp32 SDPA call, written into ``output``.

    The group is padded to its longest query and longest context. Keys/values are gathered token by
    token, reading only each request's first ``ceil(seq_len / block_size)`` block-table entries;
    padded key slots repeat the request's key 0 and are masked out, padded query rows repeat its last
    query row and are dropped. GQA: query head ``h`` reads KV head ``h // group`` (SDPA's grouping).
    """
    device = query.device
    num_heads, num_kv_heads = query.shape[1], key_cache.shape[2]
    block_size = key_cache.shape[1]
    gqa = num_heads != num_kv_heads
    max_q = max(q_lens[b] for b in reqs)
    if len(reqs) == 1:
        b = reqs[0]
        q_start, q_len, seq_len = starts[b], q_lens[b], lens[b]
        blocks = block_table[b, : -(-seq_len // block_size)].long()
        k = key_cache[blocks].flatten(0, 1)[:seq_len].unsqueeze(0)
        v = value_cache[blocks].flatten(0, 1)[:seq_len].unsqueeze(0)
        q = query[q_start : q_start + q_len].float().transpose(0, 1).unsqueeze(0)
        ctx = seq_len - q_len
        mask = None
        if causal and q_len > 1 and ctx > 0:
            rows = torch.arange(q_len, device=device).unsqueeze(1) + ctx
            mask = torch.arange(seq_len, device=device) <= rows
        out = F.scaled_dot_product_attention(
            q,
            k.float().transpose(1, 2),
            v.float().transpose(1, 2),
            attn_mask=mask,
            is_causal=causal and q_len > 1 and ctx == 0,
            scale=scale,
            enable_gqa=gqa,
        )
        output[q_start : q_start + q_len] = out[0].transpose(0, 1)
        return
    max_s = max(lens[b] for b in reqs)
    consecutive = reqs == list(range(reqs[0], reqs[0] + len(reqs)))
    lens_t = torch.tensor([lens[b] for b in reqs], device=device)
    pos = torch.arange(max_s, device=device)
    valid = pos < lens_t.unsqueeze(1)  # [B, S]
    rows = block_table[reqs[0] : reqs[0] + len(reqs)] if consecutive else block_table[reqs]
    # Key position p sits in block-table column p // block_size (the same column for every request: divided
    # once); past a request's length the column may hold anything, so those slots read its token 0.
    first_slots = rows[:, : -(-max_s // block_size)].long() * block_size
    slots = first_slots.index_select(1, torch.div(pos, block_size, rounding_mode="floor")) + pos % block_size
    slots = torch.where(valid, slots, first_slots[:, :1])
    k, v = (
        rows.float().transpose(1, 2) for rows in _kv_rows(key_cache, value_cache, slots)
    )  # [B, Hkv, S, D]
    if max_q == 1:
        q_rows = [starts[b] for b in reqs]
        contiguous = q_rows == list(range(q_rows[0], q_rows[0] + len(q_rows)))
        q_idx = None if contiguous else torch.tensor(q_rows, device=device)
        q = query[q_rows[0] : q_rows[0] + len(q_rows)] if q_idx is None else query[q_idx]
        out = F.scaled_dot_product_attention(
            q.float().unsqueeze(2),
            k,
            v,
            attn_mask=valid[:, None, None, :],  # decode: query 0 sees keys 0..seq_len-1, causal or not
            scale=scale,
            enable_gqa=gqa,
        ).squeeze(2)
        if q_idx is None:
            output[q_rows[0] : q_rows[0] + len(q_rows)] = out
        else:
            output[q_idx] = out.to(output.dtype)
        return
    q_lens_t, keep, jq, q_idx = _padded_query_rows(reqs, starts, q_lens, device)
    if causal:
        last = (lens_t - q_lens_t).unsqueeze(1) + jq  # query j sees keys 0..ctx+j (all < seq_len)
        mask = pos <= last.unsqueeze(2)  # [B, Q, S]
    else:
        mask = valid.unsqueeze(1)
    out = F.scaled_dot_product_attention(
        query[q_idx].float().transpose(1, 2),  # [B, Hq, Q, D]
        k,
        v,
        attn_mask=mask.unsqueeze(1),
        scale=scale,
        enable_gqa=gqa,
    ).transpose(1, 2)  # [B, Q, Hq, Dv]
    output[q_idx[keep]] = out[keep].to(output.dtype)


def _attend_group_window_sinks(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    starts: list[int],
    q_lens: list[int],
    lens: list[int],
    reqs: list[int],
    scale: float,
    causal: bool,
    window: int | None,
    sinks: torch.Tensor | None,
    output: torch.Tensor,
) -> None:
    """Attention of requests ``reqs`` with a sliding window and/or sinks, written from the equations in fp32.

    Request ``b`` reads only keys ``lo_b..seq_len-1`` with ``lo_b = max(0, ctx_b - W + 1)`` (the window of
    its first query; later queries' windows start later): blocks before it may be vLLM's null block and
    are never gathered, so nothing they hold (NaN included) reaches a product. Padded key slots repeat key
    ``lo_b`` and padded query rows repeat the last query; both are masked / dropped. The sink is one more
    softmax column with logit ``sinks[h]`` and no value.
    """
    device = query.device
    num_heads, num_kv_heads = query.shape[1], key_cache.shape[2]
    block_size = key_cache.shape[1]
    q_lens_t, keep, jq, q_idx = _padded_query_rows(reqs, starts, q_lens, device)
    lens_t = torch.tensor([lens[b] for b in reqs], device=device)
    ctx_t = lens_t - q_lens_t
    lo_t = (ctx_t - window + 1).clamp_min(0) if window is not None else torch.zeros_like(ctx_t)
    max_s = int((lens_t - lo_t).max())
    pos = lo_t.unsqueeze(1) + torch.arange(max_s, device=device)  # [B, S] absolute key positions
    valid = pos < lens_t.unsqueeze(1)
    tok = torch.where(valid, pos, lo_t.unsqueeze(1))
    blk = block_table[reqs].long().gather(1, torch.div(tok, block_size, rounding_mode="floor"))
    group = num_heads // num_kv_heads
    k = key_cache[blk, tok % block_size].float().repeat_interleave(group, dim=2)  # [B, S, Hq, D]
    v = value_cache[blk, tok % block_size].float().repeat_interleave(group, dim=2)
    max_q = jq.shape[1]
    q_pos = ctx_t.unsqueeze(1) + jq  # [B, Q] absolute query positions
    mask = valid.unsqueeze(1).expand(-1, max_q, -1)  # [B, Q, S]
    if causal:
        mask = mask & (pos.unsqueeze(1) <= q_pos.unsqueeze(2))
    if window is not None:
        mask = mask & (pos.unsqueeze(1) > q_pos.unsqueeze(2) - window)
    scores = torch.einsum("bqhd,bshd->bhqs", query[q_idx].float(), k) * scale
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    if sinks is not None:
        sink_col = sinks.float().view(1, num_heads, 1, 1).expand(len(reqs), -1, max_q, 1)
        probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhqs,bshd->bqhd", probs, v)  # [B, Q, Hq, Dv]
    output[q_idx[keep]] = out[keep].to(output.dtype)


def grouped_top_k(
    router_logits: torch.Tensor,
    k: int,
    renormalize: bool,
    scoring: str,
    bias: torch.Tensor | None,
    num_groups: int,
    topk_groups: int,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``moe_gating_top_k``'s semantics in plain PyTorch, on arguments already checked."""
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)
    select = scores if bias is None else scores + bias.float()
    if num_groups > 1:
        grouped = select.view(select.shape[0], num_groups, -1)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1) if bias is not None else grouped.amax(-1)
        top_groups = group_scores.topk(topk_groups, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top_groups, True)
        select = select.masked_fill(~keep.repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
    ids = select.topk(k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-20)
    return weights * routed_scaling_factor, ids.to(torch.int32)


def gather_paged_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``kv_load`` in device-agnostic torch: each request's first ``seq_lens[b]`` cached tokens, packed."""
    _check_paged_cache("key_cache", key_cache)
    _check_paged_cache("value_cache", value_cache, key_cache.shape[2])
    block_size = key_cache.shape[1]
    keys, values = [], []
    for b, seq_len in enumerate(int(v) for v in seq_lens.tolist()):
        blocks = _blocks_for(block_table, b, seq_len, block_size)
        keys.append(key_cache[blocks].flatten(0, 1)[:seq_len])
        values.append(value_cache[blocks].flatten(0, 1)[:seq_len])
    if not keys:
        return key_cache.new_empty(0, *key_cache.shape[2:]), value_cache.new_empty(0, *value_cache.shape[2:])
    return torch.cat(keys), torch.cat(values)


class ReferenceEvent:
    """A completed-on-creation event: work on the cpu device is synchronous."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait(self, stream: Any = None) -> None:
        return None


class ReferenceStream:
    """A stream on the cpu device: every op has finished before the next is issued."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = torch.device("cpu")

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def record_event(self, event: ReferenceEvent | None = None) -> ReferenceEvent:
        event = event or ReferenceEvent()
        event.record()
        return event


@contextmanager
def _stream_context(stream: Any = None) -> Iterator[None]:
    yield


def _no_op(*args: Any, **kwargs: Any) -> None:
    return None


def _no_op_cache(*args: Any, **kwargs: Any) -> None:
    # Distinct from _no_op: Dynamo keys its handling of these calls on object identity.
    return None


def _no_op_host_cache(*args: Any, **kwargs: Any) -> None:
    return None


def _host_memory_info(device: Any = None) -> tuple[int, int]:
    """``torch.accelerator.get_memory_info`` of the reference device: (total - device memory in use, total) bytes
    of host memory, where the device memory in use is this process's resident set less the sleep-mode copies the
    pool keeps "on the host" (on an NPU those are host memory, not device memory). Per process, as a device's
    is per device: what other processes do does not move it (vLLM's sleep checks that sleeping freed memory)."""
    import psutil

    from vllm_ascend.kernels.device.memory_pool import host_memory_pool

    total = int(psutil.virtual_memory().total)
    in_use = int(psutil.Process().memory_info().rss) - host_memory_pool().offloaded_bytes()
    return total - in_use, total


class ReferenceDeviceAdaptor(MLAReferenceOps, SparseAttentionReferenceOps, BaseDeviceAdaptor):
    """Plain-PyTorch implementation of every op on torch's cpu device; host memory is device memory."""

    communicator_cls = "vllm_ascend.kernels.device.communicator.AscendDeviceCommunicator"
    family = "reference"
    replays_attention_params = True
    computes_on_host = True
    traceable_ops = frozenset({"rms_norm", "add_rms_norm", "swiglu", "rotary_embedding"})

    # -- runtime ---------------------------------------------------------------------------
    def torch_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")

    def set_device(self, device: torch.device) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def stream_api(self) -> dict[str, Any]:
        return {
            "Stream": ReferenceStream,
            "Event": ReferenceEvent,
            "current_stream": lambda device=None: ReferenceStream(),
            "stream": _stream_context,
            "set_stream": _no_op,
            "Tensor.record_stream": _no_op,  # host memory is not stream-ordered
        }

    def capture_graph(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], pool: Any = None
    ) -> ReferenceGraph:
        return ReferenceGraph(fn, args, kwargs)

    def graph_pool_handle(self) -> Any:
        """Host memory has no graph pool: a fresh token stands for one (captures keep their own tensors)."""
        return object()

    def memory_pool(self) -> TaggedMemoryPool:
        """Host mappings released with ``madvise`` (``memory_pool.py``)."""
        from vllm_ascend.kernels.device.memory_pool import host_memory_pool

        return host_memory_pool()

    def install_runtime_shims(self) -> None:
        """vLLM calls ``torch.accelerator.synchronize/empty_cache/get_memory_info`` directly; with no accelerator
        they raise."""
        if torch.accelerator.is_available():
            return
        torch.accelerator.synchronize = _no_op
        torch.accelerator.empty_cache = _no_op_cache
        torch.accelerator.get_memory_info = _host_memory_info  # Model Runner V2 measures its graphs with it
        if hasattr(torch.accelerator, "empty_host_cache"):
            torch.accelerator.empty_host_cache = _no_op_host_cache

    def device_name(self, device_id: int = 0) -> str:
        return "Ascend reference device (cpu)"

    def total_memory(self, device_id: int = 0) -> int:
        import psutil

        return int(psutil.virtual_memory().total)

    def memory_in_use(self, device: torch.types.Device | None = None) -> float:
        import psutil

        return float(psutil.Process(os.getpid()).memory_info().rss)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def pin_memory_available(self) -> bool:
        return False

    def stateless_process_group(self, backend, prefix_store, group_rank, group_size, timeout):
        """A gloo group over ``prefix_store`` (the host's collectives), registered for the cpu device."""
        check_group_backend(backend, "gloo")
        impl = ProcessGroupGloo(prefix_store, group_rank, group_size, timeout=timeout)
        return stateless_group(prefix_store, group_rank, group_size, impl, "GLOO", "cpu")

    # -- attention and KV cache ------------------------------------------------------------
    def kv_block_layout(self, dtype, shape, stride, head_size):
        """vLLM's CPU attention kernels' layout where they serve the cache
        (:mod:`~vllm_ascend.kernels.device.host_attention`), token-major otherwise; decided once per cache
        geometry, so a cache keeps its layout for the adaptor's life."""
        layouts = self.__dict__.setdefault("_kv_block_layouts", {})
        key = (dtype, shape, stride, head_size)
        if key not in layouts:
            served = len(shape) == 4 and host_attention.serves(dtype, shape, stride, head_size)
            layouts[key] = CPU_KERNEL if served else super().kv_block_layout(dtype, shape, stride, head_size)
        return layouts[key]

    def reshape_and_cache(self, key, value, key_cache, value_cache, slot_mapping):
        if not (key.dim() == 3 and value.dim() == 3):
            raise DeviceOpError(
                f"key/value must be [T, Hkv, D], got {tuple(key.shape)} and {tuple(value.shape)}"
            )
        _check_paged_cache("key_cache", key_cache, key.shape[1])
        _check_paged_cache("value_cache", value_cache, value.shape[1])
        if key.shape[2] != key_cache.shape[3]:
            raise DeviceOpError(f"key head size {key.shape[2]} != key_cache head size {key_cache.shape[3]}")
        if value.shape[2] != value_cache.shape[3]:
            raise DeviceOpError(
                f"value head size {value.shape[2]} != value_cache head size {value_cache.shape[3]}"
            )
        if slot_mapping.dim() != 1:
            raise DeviceOpError(f"slot_mapping must be 1-D, got shape {tuple(slot_mapping.shape)}")
        n = slot_mapping.shape[0]
        if not (n <= key.shape[0] and n <= value.shape[0]):
            raise DeviceOpError(
                f"slot_mapping has {n} slots but key/value have {key.shape[0]}/{value.shape[0]} tokens"
            )
        if n == 0:
            return
        num_blocks, block_size = key_cache.shape[:2]
        slots = slot_mapping.long()
        host_slots = slots.numpy()  # the bounds on the host: a third of torch's aminmax and two reads
        if n <= host_attention.FEW_SLOTS:
            listed = host_slots.tolist()
            low, top = min(listed), max(listed)
        else:
            low, top = int(host_slots.min()), int(host_slots.max())
        if n < key.shape[0] or n < value.shape[0]:
            key, value = key[:n], value[:n]
        if low < 0:  # padding slots: drop them (the common all-valid case needs no mask)
            keep = slots >= 0
            slots, key, value = slots[keep], key[keep], value[keep]
            if slots.numel() == 0:
                return
        if top >= num_blocks * block_size:
            raise DeviceOpError(
                f"slot {top} is out of range for a cache of {num_blocks} blocks x {block_size}"
            )
        kernel_caches = host_attention.kernel_views(key_cache, value_cache)
        if kernel_caches is not None:
            host_attention.write(key, value, *kernel_caches, slots)
            return
        for cache, rows in ((key_cache, key), (value_cache, value)):
            flat = _token_rows(cache)
            if flat is not None:
                flat.index_copy_(0, slots, rows.to(cache.dtype))
            else:
                cache[slots // block_size, slots % block_size] = rows.to(cache.dtype)

    def fused_infer_attention(
        self,
        query,
        key_cache,
        value_cache,
        block_table,
        query_start_loc,
        seq_lens,
        scale,
        *,
        causal=True,
        output=None,
        sliding_window=None,
        sinks=None,
        plan=None,
    ):
        if query.dim() != 3:
            raise DeviceOpError(f"query must be [T, Hq, D], got shape {tuple(query.shape)}")
        check_window_sinks(sliding_window, sinks, query.shape[1], causal)
        _check_paged_cache("key_cache", key_cache)
        _check_paged_cache("value_cache", value_cache, key_cache.shape[2])
        num_tokens, num_heads, head_size = query.shape
        num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
        if num_heads % num_kv_heads != 0:
            raise DeviceOpError(f"query heads ({num_heads}) must be a multiple of KV heads ({num_kv_heads})")
        if key_cache.shape[3] != head_size:
            raise DeviceOpError(f"query head size {head_size} != key_cache head size {key_cache.shape[3]}")
        plan = self.attention_plan_for(plan, block_table, query_start_loc, seq_lens, block_size, causal)
        if plan.num_tokens > num_tokens:
            raise DeviceOpError(f"query_start_loc ends at {plan.num_tokens} but query has {num_tokens} rows")
        head_size_v = value_cache.shape[3]
        if output is None:
            output = query.new_zeros(num_tokens, num_heads, head_size_v)
        else:
            if not (output.shape[0] >= num_tokens and tuple(output.shape[1:]) == (num_heads, head_size_v)):
                raise DeviceOpError(
                    f"output must be [>= {num_tokens}, {num_heads}, {head_size_v}], got {tuple(output.shape)}"
                )
        kernel_caches = (
            host_attention.kernel_views(key_cache, value_cache)
            if sliding_window is None and sinks is None and query.dtype == key_cache.dtype
            else None
        )
        batch_invariant = plan.state.get("batch_invariant")
        if batch_invariant is None:  # read once per step (the env read costs as much as a slice)
            batch_invariant = plan.state["batch_invariant"] = bool(envs.VLLM_ASCEND_BATCH_INVARIANT)
        if kernel_caches is not None and output.is_contiguous() and not batch_invariant:
            rows = output if output.shape[0] == num_tokens else output[:num_tokens]
            host_attention.attend(query, *kernel_caches, plan, scale, rows)
            return rows
        starts, lens, q_lens = list(plan.starts), list(plan.lens), list(plan.q_lens)
        decodes, prefills = list(plan.decodes), list(plan.prefills)
        if batch_invariant:
            # Every request alone: its result cannot depend on the other requests' lengths.
            groups = [[b] for b in sorted(decodes + prefills)]
        else:
            groups = [decodes] if decodes else []
            real = sum(q_lens[b] * lens[b] for b in prefills)
            padded = (
                len(prefills)
                * max((q_lens[b] for b in prefills), default=0)
                * max((lens[b] for b in prefills), default=0)
            )
            if len(prefills) > 1 and padded <= 2 * real:
                groups.append(prefills)
            else:
                groups.extend([b] for b in prefills)
        for reqs in groups:
            if sliding_window is None and sinks is None:
                _attend_group(
                    query,
                    key_cache,
                    value_cache,
                    block_table,
                    starts,
                    q_lens,
                    lens,
                    reqs,
                    scale,
                    causal,
                    output,
                )
            else:
                _attend_group_window_sinks(
                    query,
                    key_cache,
                    value_cache,
                    block_table,
                    starts,
                    q_lens,
                    lens,
                    reqs,
                    scale,
                    causal,
                    sliding_window,
                    sinks,
                    output,
                )
        return output[:num_tokens]

    def kv_load(self, key_cache, value_cache, block_table, seq_lens):
        return gather_paged_kv(key_cache, value_cache, block_table, seq_lens)

    def packed_attention(self, query, key, value, cu_seqlens, scale, *, causal=False, output=None):
        bounds = check_packed_attention(query, key, value, cu_seqlens, output)
        return packed_attention_sdpa(query, key, value, bounds, scale, causal, output)

    # -- norms, activations, rotary --------------------------------------------------------
    def rms_norm(self, x, weight, eps):
        if weight.shape[-1] != x.shape[-1]:
            raise DeviceOpError(f"weight has {weight.shape[-1]} elements, x's last dim is {x.shape[-1]}")
        # one fused fp32 op instead of six elementwise/reduction temporaries
        return torch.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)

    def add_rms_norm(self, x, residual, weight, eps):
        if x.shape != residual.shape:
            raise DeviceOpError(
                f"x {tuple(x.shape)} and residual {tuple(residual.shape)} must have the same shape"
            )
        total = x.float() + residual.float()
        if weight.shape[-1] != x.shape[-1]:
            raise DeviceOpError(f"weight has {weight.shape[-1]} elements, x's last dim is {x.shape[-1]}")
        normed = torch.rms_norm(total, (x.shape[-1],), weight.float(), eps)
        return normed.to(x.dtype), total.to(x.dtype)

    def swiglu(self, x):
        if x.shape[-1] % 2 != 0:
            raise DeviceOpError(f"swiglu needs an even last dim, got {x.shape[-1]}")
        return _silu_mul(x.float()).to(x.dtype)

    def clipped_swiglu(self, x, *, alpha=1.702, limit=7.0, bias=1.0, interleaved=True):
        check_clipped_swiglu(x, limit)
        return clipped_swiglu_torch(x, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved)

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        rot_dim = cos_sin_cache.shape[-1]
        if not (rot_dim % 2 == 0 and rot_dim <= head_size):
            raise DeviceOpError(f"cos_sin_cache rot_dim={rot_dim} must be even and <= head_size={head_size}")
        cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
        return (
            rope_rotate(query, cos, sin, head_size, is_neox),
            None if key is None else rope_rotate(key, cos, sin, head_size, is_neox),
        )

    def mrope(self, positions, query, key, head_size, cos_sin_cache, mrope_section, is_neox, interleaved):
        check_mrope(positions, cos_sin_cache, head_size, mrope_section)
        cos, sin = mrope_cos_sin(positions, cos_sin_cache, mrope_section, interleaved)
        return rope_rotate(query, cos, sin, head_size, is_neox), rope_rotate(
            key, cos, sin, head_size, is_neox
        )

    # -- MoE -------------------------------------------------------------------------------
    def moe_gating_top_k(
        self,
        router_logits,
        k,
        *,
        renormalize=True,
        scoring="softmax",
        bias=None,
        num_groups=1,
        topk_groups=1,
        routed_scaling_factor=1.0,
    ):
        check_choice("scoring", scoring, SCORING_FUNCS)
        check_moe_gating(router_logits, k, bias, num_groups, topk_groups)
        return grouped_top_k(
            router_logits, k, renormalize, scoring, bias, num_groups, topk_groups, routed_scaling_factor
        )

    def moe_init_routing(self, x, expert_ids, num_experts):
        _require(
            x.dim() == 2 and expert_ids.dim() == 2 and x.shape[0] == expert_ids.shape[0],
            f"x must be [T, H] and expert_ids [T, k]; got {tuple(x.shape)} and {tuple(expert_ids.shape)}",
        )
        flat = expert_ids.reshape(-1).long()
        if flat.numel():
            _require(
                int(flat.min()) >= 0 and int(flat.max()) < num_experts,
                f"expert ids must be within [0, num_experts={num_experts})",
            )
        k = expert_ids.shape[1]
        order = torch.argsort(flat, stable=True)
        expanded_row_idx = torch.empty_like(order)
        expanded_row_idx[order] = torch.arange(order.numel(), device=order.device)
        counts = torch.bincount(flat, minlength=num_experts)
        return x[order // k], expanded_row_idx.to(torch.int32), counts.to(torch.int64)

    def moe_finalize_routing(self, expert_output, expanded_row_idx, topk_weights):
        num_tokens, k = topk_weights.shape
        _require(
            expanded_row_idx.numel() == num_tokens * k,
            f"expanded_row_idx has {expanded_row_idx.numel()} entries, expected T*k = {num_tokens * k}",
        )
        rows = expert_output[expanded_row_idx.long()].float().view(num_tokens, k, -1)
        return (rows * topk_weights.float().unsqueeze(-1)).sum(dim=1).to(expert_output.dtype)

    def moe_distribute_dispatch(self, x, expert_ids, group, *, num_experts, global_bs, active_mask=None):
        return mc2_dispatch(
            x, expert_ids, group, num_experts=num_experts, global_bs=global_bs, active_mask=active_mask
        )

    def moe_distribute_combine(
        self,
        expert_output,
        dispatch,
        expert_ids,
        topk_weights,
        group,
        *,
        num_experts,
        global_bs,
        active_mask=None,
    ):
        return mc2_combine(
            expert_output,
            dispatch,
            expert_ids,
            topk_weights,
            group,
            num_experts=num_experts,
            global_bs=global_bs,
            active_mask=active_mask,
        )

    def grouped_matmul(self, x, weight, group_list, *, group_list_type: GroupListType = "count", bias=None):
        _require(
            weight.dim() == 3 and x.dim() == 2 and weight.shape[1] == x.shape[1],
            f"x must be [M, K] and weight [G, K, N]; got {tuple(x.shape)} and {tuple(weight.shape)}",
        )
        _require(
            group_list.numel() == weight.shape[0],
            f"group_list has {group_list.numel()} groups but weight has {weight.shape[0]}",
        )
        check_group_bias(bias, weight)
        out = x.new_zeros(x.shape[0], weight.shape[2])
        for g, (start, end) in enumerate(group_bounds(group_list, group_list_type, x.shape[0])):
            if end > start:
                acc = x[start:end].float() @ weight[g].float()
                if bias is not None:
                    acc = acc + bias[g].float()
                out[start:end] = acc.to(x.dtype)
        return out

    def grouped_matmul_swiglu_quant(
        self, x, weight, group_list, weight_scale, x_scale, *, group_list_type: GroupListType = "cumsum"
    ):
        _require(
            x.dtype == torch.int8 and x.dim() == 2, f"x must be int8 [M, K], got {x.dtype} {tuple(x.shape)}"
        )
        weight = cached_int8_weight(weight, "weight", "[G, K, 2N]")
        _require(
            weight.dim() == 3 and weight.shape[1] == x.shape[1] and weight.shape[2] % 2 == 0,
            f"weight must be [G, K, 2N] with K={x.shape[1]}, got {tuple(weight.shape)}",
        )
        _check_int32_exact(x.shape[1])
        _require(
            tuple(weight_scale.shape) == (weight.shape[0], weight.shape[2]),
            f"weight_scale must be [G, 2N] = {(weight.shape[0], weight.shape[2])}, got {tuple(weight_scale.shape)}",
        )
        _require(
            x_scale.shape == (x.shape[0],),
            f"x_scale must be [M] = ({x.shape[0]},), got {tuple(x_scale.shape)}",
        )
        _require(
            group_list.numel() == weight.shape[0],
            f"group_list has {group_list.numel()} groups but weight has {weight.shape[0]}",
        )
        rows, half = x.shape[0], weight.shape[2] // 2
        q_out = torch.zeros(rows, half, dtype=torch.int8, device=x.device)
        scale_out = torch.zeros(rows, dtype=torch.float32, device=x.device)
        for g, (start, end) in enumerate(group_bounds(group_list, group_list_type, rows)):
            if end == start:
                continue
            acc = x[start:end].to(torch.int32) @ weight[g].to(torch.int32)
            deq = acc.double() * x_scale[start:end].double().unsqueeze(1) * weight_scale[g].double()
            q_out[start:end], scale_out[start:end] = _per_token_int8(_silu_mul(deq.float()))
        return q_out, scale_out

    def grouped_quant_matmul(
        self,
        x,
        weight,
        group_list,
        weight_scale,
        x_scale,
        *,
        group_list_type: GroupListType = "count",
        output_dtype=torch.bfloat16,
    ):
        _require(
            x.dtype == torch.int8 and x.dim() == 2, f"x must be int8 [M, K], got {x.dtype} {tuple(x.shape)}"
        )
        weight = cached_int8_weight(weight, "weight", "[G, K, N]")
        _require(
            weight.dim() == 3 and weight.shape[1] == x.shape[1],
            f"weight must be [G, K, N] with K={x.shape[1]}, got {tuple(weight.shape)}",
        )
        _check_int32_exact(x.shape[1])
        num_groups, n_dim = weight.shape[0], weight.shape[2]
        _require(
            tuple(weight_scale.shape) == (num_groups, n_dim) and weight_scale.is_floating_point(),
            f"weight_scale must be float [G, N] = {(num_groups, n_dim)}, got {weight_scale.dtype} "
            f"{tuple(weight_scale.shape)}",
        )
        _require(
            x_scale.shape == (x.shape[0],) and x_scale.is_floating_point(),
            f"x_scale must be float [M] = ({x.shape[0]},), got {x_scale.dtype} {tuple(x_scale.shape)}",
        )
        _require(
            group_list.numel() == num_groups,
            f"group_list has {group_list.numel()} groups but weight has {num_groups}",
        )
        _require(
            output_dtype.is_floating_point,
            f"output_dtype must be a float dtype, got {output_dtype}",
        )
        out = torch.zeros(x.shape[0], n_dim, dtype=output_dtype, device=x.device)
        for g, (start, end) in enumerate(group_bounds(group_list, group_list_type, x.shape[0])):
            if end == start:
                continue
            acc = x[start:end].to(torch.int32) @ weight[g].to(torch.int32)
            deq = acc.double() * weight_scale[g].double() * x_scale[start:end].double().unsqueeze(1)
            out[start:end] = deq.to(output_dtype)
        return out

    # -- quantization ----------------------------------------------------------------------
    def dynamic_quant(self, x, *, smooth_scales=None):
        _require(x.dim() >= 2, f"dynamic_quant needs x with at least 2 dims, got shape {tuple(x.shape)}")
        xf = x.float()
        if smooth_scales is not None:
            _require(
                smooth_scales.shape == (x.shape[-1],),
                f"smooth_scales must be [{x.shape[-1]}], got {tuple(smooth_scales.shape)}",
            )
            xf = xf * smooth_scales.float()
        return _per_token_int8(xf)

    def quantize(self, x, scale, offset):
        _require(x.is_floating_point(), f"x must be a float tensor, got dtype {x.dtype}")
        _require(
            scale.numel() == 1 and scale.is_floating_point(),
            f"scale must be a one-element float tensor (per-tensor), got {scale.dtype} {tuple(scale.shape)}",
        )
        xq = torch.round(x.float() / scale.float().reshape(()))
        if offset is not None:
            _require(
                offset.numel() == 1, f"offset must be a one-element tensor, got shape {tuple(offset.shape)}"
            )
            value = float(offset.reshape(()))
            _require(
                value == round(value) and -128 <= value <= 127,
                f"offset must hold an integer in [-128, 127], got {value}",
            )
            xq = xq + value
        return xq.clamp_(-128, 127).to(torch.int8)

    def quant_matmul(
        self, x, weight, weight_scale, *, pertoken_scale=None, bias=None, output_dtype=torch.bfloat16
    ):
        weight = cached_int8_weight(weight, "weight", "[K, N]")
        return quant_matmul_int32(x, weight, weight_scale, pertoken_scale, bias, output_dtype)

    def weight_quant_matmul(
        self, x, weight, antiquant_scale, *, antiquant_offset=None, bias=None, group_size=0
    ):
        _require(x.is_floating_point(), f"x must be a float tensor [..., K], got dtype {x.dtype}")
        weight = cached_int8_weight(weight, "weight", "[K, N]")
        _require(
            weight.dim() == 2 and x.dim() >= 1 and x.shape[-1] == weight.shape[0],
            f"x [..., K] and weight [K, N] disagree: {tuple(x.shape)} vs {tuple(weight.shape)}",
        )
        _require(group_size >= 0, f"group_size must be >= 0 (0 = per channel), got {group_size}")
        k_dim, n_dim = weight.shape
        w = weight.float()

        def expand(param: torch.Tensor, name: str) -> torch.Tensor:
            p = param.float()
            if group_size > 0:
                groups = math.ceil(k_dim / group_size)
                _require(
                    p.shape == (groups, n_dim),
                    f"{name} must be [{groups}, {n_dim}] for group_size={group_size}, got {tuple(p.shape)}",
                )
                return p.repeat_interleave(group_size, dim=0)[:k_dim]
            _require(
                p.numel() in (1, n_dim),
                f"{name} must be per-tensor or [{n_dim}], got {tuple(p.shape)}",
            )
            return p.reshape(-1)

        if antiquant_offset is not None:
            w = w + expand(antiquant_offset, "antiquant_offset")
        w = w * expand(antiquant_scale, "antiquant_scale")
        out = x.float() @ w
        if bias is not None:
            _require(bias.numel() == n_dim, f"bias must be [{n_dim}], got shape {tuple(bias.shape)}")
            out = out + bias.float().reshape(-1)
        return out.to(x.dtype)

    def cast_weight_format(self, weight, fmt):
        """Host memory has one layout: the weight is returned as is (NZ changes storage, not values)."""
        check_choice("fmt", fmt, WEIGHT_FORMATS)
        return weight

    # -- fused ops: the unfused sequence itself, so fusing never changes a result -----------------
    def add_rms_norm_quant(self, x, residual, weight, eps, scale, offset):
        normed, total = self.add_rms_norm(x, residual, weight, eps)
        return self.quantize(normed, scale, offset), total

    def add_rms_norm_dynamic_quant(self, x, residual, weight, eps, smooth_scales=None):
        normed, total = self.add_rms_norm(x, residual, weight, eps)
        q, q_scale = self.dynamic_quant(normed, smooth_scales=smooth_scales)
        return q, q_scale, total

    def rms_norm_quant(self, x, weight, eps, scale, offset):
        return self.quantize(self.rms_norm(x, weight, eps), scale, offset)

    def rms_norm_dynamic_quant(self, x, weight, eps, smooth_scales=None):
        return self.dynamic_quant(self.rms_norm(x, weight, eps), smooth_scales=smooth_scales)

    def swiglu_quant(self, x, scale, offset):
        return self.quantize(self.swiglu(x), scale, offset)

    def swiglu_dynamic_quant(self, x, smooth_scales=None):
        return self.dynamic_quant(self.swiglu(x), smooth_scales=smooth_scales)

    def qk_rmsnorm_rope(
        self, positions, query, key, q_weight, k_weight, eps, head_size, cos_sin_cache, is_neox
    ):
        def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            _require(
                x.dim() == 2 and x.shape[-1] % head_size == 0,
                f"qk_rmsnorm_rope needs [T, heads*{head_size}] inputs, got shape {tuple(x.shape)}",
            )
            heads = x.reshape(x.shape[0], -1, head_size)
            return self.rms_norm(heads, weight, eps).reshape(x.shape)

        return self.rotary_embedding(
            positions, norm(query, q_weight), norm(key, k_weight), head_size, cos_sin_cache, is_neox
        )

    def muls_add(self, x, scale, y):
        _require(
            x.shape == y.shape and x.dtype == y.dtype,
            f"muls_add needs x and y of one shape and dtype, got {tuple(x.shape)} {x.dtype} and "
            f"{tuple(y.shape)} {y.dtype}",
        )
        return torch.add(torch.mul(x, scale), y)
