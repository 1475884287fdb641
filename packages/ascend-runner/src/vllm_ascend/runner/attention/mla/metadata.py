"""Per-step MLA metadata: the batch split into decodes (first) and prefills, each with its own view."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder, CommonAttentionMetadata
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from vllm_ascend.runner.attention.metadata import host_lengths, require_causal


@dataclass
class AscendMLADecodeMetadata:
    """The decode requests (up to ``reorder_batch_threshold`` query tokens each: one, or a speculative
    verification's 1 + k): attended causally on the latent cache with absorbed weights.

    ``query_start_loc_cpu [D+1]`` and ``seq_lens_cpu [D]`` are host tensors, ``block_table [D, blocks]`` is
    on the device."""

    block_table: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor


@dataclass
class AscendMLAPrefillMetadata:
    """The prefill requests (after the decodes): attended with K/V decompressed from the latent cache.

    ``query_start_loc_cpu [P+1]`` starts at 0 at the first prefill token; ``seq_lens_cpu [P]`` counts each
    request's cached context plus its new tokens (all of them in the cache when attention runs)."""

    block_table: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    max_query_len: int


@dataclass
class AscendMLAMetadata:
    """What vLLM's ``MLAAttention.forward_impl`` reads (token counts and the decode/prefill split: the
    first ``num_decode_tokens`` rows are decodes) plus each part's own metadata."""

    num_reqs: int
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    slot_mapping: torch.Tensor
    decode: AscendMLADecodeMetadata | None = None
    prefill: AscendMLAPrefillMetadata | None = None
    causal: bool = True


class AscendMLAMetadataBuilder(AttentionMetadataBuilder[AscendMLAMetadata]):
    """Builds :class:`AscendMLAMetadata`; asks vLLM's runner to put decode requests first.

    A decode is a request of at most ``reorder_batch_threshold`` query tokens: 1, or 1 + the speculative
    tokens when speculative decoding is on, so verification batches (and the drafter's own MLA layers)
    take the latent path instead of decompressing the whole context per step; the latent op attends any
    number of query rows per request (causal, aligned to the end of the keys)."""

    _cudagraph_support = AttentionCGSupport.NEVER
    reorder_batch_threshold: int = 1

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self.exact_host_seq_lens = vllm_config.speculative_config is None

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> AscendMLAMetadata:
        common = common_attn_metadata
        require_causal(common, "MLA")
        num_reqs = common.num_reqs
        query_start_loc_cpu, num_actual_tokens, seq_lens_cpu = host_lengths(common, self.exact_host_seq_lens)
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(
            common, decode_threshold=self.reorder_batch_threshold
        )
        block_table = common.block_table_tensor[:num_reqs]
        decode = None
        if num_decodes:
            decode = AscendMLADecodeMetadata(
                block_table=block_table[:num_decodes],
                query_start_loc_cpu=query_start_loc_cpu[: num_decodes + 1],
                seq_lens_cpu=seq_lens_cpu[:num_decodes],
            )
        prefill = None
        if num_prefills:
            starts = query_start_loc_cpu[num_decodes:] - query_start_loc_cpu[num_decodes]
            prefill = AscendMLAPrefillMetadata(
                block_table=block_table[num_decodes:],
                query_start_loc_cpu=starts,
                seq_lens_cpu=seq_lens_cpu[num_decodes:],
                max_query_len=int((starts[1:] - starts[:-1]).max()),
            )
        return AscendMLAMetadata(
            num_reqs=num_reqs,
            num_actual_tokens=num_actual_tokens,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_prefills,
            slot_mapping=common.slot_mapping[:num_actual_tokens],
            decode=decode,
            prefill=prefill,
        )
