"""310P attention metadata: the runner's, plus the step's attention state, host query lengths and mask.

310P runs eagerly (its profile is ``eager_only``; the platform refuses graphs there), so the metadata
is never replayed in a captured graph: :meth:`AscendAttentionMetadata310.update_for_replay` refuses.
"""

from __future__ import annotations

import dataclasses
import enum

import torch
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata

from vllm_ascend.ascend310p.attention.mask import AttentionMaskBuilder310
from vllm_ascend.runner.attention.metadata import AscendAttentionMetadata, AscendAttentionMetadataBuilder


class AscendAttentionState310(enum.Enum):
    """Which forward path a step takes (see ``AscendAttentionBackendImpl310.forward``)."""

    #: Every request's queries are its whole sequence: dense causal attention over the new K/V.
    PREFILL_NO_CACHE = "prefill_no_cache"
    #: Every request has one new token: paged decode attention.
    DECODE_ONLY = "decode_only"
    #: Anything else (a prefill continuing over cached context, or prefills mixed with decodes):
    #: per-request attention over the paged KV with the splitfuse mask.
    CHUNKED_PREFILL = "chunked_prefill"


def attention_state(query_lens: torch.Tensor, seq_lens: torch.Tensor) -> AscendAttentionState310:
    """The state of a batch from its host query lengths and sequence lengths ``[B]``."""
    if bool((query_lens == 1).all()):
        return AscendAttentionState310.DECODE_ONLY
    if bool((query_lens == seq_lens).all()):
        return AscendAttentionState310.PREFILL_NO_CACHE
    return AscendAttentionState310.CHUNKED_PREFILL


@dataclasses.dataclass
class AscendAttentionMetadata310(AscendAttentionMetadata):
    """:class:`AscendAttentionMetadata` with the 310P extras.

    ``attn_state``: the path this step takes. ``query_lens_cpu [B]`` (int64, host): new tokens per
    request, what the splitfuse path and the mask need on the host. ``attn_mask``: the causal mask
    ``[max_seq_len, max_seq_len]`` (prefill without context), the splitfuse mask (normal
    ``[T, max_seq_len]``, or the compressed tile when ``mask_compressed``), None for decode only.
    """

    attn_state: AscendAttentionState310 = AscendAttentionState310.CHUNKED_PREFILL
    query_lens_cpu: torch.Tensor | None = None
    attn_mask: torch.Tensor | None = None
    mask_compressed: bool = False

    def set_query_lens_cpu(self, query_lens: torch.Tensor) -> None:
        """Attach host query lengths ``[B]`` (checked against ``query_start_loc_cpu``)."""
        lens = torch.as_tensor(query_lens).to("cpu", torch.int64)
        expected = self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1]
        if lens.shape != expected.shape or not torch.equal(lens, expected.to(torch.int64)):
            raise ValueError(
                f"query_lens {lens.tolist()} do not match query_start_loc_cpu "
                f"{self.query_start_loc_cpu.tolist()} (expected {expected.tolist()})"
            )
        self.query_lens_cpu = lens

    def get_query_lens_cpu(self) -> torch.Tensor:
        """Host query lengths ``[B]`` (int64), derived from ``query_start_loc_cpu`` when none was attached."""
        if self.query_lens_cpu is None:
            self.query_lens_cpu = (self.query_start_loc_cpu[1:] - self.query_start_loc_cpu[:-1]).to(
                torch.int64
            )
        return self.query_lens_cpu

    def update_for_replay(self, step: AscendAttentionMetadata) -> None:
        raise RuntimeError(
            "Atlas 310P runs eagerly (its profile is eager_only): 310P attention metadata is never captured "
            "in a graph, so it cannot be updated for a replay"
        )


class AscendAttentionMetadataBuilder310(AscendAttentionMetadataBuilder):
    """Builds :class:`AscendAttentionMetadata310`: the runner's metadata, then state, query lengths, mask.

    No graph support (``AttentionCGSupport.NEVER``): 310P is eager-only. Masks are built in the model
    dtype (float16 on 310P) on the builder's device and cached by the mask builder.
    """

    _cudagraph_support = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        model_config = getattr(vllm_config, "model_config", None)
        self.mask_dtype = getattr(model_config, "dtype", None) or torch.float16
        self.mask_builder = AttentionMaskBuilder310()

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> AscendAttentionMetadata310:
        base = super().build(common_prefix_len, common_attn_metadata, fast_build)
        query_lens = (base.query_start_loc_cpu[1:] - base.query_start_loc_cpu[:-1]).to(torch.int64)
        state = attention_state(query_lens, base.seq_lens_cpu)
        mask: torch.Tensor | None = None
        compressed = False
        if state is AscendAttentionState310.PREFILL_NO_CACHE:
            mask = self.mask_builder.gen_causal_additive_mask(base.max_seq_len, self.mask_dtype, self.device)
        elif state is AscendAttentionState310.CHUNKED_PREFILL:
            compressed = self.mask_builder.is_compressed_mask_supported()
            mask = self.mask_builder.get_splitfuse_mask(
                query_lens, base.seq_lens_cpu, self.mask_dtype, self.device, compressed=compressed
            )
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        return AscendAttentionMetadata310(
            **fields, attn_state=state, query_lens_cpu=query_lens, attn_mask=mask, mask_compressed=compressed
        )
