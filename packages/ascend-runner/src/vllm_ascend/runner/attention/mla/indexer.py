"""The DSA lightning indexer for Ascend: vLLM's ``deepseek_v2.Indexer`` replaced while the model is built.

Why a model patch: vLLM's indexer quantizes its query to FP8 per 128-column group, keeps an FP8 key cache
with per-block scales in a ``uint8`` cache, and scores through ``SparseAttnIndexer`` (DeepGEMM's FP8 MQA
logits and a CUDA top-k). None of it exists on Ascend: ``npu_lightning_indexer`` scores bf16/fp16 queries
against a paged key cache in the activation dtype and returns the top-k positions itself. The replacement
keeps vLLM's parameter names (``wq_b``, the fused ``wk_weights_proj``, ``k_norm``), so vLLM's weight loading
is unchanged, and writes the shared top-k buffer the sparse MLA layers read.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import CacheConfig, VllmConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.layernorm import LayerNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, ReplicatedLinear
from vllm.model_executor.layers.quantization import QuantizationConfig
from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache
from vllm.utils.torch_utils import direct_register_custom_op

from vllm_ascend.runner.attention.mla.sparse import (
    DSA_INDEXER_OP,
    AscendIndexerBackend,
    AscendSparseMetadata,
    sparse_device_ops,
)
from vllm_ascend.runner.attention.support import AttentionConfigError


class AscendIndexerCache(DeepseekV32IndexerCache):
    """The indexer's paged key cache ``[blocks, block_size, index_head_dim]`` served by :class:`AscendIndexerBackend`,
    and the selection over it (:meth:`select`)."""

    def __init__(self, *args, topk_tokens: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.topk_tokens = topk_tokens

    def get_attn_backend(self) -> type[AscendIndexerBackend]:  # type: ignore[override]
        return AscendIndexerBackend

    def select(
        self, q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, topk_indices_buffer: torch.Tensor
    ) -> None:
        """Write this step's keys into the cache and the top-k positions of every token into the buffer (``-1``
        past each row's selections and on padding rows)."""
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, list):
            raise AttentionConfigError("micro-batched steps are not supported by the Ascend DSA indexer")
        meta = None if metadata is None else metadata.get(self.prefix)
        if meta is None:  # the profiling run: no cache, nothing to select
            return
        if not isinstance(meta, AscendSparseMetadata):
            raise AttentionConfigError(
                f"{self.prefix}: expected the Ascend indexer metadata, got {type(meta).__name__}"
            )
        ops = sparse_device_ops()
        num_tokens = meta.num_actual_tokens
        ops.indexer_cache_write(k[:num_tokens], self.kv_cache, meta.slot_mapping)
        selected = ops.lightning_indexer(
            q[:num_tokens],
            self.kv_cache,
            weights[:num_tokens],
            meta.block_table,
            meta.query_start_loc_cpu,
            meta.seq_lens_cpu,
            self.topk_tokens,
        )
        topk_indices_buffer[:num_tokens] = selected
        topk_indices_buffer[num_tokens : q.shape[0]] = -1


def ascend_dsa_indexer(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    topk_indices_buffer: torch.Tensor,
    layer_name: str,
) -> None:
    """The op behind :data:`DSA_INDEXER_OP`: the named indexer cache's :meth:`AscendIndexerCache.select`."""
    get_forward_context().no_compile_layers[layer_name].select(q, k, weights, topk_indices_buffer)


def _ascend_dsa_indexer_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    topk_indices_buffer: torch.Tensor,
    layer_name: str,
) -> None:
    return None


direct_register_custom_op(
    op_name=DSA_INDEXER_OP.split("::")[1],
    op_func=ascend_dsa_indexer,
    mutates_args=["topk_indices_buffer"],
    fake_impl=_ascend_dsa_indexer_fake,
)


class AscendIndexer(nn.Module):
    """Scores every visible key per query token and keeps the ``index_topk`` best positions.

    ``score[t, s] = sum_h w[t, h] * n_heads^-0.5 * relu(q[t, h] . k[s] * head_dim^-0.5)`` with
    ``q = wq_b(q_resid)`` and ``k = k_norm(wk(x))`` (rotary on the first ``qk_rope_head_dim`` columns of
    both; half-split unless ``indexer_rope_interleave``) and ``w = weights_proj(x)`` — DeepSeek-V3.2's
    indexer in the activation dtype (the FP8 rounding of the released kernels is not reproduced).
    ``is_inplace_rope`` (vLLM's hint for its in-place rotary path) is not needed: the rotated values are taken
    from the rotary embedding's return value.
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        config,
        hidden_size: int,
        q_lora_rank: int,
        quant_config: QuantizationConfig | None,
        cache_config: CacheConfig | None,
        topk_indices_buffer: torch.Tensor | None,
        prefix: str = "",
        is_inplace_rope: bool = False,
    ) -> None:
        super().__init__()
        if cache_config is None or topk_indices_buffer is None:
            raise AttentionConfigError(
                f"{prefix}: the DSA indexer needs the cache config and the model's top-k indices buffer"
            )
        self.topk_tokens = int(config.index_topk)
        self.n_head = int(config.index_n_heads)
        self.head_dim = int(config.index_head_dim)
        self.rope_dim = int(config.qk_rope_head_dim)
        if not 0 < self.rope_dim <= self.head_dim:
            raise AttentionConfigError(
                f"{prefix}: qk_rope_head_dim={self.rope_dim} must be within (0, index_head_dim={self.head_dim}]"
            )
        self.wq_b = ReplicatedLinear(
            q_lora_rank,
            self.head_dim * self.n_head,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.wq_b",
        )
        self.wk_weights_proj = MergedColumnParallelLinear(
            hidden_size,
            [self.head_dim, self.n_head],
            bias=False,
            quant_config=None,
            disable_tp=True,
            prefix=f"{prefix}.wk_weights_proj",
        )
        self.k_norm = LayerNorm(self.head_dim, eps=1e-6, dtype=torch.float32)
        self.weights_scale = self.head_dim**-0.5 * self.n_head**-0.5
        self.topk_indices_buffer = topk_indices_buffer
        self.k_cache = AscendIndexerCache(
            head_dim=self.head_dim,
            dtype=vllm_config.model_config.dtype,
            prefix=f"{prefix}.k_cache",
            cache_config=cache_config,
            topk_tokens=self.topk_tokens,
        )

    def forward(
        self, hidden_states: torch.Tensor, qr: torch.Tensor, positions: torch.Tensor, rotary_emb
    ) -> torch.Tensor:
        """Projects, normalises and rotates the indexer's query and key, then selects through
        :data:`DSA_INDEXER_OP` (cache write + top-k into the shared buffer); returns the buffer."""
        q = self.wq_b(qr)[0].view(-1, self.n_head, self.head_dim)
        kw = self.wk_weights_proj(hidden_states)[0]
        k = self.k_norm(kw[:, : self.head_dim]).to(q.dtype)
        weights = kw[:, self.head_dim :].float() * self.weights_scale
        q_pe, q_nope = q.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        k_pe, k_nope = k.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        q_pe, k_pe = rotary_emb(positions, q_pe.contiguous(), k_pe.unsqueeze(1).contiguous())
        q = torch.cat([q_pe.reshape(-1, self.n_head, self.rope_dim), q_nope], dim=-1)
        k = torch.cat([k_pe.reshape(-1, self.rope_dim), k_nope], dim=-1)

        torch.ops.vllm.ascend_dsa_indexer(q, k, weights, self.topk_indices_buffer, self.k_cache.prefix)
        return self.topk_indices_buffer
