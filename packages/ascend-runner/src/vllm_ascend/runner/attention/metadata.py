"""Per-step attention metadata and its builder."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder, CommonAttentionMetadata

from vllm_ascend.core.sdk import AttentionPlan, get_device_adaptor


@dataclass
class AscendAttentionMetadata:
    """What one forward step's attention needs.

    ``query_start_loc_cpu`` ``[B+1]`` and ``seq_lens_cpu`` ``[B]`` are host tensors (the fused op
    takes actual sequence lengths on the host); ``block_table`` ``[B, blocks]`` and
    ``slot_mapping`` ``[T]`` live on the device. ``num_actual_tokens`` excludes padding. The block table
    keeps every column of the runner's table, so a step's metadata has the same shapes as the metadata a
    FULL graph captured for its padded batch, and :meth:`update_for_replay` can refresh it in place.
    """

    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool = True
    #: The device's attention plans of this step by cache block size (:meth:`attention_plan`).
    plans: dict[int, AttentionPlan] = field(default_factory=dict, repr=False, compare=False)

    def attention_plan(self, block_size: int) -> AttentionPlan:
        """The adaptor's ``plan_attention`` of this step's lengths and block table for caches of ``block_size``:
        made by the first layer that asks, so each layer's ``fused_infer_attention`` skips reading and checking
        the lengths again."""
        plan = self.plans.get(block_size)
        if plan is None:
            plan = get_device_adaptor().plan_attention(
                self.block_table, self.query_start_loc_cpu, self.seq_lens_cpu, block_size, causal=self.causal
            )
            self.plans[block_size] = plan
        return plan

    def update_for_replay(self, step: AscendAttentionMetadata) -> None:
        """The attention-parameter update of a FULL graph replay: take ``step``'s query offsets, sequence
        lengths, block table and slots into this (captured) metadata's tensors, in place. The step is a
        batch padded to the captured size; its padding rows are idle (no query, no KV)."""
        if step.num_reqs != self.num_reqs or step.block_table.shape != self.block_table.shape:
            raise ValueError(
                f"a graph captured for {self.num_reqs} requests x {self.block_table.shape[1]} blocks cannot "
                f"replay a step of {step.num_reqs} requests x {step.block_table.shape[1]} blocks"
            )
        if step.num_actual_tokens > self.num_actual_tokens or step.causal != self.causal:
            raise ValueError(
                f"a graph captured for {self.num_actual_tokens} tokens (causal={self.causal}) cannot replay "
                f"{step.num_actual_tokens} tokens (causal={step.causal})"
            )
        self.plans.clear()  # planned from the lengths replaced below
        self.query_start_loc_cpu.copy_(step.query_start_loc_cpu)
        self.seq_lens_cpu.copy_(step.seq_lens_cpu)
        if self.block_table.data_ptr() != step.block_table.data_ptr():
            self.block_table.copy_(step.block_table)
        if self.slot_mapping.data_ptr() != step.slot_mapping.data_ptr():
            n = step.num_actual_tokens
            self.slot_mapping[:n].copy_(step.slot_mapping[:n])
            self.slot_mapping[n:].fill_(-1)  # padding tokens write no KV

    @property
    def num_decodes(self) -> int:
        """Requests with a single new token."""
        q_lens = self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1]
        return int((q_lens == 1).sum())


def require_causal(common: CommonAttentionMetadata, backend: str) -> None:
    """Refuse a non-causal batch for a backend that attends causally only."""
    if not (common.causal if isinstance(common.causal, bool) else bool(common.causal.all())):
        raise ValueError(
            f"non-causal attention is not supported by the Ascend {backend} backend; allowed: causal"
        )


def host_lengths(
    common: CommonAttentionMetadata, exact_host_seq_lens: bool
) -> tuple[torch.Tensor, int, torch.Tensor]:
    """``(query_start_loc_cpu [B+1], num_actual_tokens, seq_lens_cpu [B])`` of a step on the host (int64).

    The host copy of the sequence lengths is exact without speculative decoding (``exact_host_seq_lens``);
    with it, rejected drafts make the host copy an upper bound and the device lengths are copied instead."""
    num_reqs = common.num_reqs
    query_start_loc_cpu = common.query_start_loc_cpu[: num_reqs + 1].to(torch.int64)
    if exact_host_seq_lens and common.seq_lens_cpu_upper_bound is not None:
        seq_lens_cpu = common.seq_lens_cpu_upper_bound[:num_reqs].to(torch.int64)
    else:
        seq_lens_cpu = common.seq_lens[:num_reqs].to("cpu", torch.int64)
    return query_start_loc_cpu, int(query_start_loc_cpu.numpy()[-1]), seq_lens_cpu


class AscendAttentionMetadataBuilder(AttentionMetadataBuilder[AscendAttentionMetadata]):
    """Builds :class:`AscendAttentionMetadata` from vLLM's common metadata.

    FULL graphs are supported for decode-only batches (one query token per request): their metadata has
    the same shapes at every step of one padded size, which the replay's parameter update needs."""

    _cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.exact_host_seq_lens = vllm_config.speculative_config is None

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> AscendAttentionMetadata:
        common = common_attn_metadata
        num_reqs = common.num_reqs
        query_start_loc_cpu, num_actual_tokens, seq_lens_cpu = host_lengths(common, self.exact_host_seq_lens)
        starts, lens = query_start_loc_cpu.numpy(), seq_lens_cpu.numpy()  # host maxima: numpy's are cheaper
        causal = common.causal if isinstance(common.causal, bool) else bool(common.causal.all())
        return AscendAttentionMetadata(
            num_reqs=num_reqs,
            num_actual_tokens=num_actual_tokens,
            max_query_len=int((starts[1:] - starts[:-1]).max()) if num_reqs else 0,
            max_seq_len=int(lens.max()) if num_reqs else 0,
            query_start_loc_cpu=query_start_loc_cpu,
            seq_lens_cpu=seq_lens_cpu,
            block_table=common.block_table_tensor[:num_reqs],
            slot_mapping=common.slot_mapping[:num_actual_tokens],
            causal=causal,
        )
