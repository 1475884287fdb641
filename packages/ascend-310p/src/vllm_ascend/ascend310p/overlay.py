"""The Atlas 310P overlay: core's 310P profile refined, the 310P NPU adaptor, and the reference adaptor
of the reference device emulating 310P (``VLLM_ASCEND_REFERENCE_FAMILY=310p``).

310P cards compute in float16 only and lack the fused MoE and KV-scatter ops of A2/A3
(``torch_npu``'s docs list those ops for A2/A3 only), and their quantized matmuls take no per-token
scales: those ops run the reference torch code on the NPU tensors instead. The profile claims what is
served: float16, sparse/compressed int8 weights (W8A8S/W8A8SC), no graph capture (the platform refuses
graph modes), no Triton (the kernels run their torch implementations, V2's included), and the 310P worker.
310P has no device random path for sampling either: both adaptors' ``random_fill`` draws on the host RNG.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F

from vllm_ascend.ascend310p.attention.mask import MASK_VALUE, AttentionMaskBuilder310, expand_compressed_mask
from vllm_ascend.core.sdk import (
    BUILTIN_PROFILES,
    RANDOM_SEED_BOUND,
    AscendDeviceType,
    DeviceOpError,
    DeviceOverlay,
    HardwareCapability,
    check_attention_plan,
    check_packed_attention,
)
from vllm_ascend.kernels.device import (
    A2A3DeviceAdaptor,
    ReferenceDeviceAdaptor,
    gather_paged_kv,
    int8_weight,
    quant_matmul_int32,
    torch_npu_module,
)

_INT_MAX = 2147483647

PROFILE_310P = BUILTIN_PROFILES[AscendDeviceType._310P].with_changes(
    name="Atlas 310P",
    capabilities=frozenset({HardwareCapability.SPARSE_WEIGHT}),
    supported_dtypes=("float16",),
    worker="310p",
)


_F = TypeVar("_F", bound=Callable[..., Any])


def _counted_310p(fn: _F) -> _F:
    """Count a call of a 310P attention op in ``adaptor.call_counts`` (tests prove which path ran)."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.call_counts[fn.__name__] += 1
        return fn(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise DeviceOpError(message)


def require_float16(**tensors: torch.Tensor) -> None:
    """310P attention kernels take float16 only: anything else is refused naming the family."""
    for name, tensor in tensors.items():
        if tensor.dtype != torch.float16:
            raise DeviceOpError(f"Atlas 310P attention runs in float16 only, got {name} dtype {tensor.dtype}")


def refuse_window_sinks_310p(sliding_window: int | None, sinks: torch.Tensor | None) -> None:
    """The 310P attention kernels have no sliding window and no sink logits: either is refused."""
    for field, value in (("sliding_window", sliding_window), ("sinks", sinks)):
        if value is not None:
            raise DeviceOpError(f"{field} is not supported by Atlas 310P attention; allowed: None")


def _check_dense_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, atten_mask) -> None:
    _require(
        query.dim() == 3 and key.dim() == 3 and value.dim() == 3,
        f"query/key/value must be [S, H, D], got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}",
    )
    _require(
        key.shape[:2] == value.shape[:2] and key.shape[2] == query.shape[2],
        f"key {tuple(key.shape)} / value {tuple(value.shape)} do not fit query {tuple(query.shape)}",
    )
    _require(
        query.shape[1] % key.shape[1] == 0,
        f"query heads ({query.shape[1]}) must be a multiple of KV heads ({key.shape[1]})",
    )
    if atten_mask is not None:
        _require(
            tuple(atten_mask.shape) == (query.shape[0], key.shape[0]),
            f"atten_mask must be [{query.shape[0]}, {key.shape[0]}] (queries x keys), got {tuple(atten_mask.shape)}",
        )


_CPU_GENERATORS: weakref.WeakKeyDictionary[torch.Generator, torch.Generator] = weakref.WeakKeyDictionary()


def cpu_generator_of(generator: torch.Generator) -> torch.Generator:
    """The host generator standing in for a request's ``generator`` on 310P: made once per generator object
    from its initial seed (no device RNG is touched), then reused so the request's stream continues across
    steps: a request with ``seed=s`` draws the same values in every run, whatever else its batch holds."""
    cpu = _CPU_GENERATORS.get(generator)
    if cpu is None:
        cpu = torch.Generator(device="cpu")
        cpu.manual_seed(generator.initial_seed())
        _CPU_GENERATORS[generator] = cpu
    return cpu


def host_random_fill_310p(
    self: Any,
    out: torch.Tensor,
    distribution: str,
    generators: Mapping[int, torch.Generator] | None = None,
    counts: Sequence[int] | None = None,
) -> torch.Tensor:
    """``random_fill`` of both 310P adaptors: Atlas 310P has no device random path for sampling, so every
    draw is made on the host — the global CPU RNG for every row, then each seeded segment again from its
    request's host generator (:func:`cpu_generator_of`) — staged in pinned memory where the adaptor has it,
    and copied into ``out`` (any device) with one transfer."""
    segments = self.random_fill_segments(out, distribution, generators, counts)
    pin = out.device.type != "cpu" and bool(self.pin_memory_available())
    host = torch.empty(out.shape, dtype=out.dtype, pin_memory=pin)
    draw = {
        "uniform": lambda t, g: t.uniform_(generator=g),
        "exponential": lambda t, g: t.exponential_(generator=g),
        "seed": lambda t, g: t.random_(0, RANDOM_SEED_BOUND, generator=g),
    }[distribution]
    draw(host, None)
    for index, (start, stop) in enumerate(segments):
        generator = (generators or {}).get(index)
        if generator is not None and stop > start:
            draw(host[start:stop], cpu_generator_of(generator))
    if distribution == "exponential":
        host.clamp_(min=torch.finfo(host.dtype).tiny)
    out.copy_(host, non_blocking=pin)
    return out


class _Attention310Ops:
    """The 310P attention ops both 310P adaptors share; each adaptor brings ``prompt_attention_310p`` and
    ``paged_decode_attention``, the splitfuse path composes ``kv_load`` and ``prompt_attention_310p``.

    Masks are additive (:mod:`vllm_ascend.ascend310p.attention.mask`): 0 where a query attends a key,
    :data:`MASK_VALUE` (or any value at or below it) where it does not.
    """

    #: Whether the splitfuse kernel takes the compressed causal tile natively (the mask builder asks this).
    #: 310P's prompt flash attention takes ``sparse_mode=0`` (full masks) only.
    compressed_splitfuse_mask: ClassVar[bool] = False

    call_counts: Any
    kv_load: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    prompt_attention_310p: Callable[..., torch.Tensor]

    @_counted_310p
    def packed_attention(self, query, key, value, cu_seqlens, scale, *, causal=False, output=None):
        """310P has no varlen fusion attention: each sequence through ``prompt_attention_310p`` (no mask, or
        the additive causal mask), written into ``output``."""
        bounds = check_packed_attention(query, key, value, cu_seqlens, output)
        if output is None:
            output = query.new_zeros(query.shape[0], query.shape[1], value.shape[2])
        for start, stop in itertools.pairwise(bounds):
            if stop == start:
                continue
            mask = None
            if causal:
                mask = torch.full(
                    (stop - start, stop - start), MASK_VALUE, dtype=query.dtype, device=query.device
                )
                mask.triu_(1)
            self.prompt_attention_310p(
                query[start:stop], key[start:stop], value[start:stop], mask, scale, output=output[start:stop]
            )
        return output

    @_counted_310p
    def splitfuse_attention_310p(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        atten_mask: torch.Tensor,
        scale: float,
        *,
        compressed: bool = False,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Chunked prefill / mixed batches: each request's new queries over its paged KV, masked.

        ``query [T, Hq, D]`` (request ``b``'s rows ``query_start_loc[b]:query_start_loc[b+1]``, host
        offsets), ``key_cache``/``value_cache [blocks, block_size, Hkv, D|Dv]``, ``block_table [B, max_blocks]``,
        ``seq_lens [B]`` (host). ``atten_mask``: the normal splitfuse mask ``[T, >= max(seq_lens)]``
        (request ``b`` reads rows of its tokens, columns ``:seq_lens[b]``), or with ``compressed=True`` the
        ``[C, C]`` causal tile offset per request. Idle requests (no query) are skipped. Returns
        ``[T, Hq, Dv]`` in float16 (into ``output`` when given).
        """
        require_float16(query=query, key_cache=key_cache, value_cache=value_cache)
        starts = [int(v) for v in query_start_loc.tolist()]
        lens = [int(v) for v in seq_lens.tolist()]
        _require(
            len(starts) == len(lens) + 1,
            f"query_start_loc has {len(starts)} entries, expected len(seq_lens) + 1 = {len(lens) + 1}",
        )
        num_tokens, num_heads, _ = query.shape
        _require(
            starts[-1] <= num_tokens, f"query_start_loc ends at {starts[-1]} but query has {num_tokens} rows"
        )
        if not compressed:
            _require(
                atten_mask.dim() == 2
                and atten_mask.shape[0] >= starts[-1]
                and atten_mask.shape[1] >= max(lens, default=0),
                f"atten_mask must be the normal splitfuse mask [>= {starts[-1]}, >= {max(lens, default=0)}], "
                f"got {tuple(atten_mask.shape)}",
            )
        if output is None:
            output = query.new_zeros(num_tokens, num_heads, value_cache.shape[3])
        for b, (q_start, q_end) in enumerate(itertools.pairwise(starts)):
            q_len, seq_len = q_end - q_start, lens[b]
            if q_len == 0:
                continue
            _require(
                0 < q_len <= seq_len,
                f"request {b}: query length {q_len} must be within [0, seq_len={seq_len}]",
            )
            key, value = self.kv_load(key_cache, value_cache, block_table[b : b + 1], seq_lens[b : b + 1])
            if compressed:
                mask = expand_compressed_mask(atten_mask, q_len, seq_len)
            else:
                mask = atten_mask[q_start:q_end, :seq_len]
            self.prompt_attention_310p(
                query[q_start:q_end], key, value, mask, scale, output=output[q_start:q_end]
            )
        return output


class Ascend310PDeviceAdaptor(_Attention310Ops, A2A3DeviceAdaptor):
    """310P: prompt flash attention per request (fp16, MHA-expanded KV); no fused MoE/KV-scatter ops."""

    family = "310P"
    random_fill = host_random_fill_310p
    TORCH_OPS: ClassVar[frozenset[str]] = frozenset(
        {
            "kv_load",
            "reshape_and_cache",
            "rotary_embedding",
            "mrope",
            "swiglu",
            "clipped_swiglu",
            "moe_gating_top_k",
            "moe_init_routing",
            "moe_finalize_routing",
            "moe_distribute_dispatch",
            "moe_distribute_combine",
            "grouped_matmul_swiglu_quant",
            "grouped_quant_matmul",
            "dynamic_quant",
        }
    )

    reshape_and_cache = ReferenceDeviceAdaptor.reshape_and_cache
    rotary_embedding = ReferenceDeviceAdaptor.rotary_embedding
    mrope = ReferenceDeviceAdaptor.mrope  # npu_mrope is an Atlas A2/A3 op: 310P rotates in torch
    swiglu = ReferenceDeviceAdaptor.swiglu
    # npu_clipped_swiglu is documented for Atlas A2/A3 only.
    clipped_swiglu = ReferenceDeviceAdaptor.clipped_swiglu
    moe_gating_top_k = ReferenceDeviceAdaptor.moe_gating_top_k
    moe_init_routing = ReferenceDeviceAdaptor.moe_init_routing
    moe_finalize_routing = ReferenceDeviceAdaptor.moe_finalize_routing
    # No MC2 on 310P (the MoE runner never selects it there): the fixed-window all-to-all in torch.
    moe_distribute_dispatch = ReferenceDeviceAdaptor.moe_distribute_dispatch
    moe_distribute_combine = ReferenceDeviceAdaptor.moe_distribute_combine
    grouped_matmul_swiglu_quant = ReferenceDeviceAdaptor.grouped_matmul_swiglu_quant
    grouped_quant_matmul = ReferenceDeviceAdaptor.grouped_quant_matmul
    dynamic_quant = ReferenceDeviceAdaptor.dynamic_quant

    def quant_matmul(
        self, x, weight, weight_scale, *, pertoken_scale=None, bias=None, output_dtype=torch.bfloat16
    ):
        """310P's npu_quant_matmul takes no per-token scale (that case runs the reference code) and an int64 scale."""
        if pertoken_scale is not None:
            return quant_matmul_int32(x, weight, weight_scale, pertoken_scale, bias, output_dtype)
        torch_npu = torch_npu_module()
        int_bias = bias if bias is not None and bias.dtype == torch.int32 else None
        out = torch_npu.npu_quant_matmul(
            x,
            int8_weight(weight, "weight", "[K, N]"),
            torch_npu.npu_trans_quant_param(weight_scale.reshape(-1).float()),
            bias=int_bias,
            output_dtype=output_dtype,
        )
        if bias is not None and int_bias is None:  # 310P takes int32 biases only: a float one is added after
            out = out + bias.reshape(-1).to(out.dtype)
        return out

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
        """The dense backend's op on 310P: split-fuse attention over each request's paged KV with the causal
        mask (``causal=False``: an all-zero mask, every cached key visible). No window, no sinks. The op takes
        the lengths as tensors, so a ``plan`` is only checked against them."""
        refuse_window_sinks_310p(sliding_window, sinks)
        require_float16(query=query)
        if plan is not None:
            check_attention_plan(plan, block_table, query_start_loc, seq_lens, key_cache.shape[1], causal)
        q_lens = query_start_loc[1:] - query_start_loc[:-1]
        if causal:
            mask = AttentionMaskBuilder310().gen_splitfuse_mask(q_lens, seq_lens, query.dtype, query.device)
        else:
            mask = query.new_zeros(int(q_lens.sum()), int(seq_lens.max()))
        return self.splitfuse_attention_310p(
            query, key_cache, value_cache, block_table, query_start_loc, seq_lens, mask, scale, output=output
        )

    # -- the 310P attention paths (AscendAttentionBackendImpl310) --------------------------------
    @_counted_310p
    def prompt_attention_310p(self, query, key, value, atten_mask, scale, *, output=None):
        """One request's attention of ``query [Sq, Hq, D]`` over ``key``/``value [Skv, Hkv, D]`` with the
        additive ``atten_mask [Sq, Skv]`` (or None): ``npu_prompt_flash_attention`` in BSND with B=1.

        The op takes a boolean mask (True: not computed) and, on 310P, no ``num_key_value_heads``: masked
        entries become True and the KV heads are expanded to the query heads (MHA).
        """
        require_float16(query=query, key=key, value=value)
        _check_dense_inputs(query, key, value, atten_mask)
        _require(
            value.shape[2] == query.shape[2],
            f"310P prompt flash attention needs value head size == query head size, got {value.shape[2]} != {query.shape[2]}",
        )
        torch_npu = torch_npu_module()
        q_len, num_heads, _ = query.shape
        group = num_heads // key.shape[1]
        if group > 1:
            key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
        mask = None
        if atten_mask is not None:
            mask = atten_mask.lt(0).view(1, 1, q_len, key.shape[0])
        out = torch_npu.npu_prompt_flash_attention(
            query.unsqueeze(0).contiguous(),
            key.unsqueeze(0).contiguous(),
            value.unsqueeze(0).contiguous(),
            atten_mask=mask,
            num_heads=num_heads,
            scale_value=scale,
            pre_tokens=_INT_MAX,
            next_tokens=_INT_MAX,
            input_layout="BSND",
            sparse_mode=0,
        ).view(q_len, num_heads, -1)
        if output is None:
            return out
        output.copy_(out)
        return output

    @_counted_310p
    def paged_decode_attention(
        self, query, key_cache, value_cache, block_table, seq_lens, scale, *, output=None
    ):
        """One new token per request (``query [B, Hq, D]``) over its first ``seq_lens[b]`` cached tokens:
        ``npu_incre_flash_attention`` with the block table (BSH query, ``(blocks, block_size, H)`` caches).

        When the caches are not contiguous (K and V views of one ``[.., D + Dv]`` layer tensor) the op cannot
        page them: each request's KV is gathered into a right-padded ``[B, S, Hkv * D]`` batch instead and
        the op reads ``seq_lens[b]`` tokens of row ``b``.
        """
        require_float16(query=query, key_cache=key_cache, value_cache=value_cache)
        _require(query.dim() == 3, f"query must be [B, Hq, D], got shape {tuple(query.shape)}")
        _require(
            key_cache.dim() == 4 and value_cache.shape[:3] == key_cache.shape[:3],
            f"key_cache/value_cache must be [blocks, block_size, Hkv, D], got {tuple(key_cache.shape)} / {tuple(value_cache.shape)}",
        )
        batch, num_heads, head_size = query.shape
        num_blocks, block_size, num_kv_heads, _ = key_cache.shape
        _require(
            value_cache.shape[3] == head_size == key_cache.shape[3],
            f"310P incremental flash attention needs equal query/key/value head sizes, got {head_size}, "
            f"{key_cache.shape[3]}, {value_cache.shape[3]}",
        )
        lens = [int(v) for v in seq_lens.tolist()]
        _require(len(lens) == batch, f"seq_lens has {len(lens)} entries for {batch} queries")
        torch_npu = torch_npu_module()
        q = query.reshape(batch, 1, num_heads * head_size).contiguous()
        if key_cache.is_contiguous() and value_cache.is_contiguous():
            out = torch_npu.npu_incre_flash_attention(
                q,
                key_cache.view(num_blocks, block_size, -1),
                value_cache.view(num_blocks, block_size, -1),
                actual_seq_lengths=lens,
                block_table=block_table[:batch].to(torch.int32),
                num_heads=num_heads,
                scale_value=scale,
                input_layout="BSH",
                num_key_value_heads=num_kv_heads,
                block_size=block_size,
            )
        else:
            width = num_kv_heads * head_size
            keys = query.new_zeros(batch, max(lens, default=0), width)
            values = query.new_zeros(batch, max(lens, default=0), width)
            for b, seq_len in enumerate(lens):
                k, v = gather_paged_kv(key_cache, value_cache, block_table[b : b + 1], seq_lens[b : b + 1])
                keys[b, :seq_len] = k.reshape(seq_len, width)
                values[b, :seq_len] = v.reshape(seq_len, width)
            out = torch_npu.npu_incre_flash_attention(
                q,
                keys,
                values,
                actual_seq_lengths=lens,
                num_heads=num_heads,
                scale_value=scale,
                input_layout="BSH",
                num_key_value_heads=num_kv_heads,
            )
        out = out.view(batch, num_heads, head_size)
        if output is None:
            return out
        output.copy_(out)
        return output


class Ascend310PReferenceAdaptor(_Attention310Ops, ReferenceDeviceAdaptor):
    """The reference device emulating 310P (``VLLM_ASCEND_REFERENCE_FAMILY=310p``): torch on the cpu with
    310P's limits (float16 attention) and the 310P ops' documented semantics, computed in float32."""

    family = "310P-reference"
    random_fill = host_random_fill_310p

    def fused_infer_attention(self, query, *args, sliding_window=None, sinks=None, **kwargs):
        refuse_window_sinks_310p(sliding_window, sinks)
        require_float16(query=query)
        return super().fused_infer_attention(query, *args, **kwargs)

    @_counted_310p
    def prompt_attention_310p(self, query, key, value, atten_mask, scale, *, output=None):
        """``softmax(scale * Q K^T + atten_mask) V`` per query head (KV head ``h // group`` under GQA), in
        float32; ``atten_mask [Sq, Skv]`` holds 0 or values at or below ``MASK_VALUE`` (None: no mask).
        Returns ``[Sq, Hq, Dv]`` float16 (into ``output`` when given)."""
        require_float16(query=query, key=key, value=value)
        _check_dense_inputs(query, key, value, atten_mask)
        mask = None
        if atten_mask is not None:
            _require(
                bool(((atten_mask == 0) | (atten_mask <= MASK_VALUE)).all()),
                f"atten_mask entries must be 0 (attend) or <= {MASK_VALUE} (masked): the 310P kernel masks, "
                "it adds no other values",
            )
            mask = atten_mask.float()
        out = F.scaled_dot_product_attention(
            query.float().transpose(0, 1),
            key.float().transpose(0, 1),
            value.float().transpose(0, 1),
            attn_mask=mask,
            scale=scale,
            enable_gqa=query.shape[1] != key.shape[1],
        ).transpose(0, 1)
        if output is None:
            return out.to(query.dtype)
        output.copy_(out)
        return output

    @_counted_310p
    def paged_decode_attention(
        self, query, key_cache, value_cache, block_table, seq_lens, scale, *, output=None
    ):
        """Request ``b``'s one query ``query[b] [Hq, D]`` over its first ``seq_lens[b]`` cached tokens
        (``kv_load``'s gather), unmasked, in float32. Returns ``[B, Hq, Dv]`` float16."""
        require_float16(query=query, key_cache=key_cache, value_cache=value_cache)
        _require(query.dim() == 3, f"query must be [B, Hq, D], got shape {tuple(query.shape)}")
        lens = [int(v) for v in seq_lens.tolist()]
        _require(
            len(lens) == query.shape[0], f"seq_lens has {len(lens)} entries for {query.shape[0]} queries"
        )
        if output is None:
            output = query.new_empty(query.shape[0], query.shape[1], value_cache.shape[3])
        for b, seq_len in enumerate(lens):
            _require(seq_len > 0, f"request {b}: a decode needs seq_len >= 1, got {seq_len}")
            key, value = self.kv_load(key_cache, value_cache, block_table[b : b + 1], seq_lens[b : b + 1])
            self.prompt_attention_310p(query[b : b + 1], key, value, None, scale, output=output[b : b + 1])
        return output


OVERLAY = DeviceOverlay(
    family=AscendDeviceType._310P,
    profile=PROFILE_310P,
    adaptor=Ascend310PDeviceAdaptor,
    reference_adaptor=Ascend310PReferenceAdaptor,
    description="Atlas 310P: float16 only, per-request prompt flash attention, no fused MoE ops",
)
