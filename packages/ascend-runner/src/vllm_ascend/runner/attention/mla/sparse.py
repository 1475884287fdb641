"""DeepSeek sparse attention (DSA / SFA, DeepSeek-V3.2): the sparse MLA backend and the indexer-cache backend.

A DSA layer is an MLA layer whose attention reads only the positions the layer's lightning indexer chose
(:mod:`vllm_ascend.runner.attention.mla.indexer` writes them into the model's shared top-k buffer before the
attention runs). Every query row — prefill, chunked prefill with context, decode, verification — attends
the latent cache with absorbed weights at its selected positions (``sparse_flash_attention``), as the NPU's
``npu_sparse_flash_attention`` does; there is no decompressed (dense MHA) prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionLayer,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    MultipleOf,
)

from vllm_ascend.core.sdk import SparseAttentionDeviceOps, get_current_hardware_profile, get_device_adaptor
from vllm_ascend.runner.attention.metadata import host_lengths, require_causal
from vllm_ascend.runner.attention.mla.backend import AscendMLABackend
from vllm_ascend.runner.attention.mla.impl import AscendMLAImpl
from vllm_ascend.runner.attention.support import AttentionConfigError

#: The indexer's cache write and top-k selection as one opaque op (registered by ``attention/mla/indexer.py``):
#: it reads the step's host metadata and writes the shared top-k buffer, so compiled graphs split around it
#: like around attention (the worker's ``graph_splitting_ops``).
DSA_INDEXER_OP = "vllm::ascend_dsa_indexer"


def sparse_device_ops() -> SparseAttentionDeviceOps:
    """The current device adaptor as a sparse-attention op provider."""
    adaptor = get_device_adaptor()
    if not isinstance(adaptor, SparseAttentionDeviceOps):
        raise AttentionConfigError(
            f"the {adaptor.family or type(adaptor).__name__} device adaptor provides no sparse-attention ops; "
            "DeepSeek sparse attention needs an adaptor mixing in "
            "vllm_ascend.core.device.adaptor.sparse.SparseAttentionDeviceOps"
        )
    return adaptor


@dataclass
class AscendSparseMetadata:
    """One step's batch for a DSA layer or an indexer cache: every query row is attended the same way.

    vLLM's ``MLAAttention`` reads the token counts and the decode/prefill split; a sparse layer reports every
    row as an MQA ("decode") row. ``query_start_loc_cpu [B+1]`` and ``seq_lens_cpu [B]`` (cached context plus
    new tokens, all in the cache when attention runs) are host tensors, ``block_table [B, blocks]`` is on the
    device."""

    num_reqs: int
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    prefill: None = None
    decode: None = None


class AscendSparseMetadataBuilder(AttentionMetadataBuilder[AscendSparseMetadata]):
    """Builds :class:`AscendSparseMetadata` for the sparse MLA layers and the indexer caches alike."""

    _cudagraph_support = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.exact_host_seq_lens = vllm_config.speculative_config is None

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> AscendSparseMetadata:
        common = common_attn_metadata
        require_causal(common, "sparse MLA")
        num_reqs = common.num_reqs
        query_start_loc_cpu, num_actual_tokens, seq_lens_cpu = host_lengths(common, self.exact_host_seq_lens)
        return AscendSparseMetadata(
            num_reqs=num_reqs,
            num_actual_tokens=num_actual_tokens,
            num_decodes=num_reqs,
            num_decode_tokens=num_actual_tokens,
            num_prefills=0,
            slot_mapping=common.slot_mapping[:num_actual_tokens],
            block_table=common.block_table_tensor[:num_reqs],
            query_start_loc_cpu=query_start_loc_cpu,
            seq_lens_cpu=seq_lens_cpu,
        )


class AscendSFABackend(AscendMLABackend):
    """Sparse MLA over the paged latent cache at the indexer's positions (``use_sparse`` MLA layers)."""

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @staticmethod
    def get_impl_cls():
        return AscendSFAImpl

    @staticmethod
    def get_builder_cls():
        return AscendSparseMetadataBuilder


class AscendIndexerBackend(AttentionBackend):
    """The indexer key cache's backend: one ``[blocks, block_size, index_head_dim]`` cache in the model dtype
    (the Ascend indexer scores in the activation dtype; no FP8 key cache) and the sparse metadata."""

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_builder_cls():
        return AscendSparseMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(get_current_hardware_profile().block_size_multiple)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []


class AscendSFAImpl(AscendMLAImpl):
    """The sparse MLA forward: the latent cache write (inherited) and :meth:`forward_mqa` on every row."""

    is_sparse = True
    supports_dense_mha_prefill = False

    def __init__(self, *args, indexer: object | None = None, **kwargs) -> None:
        topk_indices_buffer = kwargs.pop("topk_indices_buffer", None)
        # vLLM's index groups translate the shared logical top-k buffer into physical cache slots for its CUDA
        # kernels; the Ascend ops take logical positions and the block table, so the buffer is read directly.
        kwargs.pop("index_group_builder", None)
        config = get_current_vllm_config_or_none()
        if config is not None and getattr(config.attention_config, "hisparse_config", None) is not None:
            raise AttentionConfigError(
                "attention_config.hisparse_config (host-offloaded sparse KV) is not supported by the Ascend "
                "sparse MLA backend; allowed: None"
            )
        if not isinstance(topk_indices_buffer, torch.Tensor):
            raise AttentionConfigError(
                "a sparse MLA layer needs the model's top-k indices buffer (topk_indices_buffer); got "
                f"{type(topk_indices_buffer).__name__}"
            )
        super().__init__(*args, **kwargs)
        self.topk_indices_buffer = topk_indices_buffer

    def record_logical_topk_ready(self) -> None:
        """vLLM's wrapper signals that the layer's indexer (or an earlier layer's, for layers sharing it) has
        written this step's top-k positions, for backends that read them on another stream. The Ascend indexer
        op and the attention run in stream order, so there is nothing to record (and no Python state to keep:
        the call sits inside compiled code)."""

    def forward_mha(self, *args, **kwargs) -> None:
        raise AttentionConfigError(
            "the Ascend sparse MLA backend attends every row on the latent cache (forward_mqa); "
            "forward_mha was called for a sparse layer"
        )

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: AscendSparseMetadata,  # type: ignore[override]
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every row: ``(q_nope @ W_UK, q_pe)`` attend the latent cache at the row's top-k positions."""
        if isinstance(q, tuple):
            q_nope, q_pe = q
        else:
            q_nope, q_pe = q.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        out = sparse_device_ops().sparse_flash_attention(
            q_nope,
            q_pe,
            kv_c_and_k_pe_cache,
            self.topk_indices_buffer,
            attn_metadata.block_table,
            attn_metadata.query_start_loc_cpu,
            attn_metadata.seq_lens_cpu,
            self.scale,
        )
        return out, None
