"""MLA forward on the device adaptor: latent cache write, decompressed prefill, absorbed decode.

vLLM's ``MLAAttention.forward_impl`` calls :meth:`AscendMLAImpl.forward_mha` on the prefill rows and, after
absorbing ``W_UK`` into the query (``q_nope @ W_UK``), :meth:`AscendMLAImpl.forward_mqa` on the decode rows,
whose latent output it projects through ``W_UV``.
"""

from __future__ import annotations

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.v1.attention.backend import AttentionLayer, AttentionType, MLAAttentionImpl

from vllm_ascend.core.sdk import MLADeviceOps, get_device_adaptor, latent_cache_parts
from vllm_ascend.runner.attention.mla import MLA_KV_CACHE_DTYPES
from vllm_ascend.runner.attention.mla.metadata import AscendMLAMetadata
from vllm_ascend.runner.attention.support import AttentionConfigError, supported_dtypes


def mla_device_ops() -> MLADeviceOps:
    """The current device adaptor as an MLA op provider (every family adaptor mixes the MLA ops in)."""
    adaptor = get_device_adaptor()
    if not isinstance(adaptor, MLADeviceOps):
        raise AttentionConfigError(
            f"the {adaptor.family or type(adaptor).__name__} device adaptor provides no MLA ops; "
            "MLA attention needs an adaptor mixing in vllm_ascend.core.device.adaptor.mla.MLADeviceOps"
        )
    return adaptor


def latent_cache_views(kv_cache: torch.Tensor, kv_lora_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[blocks, block_size, 1, L]`` / ``[.., R]`` views of the two regions of a layer's latent cache
    (:func:`latent_cache_parts`: the paged-cache form ``kv_load`` gathers from)."""
    c_kv, k_pe = latent_cache_parts(kv_cache, kv_lora_rank)
    return c_kv.unsqueeze(2), k_pe.unsqueeze(2)


class AscendMLAImpl(MLAAttentionImpl[AscendMLAMetadata]):
    """Decoder MLA for prefill (incl. chunked, with cached context), decode, and mixed batches."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        q_lora_rank: int | None,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        qk_head_dim: int,
        v_head_dim: int,
        kv_b_proj: torch.nn.Module,
        indexer: object | None = None,
        q_pad_num_heads: int | None = None,
        **extra: object,
    ) -> None:
        unsupported = {
            "alibi_slopes": alibi_slopes is not None,
            "sliding_window": sliding_window is not None,
            "logits_soft_cap": bool(logits_soft_cap),
            "kv_sharing_target_layer_name": kv_sharing_target_layer_name is not None,
            "indexer": indexer is not None,
            "q_pad_num_heads": q_pad_num_heads is not None,
        }
        for field, used in unsupported.items():
            if used:
                raise AttentionConfigError(
                    f"{field} is not supported by the Ascend MLA backend; allowed: None"
                )
        if extra:
            raise AttentionConfigError(
                f"{', '.join(sorted(extra))} is not supported by the Ascend MLA backend (sparse MLA is not served)"
            )
        if attn_type != AttentionType.DECODER:
            raise AttentionConfigError(
                f"attn_type={attn_type!r} is not supported by the Ascend MLA backend; "
                f"allowed: {AttentionType.DECODER.value!r}"
            )
        if kv_cache_dtype not in MLA_KV_CACHE_DTYPES:
            raise AttentionConfigError(
                f"kv_cache_dtype={kv_cache_dtype!r} is not supported by the Ascend MLA backend; "
                f"allowed: {', '.join(MLA_KV_CACHE_DTYPES)}"
            )
        config = get_current_vllm_config_or_none()
        dtype = config.model_config.dtype if config is not None and config.model_config else None
        if dtype is not None and dtype not in supported_dtypes():
            raise AttentionConfigError(
                f"dtype={dtype} is not supported by the Ascend MLA backend on this device; allowed: "
                f"{', '.join(str(d).removeprefix('torch.') for d in supported_dtypes())}"
            )
        if num_kv_heads != 1 or head_size != kv_lora_rank + qk_rope_head_dim:
            raise AttentionConfigError(
                f"an MLA layer caches one latent head of kv_lora_rank + rope dim = "
                f"{kv_lora_rank + qk_rope_head_dim}; got num_kv_heads={num_kv_heads}, head_size={head_size}"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = 1
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.qk_head_dim = qk_head_dim
        self.v_head_dim = v_head_dim
        self.kv_b_proj = kv_b_proj
        self.q_pad_num_heads = None

    def cache_block_views(self, kv_cache: torch.Tensor) -> list[torch.Tensor]:
        """The block-major regions a block of this layer's latent cache occupies (its ``c_kv`` and its
        ``k_pe``), for code that handles whole blocks (the KV block zeroer)."""
        return list(latent_cache_parts(kv_cache, self.kv_lora_rank))

    def do_kv_cache_update(
        self,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
        k_scale: torch.Tensor,
    ) -> None:
        """Write each token's ``[c_kv | k_pe]`` row (``k_pe`` arrives as ``[T, 1, R]``)."""
        if kv_cache.numel() == 0:
            return
        mla_device_ops().mla_cache_write(kv_c_normed, k_pe.flatten(1), kv_cache, slot_mapping.flatten())

    def forward_mha(
        self,
        q: torch.Tensor,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: AscendMLAMetadata,
        k_scale: torch.Tensor,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
    ) -> None:
        """Prefill rows: each request's whole sequence (cached context + its new tokens, all written to the
        cache already) is gathered from the latent cache and decompressed through ``kv_b_proj`` into per-head
        ``K = [k_nope | k_pe]`` and ``V``; the queries attend causally, aligned to the end of the keys."""
        if output_scale is not None:
            raise AttentionConfigError("fused output quantization is not supported by the Ascend MLA backend")
        prefill = attn_metadata.prefill
        if prefill is None:
            raise AttentionConfigError("forward_mha was called for a batch without prefill metadata")
        c_cache, pe_cache = latent_cache_views(kv_c_and_k_pe_cache, self.kv_lora_rank)
        latent, pe = get_device_adaptor().kv_load(
            c_cache, pe_cache, prefill.block_table, prefill.seq_lens_cpu
        )
        num_keys = latent.shape[0]
        kv = self.kv_b_proj(latent.view(num_keys, self.kv_lora_rank))[0]
        kv = kv.view(num_keys, self.num_heads, self.qk_nope_head_dim + self.v_head_dim)
        k_nope, value = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        key = torch.cat([k_nope, pe.to(k_nope.dtype).expand(-1, self.num_heads, -1)], dim=-1)
        kv_start_loc = torch.zeros(prefill.seq_lens_cpu.shape[0] + 1, dtype=torch.int64)
        torch.cumsum(prefill.seq_lens_cpu, 0, out=kv_start_loc[1:])
        num_tokens = q.shape[0]
        mla_device_ops().mla_prefill_attention(
            q,
            key,
            value,
            prefill.query_start_loc_cpu,
            kv_start_loc,
            self.scale,
            output=output.view(num_tokens, self.num_heads, self.v_head_dim),
        )

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: AscendMLAMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode rows: ``(q_nope @ W_UK, q_pe)`` attend the latent cache; returns the ``[B, N, L]`` latent
        output (vLLM projects it through ``W_UV``) and no LSE (no decode context parallelism)."""
        decode = attn_metadata.decode
        if decode is None:
            raise AttentionConfigError("forward_mqa was called for a batch without decode metadata")
        if isinstance(q, tuple):
            q_nope, q_pe = q
        else:
            q_nope, q_pe = q.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        out = mla_device_ops().mla_latent_attention(
            q_nope,
            q_pe,
            kv_c_and_k_pe_cache,
            decode.block_table,
            decode.query_start_loc_cpu,
            decode.seq_lens_cpu,
            self.scale,
        )
        return out, None
