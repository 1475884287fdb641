"""The Atlas A2/A3 adaptor: device ops mapped onto documented ``torch_npu`` ops.

``torch_npu`` is imported inside each op (never at module import), so this module loads on any
machine. Ops listed in :attr:`A2A3DeviceAdaptor.TORCH_OPS` have no ``torch_npu`` counterpart and run
the reference's device-agnostic torch code on the NPU tensors. torch-npu 2.13.0 documents int4 (int32
carrier) weights for ``npu_weight_quant_batchmatmul`` only, with float activations; the W4A8 ops
(int8 activations) unpack an int4 weight to int8 on the device for the call.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

import torch

from vllm_ascend.core.sdk import (
    GROUP_LIST_TYPES,
    SCORING_FUNCS,
    WEIGHT_FORMATS,
    BaseDeviceAdaptor,
    DeviceOpError,
    MoeDispatch,
    TaggedMemoryPool,
    check_choice,
    check_clipped_swiglu,
    check_group_bias,
    check_moe_gating,
    check_mrope,
    check_packed_attention,
    check_window_sinks,
)
from vllm_ascend.kernels.device.graph import NPUGraph
from vllm_ascend.kernels.device.mla import MLANPUOps
from vllm_ascend.kernels.device.reference import (
    check_group_backend,
    gather_paged_kv,
    grouped_top_k,
    int8_weight,
    mrope_cos_sin,
    stateless_group,
)
from vllm_ascend.kernels.device.sparse import SparseAttentionNPUOps

#: Size of the compressed causal mask the fused attention ops take with ``sparse_mode=3``.
CAUSAL_MASK_SIZE = 2048
#: ``acl_format`` codes of ``npu_format_cast``: ND (row-major) and FRACTAL_NZ.
ACL_FORMATS: dict[str, int] = {"ND": 2, "NZ": 29}


def torch_npu_module() -> ModuleType:
    """``import torch_npu`` with a clear error where it is missing."""
    try:
        import torch_npu
    except ImportError as exc:
        raise DeviceOpError(
            f"the NPU device adaptor needs torch_npu ({exc}); install vllm-ascend[npu] on an Ascend host, "
            "or set VLLM_ASCEND_DEVICE=reference to run on the CPU"
        ) from exc
    return torch_npu


def require_contiguous(**tensors: torch.Tensor) -> None:
    for name, tensor in tensors.items():
        if not tensor.is_contiguous():
            raise DeviceOpError(
                f"{name} must be contiguous for the NPU kernel (got strides {tensor.stride()})"
            )


def check_sink_inputs(query: torch.Tensor, value_cache: torch.Tensor) -> None:
    """The v2 op's ``learnable_sink`` constraints (torch-npu 2.13.0): bfloat16, value head size <= 128."""
    if query.dtype != torch.bfloat16:
        raise DeviceOpError(
            f"attention sinks on the NPU need bfloat16 attention (learnable_sink is bfloat16 only); got "
            f"query dtype {query.dtype}"
        )
    if value_cache.shape[-1] > 128:
        raise DeviceOpError(
            f"attention sinks on the NPU need a value head size <= 128; got {value_cache.shape[-1]}"
        )


def window_block_table(
    block_table: torch.Tensor, lens: list[int], q_lens: list[int], window: int, block_size: int
) -> tuple[torch.Tensor, list[int]]:
    """Each request's block-table row shifted past the whole blocks before ``ctx - W + 1`` (its first
    query's window start: vLLM may have replaced them with the null block), and its KV length shortened to
    match. Queries stay right-down aligned with the last key, so the band mask is unchanged."""
    skips = [
        max(0, seq_len - q_len - window + 1) // block_size
        for seq_len, q_len in zip(lens, q_lens, strict=True)
    ]
    cols = block_table.shape[1]
    shift = torch.tensor(skips[: block_table.shape[0]] + [0] * (block_table.shape[0] - len(skips)))
    idx = (torch.arange(cols).unsqueeze(0) + shift.unsqueeze(1)).clamp_max(cols - 1)
    table = block_table.gather(1, idx.to(block_table.device))
    return table, [seq_len - skip * block_size for seq_len, skip in zip(lens, skips, strict=True)]


def hccl_group(group: Any) -> tuple[int, int, str]:
    """``(rank, world size, HCCL communicator name)`` of a ``torch.distributed`` group on the NPU (the
    name is what the MC2 ops take to find the group's communicator)."""
    import torch.distributed as dist

    rank = dist.get_rank(group)
    backend = group._get_backend(torch.device("npu"))
    return rank, dist.get_world_size(group), backend.get_hccl_comm_name(rank)


def valid_rows(
    group_list: torch.Tensor, group_list_type: str, num_rows: int, device: torch.device
) -> torch.Tensor:
    """Row mask ``[M, 1]`` of the rows the groups cover (no host sync)."""
    check_choice("group_list_type", group_list_type, GROUP_LIST_TYPES)
    end = group_list.sum() if group_list_type == "count" else group_list[-1]
    return (torch.arange(num_rows, device=device) < end).unsqueeze(1)


def row_group_bias(
    bias: torch.Tensor, group_list: torch.Tensor, group_list_type: str, num_rows: int
) -> torch.Tensor:
    """``[M, N]`` fp32: each row's group's ``bias`` row, zero past the last group (no host sync)."""
    ends = group_list.to(torch.int64)
    if group_list_type == "count":
        ends = ends.cumsum(0)
    rows = torch.arange(num_rows, device=bias.device)
    group = torch.searchsorted(ends.to(bias.device), rows, right=True)  # G for rows past the groups
    padded = torch.cat((bias.float(), bias.new_zeros(1, bias.shape[1], dtype=torch.float32)))
    return padded[group]


#: ``npu_moe_gating_top_k``'s documented limits: experts per row, experts per group (more than this), and
#: ``group_count`` times the group size rounded up to this alignment.
GATING_MAX_EXPERTS = 2048
GATING_MIN_GROUP_SIZE = 2
GATING_GROUP_ALIGN = 32


def npu_gating_fits(num_experts: int, num_groups: int) -> bool:
    """Whether ``npu_moe_gating_top_k`` takes this expert/group layout (others run the reference gating)."""
    per_group = num_experts // num_groups
    aligned = -(-per_group // GATING_GROUP_ALIGN) * GATING_GROUP_ALIGN
    return (
        num_experts <= GATING_MAX_EXPERTS
        and per_group > GATING_MIN_GROUP_SIZE
        and aligned * num_groups <= GATING_MAX_EXPERTS
    )


def torch_npu_runtime() -> Any:
    """``torch.npu`` (registered by importing torch_npu)."""
    torch_npu_module()
    return torch.npu  # type: ignore[attr-defined]


class A2A3DeviceAdaptor(MLANPUOps, SparseAttentionNPUOps, BaseDeviceAdaptor):
    """Atlas A2 and A3 (Ascend910B / Ascend910_93): ``torch_npu`` fused ops and the ``torch.npu`` runtime."""

    communicator_cls = "vllm_ascend.kernels.device.communicator.AscendDeviceCommunicator"
    family = "A2/A3"
    #: Ops with no torch_npu counterpart: the reference's device-agnostic torch code runs on NPU tensors.
    TORCH_OPS: ClassVar[frozenset[str]] = frozenset({"kv_load"})

    def __init__(self) -> None:
        super().__init__()
        self._causal_masks: dict[torch.device, torch.Tensor] = {}

    def kv_load(self, key_cache, value_cache, block_table, seq_lens):
        """No torch_npu op gathers paged KV: indexing on the NPU tensors does."""
        return gather_paged_kv(key_cache, value_cache, block_table, seq_lens)

    def packed_attention(self, query, key, value, cu_seqlens, scale, *, causal=False, output=None):
        """``npu_fusion_attention`` in TND with cumulative ``actual_seq_qlen`` / ``actual_seq_kvlen`` (the
        documented varlen layout; KV heads may be fewer than query heads); causal: ``sparse_mode=3`` with
        the op's 2048x2048 compressed causal mask, else no mask."""
        bounds = check_packed_attention(query, key, value, cu_seqlens, output)
        used = bounds[-1]
        out = torch_npu_module().npu_fusion_attention(
            query[:used],
            key[:used],
            value[:used],
            query.shape[1],
            input_layout="TND",
            scale=scale,
            atten_mask=self._causal_mask(query.device).bool() if causal else None,
            sparse_mode=3 if causal else 0,
            actual_seq_qlen=bounds[1:],
            actual_seq_kvlen=bounds[1:],
        )[0]
        if output is None:
            return out
        output[:used].copy_(out)
        return output

    # -- runtime ---------------------------------------------------------------------------
    def torch_device(self, local_rank: int) -> torch.device:
        torch_npu_module()  # registers the "npu" device type
        return torch.device(f"npu:{local_rank}")

    def set_device(self, device: torch.device) -> None:
        torch_npu_runtime().set_device(device)

    def synchronize(self) -> None:
        torch_npu_runtime().synchronize()

    def empty_cache(self) -> None:
        torch_npu_runtime().empty_cache()

    def capture_graph(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], pool: Any = None
    ) -> NPUGraph:
        return NPUGraph(torch_npu_runtime(), fn, args, kwargs, pool)

    def graph_pool_handle(self) -> Any:
        return torch_npu_runtime().graph_pool_handle()

    def stream_api(self) -> dict[str, Any]:
        npu = torch_npu_runtime()
        return {
            "Stream": npu.Stream,
            "Event": npu.Event,
            "current_stream": npu.current_stream,
            "stream": npu.stream,
            "set_stream": npu.set_stream,
            "CUDAGraph": npu.NPUGraph,  # Model Runner V2 captures FULL graphs with these
            "graph": npu.graph,
        }

    def memory_pool(self) -> TaggedMemoryPool:
        """CANN virtual memory under torch_npu's pluggable allocator (``npu_memory_pool.py``)."""
        from vllm_ascend.kernels.device.npu_memory_pool import npu_memory_pool

        return npu_memory_pool(torch_npu_module())

    def install_runtime_shims(self) -> None:
        """torch_npu registers a real accelerator: nothing to replace."""
        torch_npu_module()

    def device_name(self, device_id: int = 0) -> str:
        return str(torch_npu_runtime().get_device_name(device_id))

    def total_memory(self, device_id: int = 0) -> int:
        return int(torch_npu_runtime().get_device_properties(device_id).total_memory)

    def core_counts(self, device_id: int = 0) -> tuple[int, int] | None:
        """torch_npu's ``cube_core_num`` / ``vector_core_num`` device properties (None where this
        torch_npu lacks them or reports no cores)."""
        props = torch_npu_runtime().get_device_properties(device_id)
        cube, vector = getattr(props, "cube_core_num", 0), getattr(props, "vector_core_num", 0)
        if not (isinstance(cube, int) and isinstance(vector, int) and cube > 0 and vector > 0):
            return None
        return cube, vector

    def memory_in_use(self, device: torch.types.Device | None = None) -> float:
        npu = torch_npu_runtime()
        npu.reset_peak_memory_stats(device)
        return float(npu.max_memory_allocated(device))

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)
        torch_npu_runtime().manual_seed_all(seed)

    def pin_memory_available(self) -> bool:
        return True

    def stateless_process_group(self, backend, prefix_store, group_rank, group_size, timeout):
        """An HCCL group over ``prefix_store``: torch_npu's ``ProcessGroupHCCL`` (options with the timeout),
        registered as the group's custom backend for the npu device."""
        check_group_backend(backend, "hccl")
        hccl = torch_npu_module()._C._distributed_c10d.ProcessGroupHCCL
        options = hccl.Options()
        options._timeout = timeout
        impl = hccl(prefix_store, group_rank, group_size, options)
        return stateless_group(prefix_store, group_rank, group_size, impl, "CUSTOM", "npu")

    def _causal_mask(self, device: torch.device) -> torch.Tensor:
        mask = self._causal_masks.get(device)
        if mask is None:
            mask = torch.triu(
                torch.ones(CAUSAL_MASK_SIZE, CAUSAL_MASK_SIZE, dtype=torch.int8, device=device), diagonal=1
            )
            self._causal_masks[device] = mask
        return mask

    def reshape_and_cache(self, key, value, key_cache, value_cache, slot_mapping):
        torch_npu = torch_npu_module()
        require_contiguous(key_cache=key_cache, value_cache=value_cache)
        n = slot_mapping.shape[0]
        keep = slot_mapping >= 0
        torch_npu.npu_scatter_pa_kv_cache(
            key[:n][keep].contiguous(),
            value[:n][keep].contiguous(),
            key_cache,
            value_cache,
            slot_mapping[keep],
            cache_mode="Norm",
        )

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
        """Paged TND attention in one fused call; a window is the band mode (``sparse_mode=4``,
        ``pre_tokens=W-1``, ``next_tokens=0``, right-down aligned) over a block table shifted past the blocks
        that left every query's window, and decode rows (one query, where the op ignores ``pre_tokens``) are
        recomputed over their gathered last ``W`` keys. Sinks go to the v2 op's ``learnable_sink``."""
        num_heads = query.shape[1]
        check_window_sinks(sliding_window, sinks, num_heads, causal)
        require_contiguous(key_cache=key_cache, value_cache=value_cache)
        if sinks is not None:
            check_sink_inputs(query, value_cache)
        num_blocks, block_size, num_kv_heads, _ = key_cache.shape
        # The op's host lengths (actual_seq_lengths): read once per step where the caller passes a plan.
        plan = self.attention_plan_for(plan, block_table, query_start_loc, seq_lens, block_size, causal)
        starts, lens = list(plan.starts), list(plan.lens)
        num_tokens = query.shape[0]
        used = starts[-1] if len(starts) > 1 else 0
        if output is None:
            output = query.new_zeros(num_tokens, num_heads, value_cache.shape[3])
        q_lens = [end - start for start, end in itertools.pairwise(starts)]
        decodes = [b for b, q_len in enumerate(q_lens) if q_len == 1]
        if sliding_window is None or len(decodes) < len(q_lens):
            kv_lens, table = lens, block_table
            if sliding_window is not None:
                table, kv_lens = window_block_table(block_table, lens, q_lens, sliding_window, block_size)
            band = sliding_window is not None
            out = self._fia(
                query[:used],
                key_cache.view(num_blocks, block_size, -1),
                value_cache.view(num_blocks, block_size, -1),
                atten_mask=self._causal_mask(query.device) if causal else None,
                q_ends=starts[1:],
                kv_lens=kv_lens,
                block_table=table,
                num_kv_heads=num_kv_heads,
                scale=scale,
                sparse_mode=4 if band else (3 if causal else 0),
                pre_tokens=sliding_window - 1 if band else 2147483647,
                next_tokens=0 if band else 2147483647,
                block_size=block_size,
                sinks=sinks,
            )
            output[:used] = out.view(used, num_heads, -1)
        if sliding_window is not None and decodes:
            # Windowed decode rows read only their last window (a batch of decodes only skips the fused op).
            self._window_decode_rows(
                query,
                key_cache,
                value_cache,
                block_table,
                starts,
                lens,
                decodes,
                scale,
                sliding_window,
                sinks,
                output,
            )
        return output[:num_tokens]

    def _window_decode_rows(
        self, query, key_cache, value_cache, block_table, starts, lens, decodes, scale, window, sinks, output
    ):
        """Decode rows under a window: each request's last ``min(W, seq_len)`` keys, gathered by indexing
        (blocks before them are never read), attended without a mask in one unpaged TND call."""
        keys, values, kv_ends, total = [], [], [], 0
        for b in decodes:
            lo = max(0, lens[b] - window)
            positions = torch.arange(lo, lens[b], device=key_cache.device)
            blocks = block_table[b].long()[torch.div(positions, key_cache.shape[1], rounding_mode="floor")]
            keys.append(key_cache[blocks, positions % key_cache.shape[1]])
            values.append(value_cache[blocks, positions % key_cache.shape[1]])
            total += lens[b] - lo
            kv_ends.append(total)
        rows = torch.tensor([starts[b] for b in decodes], device=query.device)
        out = self._fia(
            query[rows].contiguous(),
            torch.cat(keys).contiguous(),
            torch.cat(values).contiguous(),
            atten_mask=None,
            q_ends=list(range(1, len(decodes) + 1)),
            kv_lens=kv_ends,
            block_table=None,
            num_kv_heads=key_cache.shape[2],
            scale=scale,
            sparse_mode=0,
            pre_tokens=2147483647,
            next_tokens=2147483647,
            block_size=0,
            sinks=sinks,
        )
        output[rows] = out.view(len(decodes), query.shape[1], -1).to(output.dtype)

    def _fia(
        self,
        query,
        key,
        value,
        *,
        atten_mask,
        q_ends,
        kv_lens,
        block_table,
        num_kv_heads,
        scale,
        sparse_mode,
        pre_tokens,
        next_tokens,
        block_size,
        sinks,
    ):
        """One TND fused-infer-attention call: the family's plain call, or the v2 op (documented for A2/A3
        and A5) where a band window or sinks (its ``learnable_sink``) are needed."""
        if sparse_mode != 4 and sinks is None:
            return self._fia_plain(
                query,
                key,
                value,
                atten_mask=atten_mask,
                q_ends=q_ends,
                kv_lens=kv_lens,
                block_table=block_table,
                num_kv_heads=num_kv_heads,
                scale=scale,
                sparse_mode=sparse_mode,
                block_size=block_size,
            )
        out, _ = torch_npu_module().npu_fused_infer_attention_score_v2(
            query,
            key,
            value,
            atten_mask=atten_mask,
            actual_seq_qlen=q_ends,
            actual_seq_kvlen=kv_lens,
            block_table=block_table,
            learnable_sink=sinks.to(torch.bfloat16) if sinks is not None else None,
            num_query_heads=query.shape[1],
            num_key_value_heads=num_kv_heads,
            softmax_scale=scale,
            pre_tokens=pre_tokens,
            next_tokens=next_tokens,
            input_layout="TND",
            sparse_mode=sparse_mode,
            block_size=block_size,
        )
        return out

    def _fia_plain(
        self,
        query,
        key,
        value,
        *,
        atten_mask,
        q_ends,
        kv_lens,
        block_table,
        num_kv_heads,
        scale,
        sparse_mode,
        block_size,
    ):
        """A2/A3's TND ``npu_fused_infer_attention_score`` without window or sinks."""
        out, _ = torch_npu_module().npu_fused_infer_attention_score(
            query,
            key,
            value,
            atten_mask=atten_mask,
            actual_seq_lengths=q_ends,
            actual_seq_lengths_kv=kv_lens,
            block_table=block_table,
            num_heads=query.shape[1],
            num_key_value_heads=num_kv_heads,
            scale=scale,
            input_layout="TND",
            sparse_mode=sparse_mode,
            block_size=block_size,
        )
        return out

    def rms_norm(self, x, weight, eps):
        return torch_npu_module().npu_rms_norm(x, weight, epsilon=eps)[0]

    def add_rms_norm(self, x, residual, weight, eps):
        total = x.float() + residual.float()
        normed = torch_npu_module().npu_rms_norm(total, weight.float(), epsilon=eps)[0]
        return normed.to(x.dtype), total.to(x.dtype)

    def swiglu(self, x):
        return torch_npu_module().npu_swiglu(x, dim=-1)

    def clipped_swiglu(self, x, *, alpha=1.702, limit=7.0, bias=1.0, interleaved=True):
        check_clipped_swiglu(x, limit)
        return torch_npu_module().npu_clipped_swiglu(
            x.contiguous(), dim=-1, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved
        )

    def _rotary_mul(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, is_neox: bool
    ) -> torch.Tensor:
        """Rotate the first ``2 * cos.shape[-1]`` dims of every head of ``x [T, H*D]`` by ``npu_rotary_mul``."""
        rot_dim = 2 * cos.shape[-1]
        if is_neox:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        else:
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        # BSND with B=1: r1/r2 are 1S1D.
        cos, sin = cos.reshape(1, -1, 1, rot_dim), sin.reshape(1, -1, 1, rot_dim)
        heads = x.reshape(1, x.shape[0], -1, head_size)
        rotated = torch_npu_module().npu_rotary_mul(
            heads[..., :rot_dim].contiguous(),
            cos.to(x.dtype),
            sin.to(x.dtype),
            rotary_mode="half" if is_neox else "interleave",
        )
        if rot_dim < head_size:
            rotated = torch.cat((rotated, heads[..., rot_dim:]), dim=-1)
        return rotated.reshape(x.shape)

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
        return self._rotary_mul(query, cos, sin, head_size, is_neox), (
            self._rotary_mul(key, cos, sin, head_size, is_neox) if key is not None else None
        )

    def mrope(self, positions, query, key, head_size, cos_sin_cache, mrope_section, is_neox, interleaved):
        """``npu_mrope`` (chunked T/H/W sections; ``[0, 0, 0]`` for text-only positions). Its sections are
        chunked only, so interleaved sections (Qwen3-VL) pick each frequency's angle in torch and rotate by
        ``npu_rotary_mul``."""
        check_mrope(positions, cos_sin_cache, head_size, mrope_section)
        if interleaved and positions.dim() == 2:
            cos, sin = mrope_cos_sin(positions, cos_sin_cache, mrope_section, interleaved)
            return self._rotary_mul(query, cos, sin, head_size, is_neox), self._rotary_mul(
                key, cos, sin, head_size, is_neox
            )
        section = [0, 0, 0] if positions.dim() == 1 else [int(n) for n in mrope_section]
        return torch_npu_module().npu_mrope(
            positions.contiguous(),
            query.contiguous(),
            key.contiguous(),
            cos_sin_cache.contiguous(),
            head_size,
            mrope_section=section,
            rotary_mode="half" if is_neox else "interleave",
        )

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
        if not npu_gating_fits(router_logits.shape[1], num_groups):
            return grouped_top_k(
                router_logits, k, renormalize, scoring, bias, num_groups, topk_groups, routed_scaling_factor
            )
        # fp32 in (x and bias must share a dtype); the kernel's fp32 norm_out gives the weights, renormalised
        # and scaled here exactly as the reference does.
        _, ids, scores = torch_npu_module().npu_moe_gating_top_k(
            router_logits.float(),
            k,
            bias=bias.float() if bias is not None else None,
            k_group=topk_groups,
            group_count=num_groups,
            group_select_mode=1 if bias is not None else 0,
            renorm=0,
            norm_type=SCORING_FUNCS.index(scoring),
            out_flag=True,
            routed_scaling_factor=1.0,
        )
        weights = scores.float().gather(1, ids.long())
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-20)
        return weights * routed_scaling_factor, ids.to(torch.int32)

    def moe_init_routing(self, x, expert_ids, num_experts):
        num_tokens, k = expert_ids.shape
        sorted_x, expanded_row_idx, counts, _ = torch_npu_module().npu_moe_init_routing_v2(
            x,
            expert_ids.to(torch.int32),
            active_num=num_tokens * k,
            expert_num=num_experts,
            expert_tokens_num_type=1,
            expert_tokens_num_flag=True,
            quant_mode=-1,
            active_expert_range=[0, num_experts],
            row_idx_type=0,
        )
        return sorted_x, expanded_row_idx.to(torch.int32), counts.to(torch.int64)

    def moe_finalize_routing(self, expert_output, expanded_row_idx, topk_weights):
        num_tokens, k = topk_weights.shape
        # npu_moe_finalize_routing indexes expanded_src_to_dst_row as [k, T] (i + k * num_rows).
        src_to_dst = expanded_row_idx.view(num_tokens, k).t().contiguous().view(-1).to(torch.int32)
        return torch_npu_module().npu_moe_finalize_routing(
            expert_output,
            None,
            None,
            None,
            topk_weights.to(expert_output.dtype),
            src_to_dst,
            None,
            drop_pad_mode=0,
        )

    def moe_distribute_dispatch(self, x, expert_ids, group, *, num_experts, global_bs, active_mask=None):
        rank, world, name = hccl_group(group)
        expand_x, _, expand_idx, counts, ep_recv_counts, tp_recv_counts, _ = (
            torch_npu_module().npu_moe_distribute_dispatch(
                x,
                expert_ids.to(torch.int32),
                name,
                world,
                rank,
                num_experts,
                x_active_mask=active_mask,
                global_bs=global_bs,
                expert_token_nums_type=1,  # counts per local expert
            )
        )
        return MoeDispatch(expand_x, counts.to(torch.int64), (expand_idx, ep_recv_counts, tp_recv_counts))

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
        rank, world, name = hccl_group(group)
        expand_idx, ep_recv_counts, tp_recv_counts = dispatch.handle
        return torch_npu_module().npu_moe_distribute_combine(
            expert_output,
            expert_ids.to(torch.int32),
            expand_idx,
            ep_recv_counts,
            topk_weights.float(),
            name,
            world,
            rank,
            num_experts,
            tp_send_counts=tp_recv_counts,
            x_active_mask=active_mask,
            global_bs=global_bs,
        )

    def grouped_matmul(self, x, weight, group_list, *, group_list_type="count", bias=None):
        """``bias [G, N]`` is added in torch after the op: its docs give a 1-D bias per weight tensor, not a
        per-group bias for one ``[G, K, N]`` weight (and no bfloat16 bias)."""
        check_choice("group_list_type", group_list_type, GROUP_LIST_TYPES)
        check_group_bias(bias, weight)
        (out,) = torch_npu_module().npu_grouped_matmul(
            [x],
            [weight],
            group_list=group_list.to(torch.int64),
            split_item=2,
            group_type=0,
            group_list_type=1 if group_list_type == "count" else 0,  # the op: 0 = cumsum, 1 = count
        )
        if bias is not None:
            out = (out.float() + row_group_bias(bias, group_list, group_list_type, x.shape[0])).to(out.dtype)
        return out.masked_fill(~valid_rows(group_list, group_list_type, x.shape[0], x.device), 0)

    def grouped_matmul_swiglu_quant(
        self, x, weight, group_list, weight_scale, x_scale, *, group_list_type="cumsum"
    ):
        check_choice("group_list_type", group_list_type, GROUP_LIST_TYPES)
        torch_npu = torch_npu_module()
        if weight.dtype == torch.int32:  # the fused op reads int8 FRACTAL_NZ weights only
            weight = torch_npu.npu_format_cast(int8_weight(weight, "weight", "[G, K, 2N]"), ACL_FORMATS["NZ"])
        ends = group_list.cumsum(0) if group_list_type == "count" else group_list
        q, scale, _ = torch_npu.npu_grouped_matmul_swiglu_quant(
            x, weight, ends.to(torch.int64), weight_scale, x_scale
        )
        valid = valid_rows(ends, "cumsum", x.shape[0], x.device)
        return q.masked_fill(~valid, 0), scale.masked_fill(~valid.squeeze(1), 0)

    def grouped_quant_matmul(
        self,
        x,
        weight,
        group_list,
        weight_scale,
        x_scale,
        *,
        group_list_type="count",
        output_dtype=torch.bfloat16,
    ):
        check_choice("group_list_type", group_list_type, GROUP_LIST_TYPES)
        (out,) = torch_npu_module().npu_grouped_matmul(
            [x],
            [int8_weight(weight, "weight", "[G, K, N]")],
            scale=[weight_scale],
            per_token_scale=[x_scale],
            group_list=group_list.to(torch.int64),
            split_item=2,
            group_type=0,
            group_list_type=1 if group_list_type == "count" else 0,
            output_dtype=output_dtype,
        )
        return out.masked_fill(~valid_rows(group_list, group_list_type, x.shape[0], x.device), 0)

    def quantize(self, x, scale, offset):
        # npu_quantize (div_mode=True) takes float32/bf16 scales and int8 zero points.
        zero_points = None if offset is None else offset.reshape(1).round().to(torch.int8)
        return torch_npu_module().npu_quantize(
            x, scale.reshape(1).float(), zero_points, torch.qint8, -1, True
        )

    def dynamic_quant(self, x, *, smooth_scales=None):
        return torch_npu_module().npu_dynamic_quant(x, smooth_scales=smooth_scales)

    def quant_matmul(
        self, x, weight, weight_scale, *, pertoken_scale=None, bias=None, output_dtype=torch.bfloat16
    ):
        torch_npu = torch_npu_module()
        weight = int8_weight(weight, "weight", "[K, N]")
        scale = weight_scale.reshape(-1).float()
        if output_dtype == torch.float16 and pertoken_scale is None:
            # fp16 output without per-token scales takes the scale as int64 (documented for graph mode).
            scale = torch_npu.npu_trans_quant_param(scale)
        int_bias = bias if bias is not None and bias.dtype == torch.int32 else None
        out = torch_npu.npu_quant_matmul(
            x,
            weight,
            scale,
            pertoken_scale=pertoken_scale,
            bias=int_bias,
            output_dtype=output_dtype,
        )
        if bias is not None and int_bias is None:  # a float bias is added after dequantisation
            out = out + bias.reshape(-1).to(out.dtype)
        return out

    def weight_quant_matmul(
        self, x, weight, antiquant_scale, *, antiquant_offset=None, bias=None, group_size=0
    ):
        if x.numel() == 0:  # the kernel takes no empty tensors
            n_dim = weight.shape[1] * (8 if weight.dtype == torch.int32 else 1)
            return x.new_zeros(*x.shape[:-1], n_dim)
        # The kernel wants scale/offset in x's dtype, and a float32 bias for bf16 x (x's dtype otherwise).
        bias_dtype = torch.float32 if x.dtype == torch.bfloat16 else x.dtype
        return torch_npu_module().npu_weight_quant_batchmatmul(
            x,
            weight,
            antiquant_scale.to(x.dtype),
            antiquant_offset=None if antiquant_offset is None else antiquant_offset.to(x.dtype),
            bias=None if bias is None else bias.to(bias_dtype),
            antiquant_group_size=group_size,
        )

    def cast_weight_format(self, weight, fmt):
        check_choice("fmt", fmt, WEIGHT_FORMATS)
        return torch_npu_module().npu_format_cast(weight, ACL_FORMATS[fmt])

    # -- fused ops -------------------------------------------------------------------------
    def add_rms_norm_quant(self, x, residual, weight, eps, scale, offset):
        """``npu_add_rms_norm_quant``: its scales / zero points are per channel (``[H]``, fp32 / int32), so
        the per-tensor scale and offset are broadcast to the hidden size."""
        hidden = x.shape[-1]
        scales = scale.reshape(1).float().expand(hidden).contiguous()
        zero_points = None if offset is None else offset.reshape(1).round().to(torch.int32).expand(hidden)
        q, _, total = torch_npu_module().npu_add_rms_norm_quant(
            x,
            residual,
            weight,
            scales,
            None if zero_points is None else zero_points.contiguous(),
            epsilon=eps,
        )
        return q, total

    def add_rms_norm_dynamic_quant(self, x, residual, weight, eps, smooth_scales=None):
        """``npu_add_rms_norm_dynamic_quant`` (one smoothing vector: its second output pair is unused)."""
        q, _, total, q_scale, _ = torch_npu_module().npu_add_rms_norm_dynamic_quant(
            x, residual, weight, smooth_scale1=smooth_scales, epsilon=eps
        )
        return q, q_scale, total

    def rms_norm_quant(self, x, weight, eps, scale, offset):
        """``npu_rms_norm_quant`` with a zero beta (it requires one) and a zero offset where none is given."""
        zero_point = (
            torch.zeros(1, dtype=torch.int8, device=x.device)
            if offset is None
            else offset.reshape(1).round().to(torch.int8)
        )
        return torch_npu_module().npu_rms_norm_quant(
            x, weight, torch.zeros_like(weight), scale.reshape(1).to(x.dtype), zero_point, eps
        )

    def rms_norm_dynamic_quant(self, x, weight, eps, smooth_scales=None):
        """No single torch_npu op: ``npu_rms_norm`` then ``npu_dynamic_quant``."""
        torch_npu = torch_npu_module()
        normed = torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]
        return torch_npu.npu_dynamic_quant(normed, smooth_scales=smooth_scales)

    def swiglu_quant(self, x, scale, offset):
        """``npu_swiglu`` then ``npu_quantize`` (npu_swiglu_quant's static mode multiplies by its scales)."""
        torch_npu = torch_npu_module()
        zero_points = None if offset is None else offset.reshape(1).round().to(torch.int8)
        return torch_npu.npu_quantize(
            torch_npu.npu_swiglu(x, dim=-1), scale.reshape(1).float(), zero_points, torch.qint8, -1, True
        )

    def swiglu_dynamic_quant(self, x, smooth_scales=None):
        """``npu_swiglu_quant`` in dynamic mode (``quant_mode=1``); silu on the first half (``activate_left``)."""
        return torch_npu_module().npu_swiglu_quant(
            x, smooth_scales=smooth_scales, activate_left=True, quant_mode=1
        )

    def qk_rmsnorm_rope(
        self, positions, query, key, q_weight, k_weight, eps, head_size, cos_sin_cache, is_neox
    ):
        """No published torch_npu op: ``npu_rms_norm`` per head of q and k, then :meth:`rotary_embedding`."""
        torch_npu = torch_npu_module()

        def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            heads = x.reshape(x.shape[0], -1, head_size)
            return torch_npu.npu_rms_norm(heads, weight, epsilon=eps)[0].reshape(x.shape)

        return self.rotary_embedding(
            positions, norm(query, q_weight), norm(key, k_weight), head_size, cos_sin_cache, is_neox
        )

    def muls_add(self, x, scale, y):
        """torch_npu publishes no muls-add op: the elementwise torch ops run on the NPU tensors."""
        return torch.add(torch.mul(x, scale), y)
