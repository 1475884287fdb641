"""310P attention forward: three paths chosen by the step's attention state.

- prefill without context: each request's queries over its own new K/V (no cache read), causal
  additive mask, through the adaptor's ``prompt_attention_310p``;
- decode only: one query per request over its paged KV, ``paged_decode_attention``;
- chunked prefill / mixed: each request's queries over its paged KV with the splitfuse mask,
  ``splitfuse_attention_310p``.

Encoder-only layers (no KV cache, bidirectional) run the 310P adaptor's ``packed_attention`` (one
unmasked prompt attention per sequence).

The KV write is the runner's (``do_kv_cache_update`` through ``reshape_and_cache``), run by vLLM before
the forward, so the paged paths read the step's own tokens too.
"""

from __future__ import annotations

import itertools

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.v1.attention.backend import AttentionLayer, AttentionType

from vllm_ascend.ascend310p.attention.metadata import AscendAttentionMetadata310, AscendAttentionState310
from vllm_ascend.core.sdk import get_device_adaptor
from vllm_ascend.runner.attention.impl import AscendAttentionImpl, split_kv_cache
from vllm_ascend.runner.attention.support import AttentionConfigError

#: Model dtypes and KV cache dtypes the 310P attention kernels take.
SUPPORTED_DTYPES_310P = (torch.float16,)
KV_CACHE_DTYPES_310P = ("auto", "float16")
#: The adaptor ops the 310P paths call.
OPS_310P = ("prompt_attention_310p", "paged_decode_attention", "splitfuse_attention_310p")


def attention_adaptor_310p():
    """The current device adaptor, checked to carry the 310P attention ops (a 310P NPU or the reference
    device emulating 310P)."""
    adaptor = get_device_adaptor()
    missing = [op for op in OPS_310P if not hasattr(adaptor, op)]
    if missing:
        raise AttentionConfigError(
            f"the Atlas 310P attention backend needs a 310P device adaptor; {type(adaptor).__name__} "
            f"(family {adaptor.family!r}) lacks {', '.join(missing)}. Run on a 310P device or set "
            "VLLM_ASCEND_DEVICE=reference VLLM_ASCEND_REFERENCE_FAMILY=310p"
        )
    return adaptor


class AscendAttentionBackendImpl310(AscendAttentionImpl):
    """Causal decoder self-attention (MHA/GQA/MQA) and encoder-only self-attention on 310P, float16 only."""

    def __init__(
        self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None, *args, **kwargs
    ):
        super().__init__(num_heads, head_size, scale, num_kv_heads, *args, **kwargs)
        config = get_current_vllm_config_or_none()
        model_config = config.model_config if config is not None else None
        dtype = model_config.dtype if model_config is not None else torch.float16
        if dtype not in SUPPORTED_DTYPES_310P:
            raise AttentionConfigError(
                f"dtype={dtype} is not supported by the Atlas 310P attention backend; allowed: float16"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES_310P:
            raise AttentionConfigError(
                f"kv_cache_dtype={self.kv_cache_dtype!r} is not supported by the Atlas 310P attention backend; "
                f"allowed: {', '.join(KV_CACHE_DTYPES_310P)}"
            )

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AscendAttentionMetadata310,  # type: ignore[override]
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise AttentionConfigError(
                "fused output quantization is not supported by the Atlas 310P attention backend"
            )
        if attn_metadata is None:  # profile / dummy run: no KV cache is bound yet
            return output.zero_()
        if not isinstance(attn_metadata, AscendAttentionMetadata310):
            raise TypeError(
                f"the Atlas 310P attention backend needs AscendAttentionMetadata310, got {type(attn_metadata).__name__}"
            )
        adaptor = attention_adaptor_310p()
        n = attn_metadata.num_actual_tokens
        if self.attn_type == AttentionType.ENCODER_ONLY:
            return self.encoder_only_forward(adaptor, query, key, value, attn_metadata, output)
        if not attn_metadata.causal:
            raise AttentionConfigError(
                "non-causal decoder attention is not supported by the Atlas 310P attention backend; allowed: "
                "causal decoder layers, or encoder-only layers (attn_type='encoder_only')"
            )
        state = attn_metadata.attn_state
        if state is AscendAttentionState310.PREFILL_NO_CACHE:
            mask = attn_metadata.attn_mask
            starts = [int(v) for v in attn_metadata.query_start_loc_cpu.tolist()]
            for q_start, q_end in itertools.pairwise(starts):
                q_len = q_end - q_start
                if q_len == 0:
                    continue
                adaptor.prompt_attention_310p(
                    query[q_start:q_end],
                    key[q_start:q_end],
                    value[q_start:q_end],
                    mask[:q_len, :q_len] if mask is not None else None,
                    self.scale,
                    output=output[q_start:q_end],
                )
            return output
        key_cache, value_cache = split_kv_cache(kv_cache, self.head_size)
        if state is AscendAttentionState310.DECODE_ONLY:
            adaptor.paged_decode_attention(
                query[:n],
                key_cache,
                value_cache,
                attn_metadata.block_table,
                attn_metadata.seq_lens_cpu,
                self.scale,
                output=output[:n],
            )
            return output
        if attn_metadata.attn_mask is None:
            raise ValueError("a chunked-prefill step needs its splitfuse mask (attn_mask is None)")
        adaptor.splitfuse_attention_310p(
            query[:n],
            key_cache,
            value_cache,
            attn_metadata.block_table,
            attn_metadata.query_start_loc_cpu,
            attn_metadata.seq_lens_cpu,
            attn_metadata.attn_mask,
            self.scale,
            compressed=attn_metadata.mask_compressed,
            output=output[:n],
        )
        return output
