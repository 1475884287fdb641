"""Attention forward: KV cache write by ``reshape_and_cache``, attention by ``fused_infer_attention``;
encoder-only layers (no KV cache) by ``packed_attention`` over the step's packed sequences.

vLLM calls both inside its own opaque ops (``unified_kv_cache_update``, ``unified_attention_with_output``);
the KV write goes through the custom op ``vllm_ascend::reshape_and_cache``.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.v1.attention.backend import AttentionImpl, AttentionLayer, AttentionType

from vllm_ascend.core.sdk import get_device_adaptor, held_views, kv_cache_views
from vllm_ascend.kernels.device.graph_ops import device_ops
from vllm_ascend.runner.attention.metadata import AscendAttentionMetadata
from vllm_ascend.runner.attention.support import AttentionConfigError, check_supported


@torch.compiler.assume_constant_result
def _kv_block_layout(
    dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...], head_size: int
) -> str:
    """The device's block layout for such a cache: a constant of the process (read once while tracing)."""
    return get_device_adaptor().kv_block_layout(dtype, shape, stride, head_size)


def split_kv_cache(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``[blocks, block_size, Hkv, D]`` / ``[.., Dv]`` of a layer's ``[blocks, Hkv, block_size, D+Dv]``
    cache, laid out as the device lays its blocks (``kv_block_layout``).

    Made once per cache tensor in eager execution (vLLM hands a layer the same tensor at every step): they are
    kept on the tensor itself, so they live as long as it does, and made again if its memory moved (``set_``).
    Traced code makes them in the graph."""
    if torch.compiler.is_compiling():
        return _split(kv_cache, head_size)
    return held_views(kv_cache, "_vllm_ascend_kv_views", head_size, lambda: _split(kv_cache, head_size))


def _split(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    layout = _kv_block_layout(kv_cache.dtype, tuple(kv_cache.shape), tuple(kv_cache.stride()), head_size)
    return kv_cache_views(kv_cache, head_size, layout)


#: The attention types the backend serves: decoder self-attention over the paged KV cache (causal, or
#: bidirectional where vLLM's metadata says ``causal=False``) and encoder-only self-attention without a cache.
SERVED_ATTN_TYPES = (AttentionType.DECODER, AttentionType.ENCODER_ONLY)


class AscendAttentionImpl(AttentionImpl[AscendAttentionMetadata]):
    """Decoder self-attention (MHA/GQA/MQA) for prefill, chunked prefill and decode, optionally with a
    sliding window (vLLM's int: the last ``W`` keys, the query's own included) and per-head sinks; and
    encoder-only self-attention (BERT-style embedders and cross-encoders: each sequence attends to all of
    its tokens, nothing cached)."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        **kwargs,
    ) -> None:
        config = get_current_vllm_config_or_none()
        model_config = config.model_config if config is not None else None
        check_supported(
            head_size, model_config.dtype if model_config else torch.get_default_dtype(), kv_cache_dtype
        )
        sinks = kwargs.pop("sinks", None)
        if (sliding_window is not None or sinks is not None) and type(
            self
        ).forward is not AscendAttentionImpl.forward:
            # The window and sinks are applied by this class's forward; a subclass with its own forward
            # (e.g. a family's attention paths) would silently drop them.
            field = "sliding_window" if sliding_window is not None else "sinks"
            raise AttentionConfigError(f"{field} is not supported by {type(self).__name__}; allowed: None")
        if sliding_window is not None and (
            isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1
        ):
            raise AttentionConfigError(
                f"sliding_window={sliding_window!r} is not supported by the Ascend attention backend; "
                "allowed: None or an int >= 1"
            )
        if sinks is not None and (sinks.dim() != 1 or sinks.shape[0] != num_heads):
            raise AttentionConfigError(
                f"sinks must have shape [num_heads={num_heads}] (this rank's query heads), "
                f"got {tuple(sinks.shape)}"
            )
        unsupported = {
            "alibi_slopes": alibi_slopes is not None,
            "logits_soft_cap": bool(logits_soft_cap),
            "kv_sharing_target_layer_name": kv_sharing_target_layer_name is not None,
        }
        for field, used in unsupported.items():
            if used:
                raise AttentionConfigError(
                    f"{field} is not supported by the Ascend attention backend; allowed: None"
                )
        if attn_type not in SERVED_ATTN_TYPES:
            raise AttentionConfigError(
                f"attn_type={getattr(attn_type, 'value', attn_type)!r} is not supported by the Ascend attention "
                f"backend; allowed: {', '.join(repr(t.value) for t in SERVED_ATTN_TYPES)}"
            )
        if attn_type == AttentionType.ENCODER_ONLY and (sliding_window is not None or sinks is not None):
            # packed_attention attends to whole sequences; a window or sinks would be dropped.
            field = "sliding_window" if sliding_window is not None else "sinks"
            raise AttentionConfigError(
                f"{field} with attn_type='encoder_only' is not supported by the Ascend attention backend; "
                "allowed: None"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        if self.num_heads % self.num_kv_heads != 0:
            raise AttentionConfigError(
                f"num_heads={num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        #: Keys a query sees: its last ``sliding_window`` positions, itself included (None: all before it).
        self.sliding_window = sliding_window
        #: The model's per-head sink logits ``[Hq]`` (a parameter, read at each forward: weights load later).
        self.sinks = sinks

    def encoder_only_forward(
        self,
        adaptor: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor,
    ) -> torch.Tensor:
        """An encoder-only layer: every packed sequence of the step attends to all of its own tokens through
        ``adaptor.packed_attention`` (no KV cache); ``attn_metadata`` carries ``num_actual_tokens`` and the
        host ``query_start_loc_cpu``."""
        n = attn_metadata.num_actual_tokens
        adaptor.packed_attention(
            query[:n],
            key[:n],
            value[:n],
            attn_metadata.query_start_loc_cpu,
            self.scale,
            causal=False,
            output=output[:n],
        )
        return output

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        if self.attn_type == AttentionType.ENCODER_ONLY:  # encoder-only layers have no KV cache
            return
        key_cache, value_cache = split_kv_cache(kv_cache, self.head_size)
        n = slot_mapping.shape[0]
        device_ops().reshape_and_cache(key[:n], value[:n], key_cache, value_cache, slot_mapping)

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AscendAttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise AttentionConfigError(
                "fused output quantization is not supported by the Ascend attention backend"
            )
        if attn_metadata is None:  # profile / dummy run: no KV cache is bound yet
            return output.zero_()
        n = attn_metadata.num_actual_tokens
        if self.attn_type == AttentionType.ENCODER_ONLY:
            return self.encoder_only_forward(get_device_adaptor(), query, key, value, attn_metadata, output)
        key_cache, value_cache = split_kv_cache(kv_cache, self.head_size)
        get_device_adaptor().fused_infer_attention(
            query[:n],
            key_cache,
            value_cache,
            attn_metadata.block_table,
            attn_metadata.query_start_loc_cpu,
            attn_metadata.seq_lens_cpu,
            self.scale,
            causal=attn_metadata.causal,
            output=output[:n],
            sliding_window=self.sliding_window,
            sinks=self.sinks,
            plan=attn_metadata.attention_plan(key_cache.shape[1]),
        )
        return output
