"""Sampling, KV-cache, sequence and LoRA kernels: portable Triton with plain-torch references.

Every public function dispatches per call on its tensors' device (see ``_backend``): the Triton
kernel where Triton can run there, else the torch reference of the same signature
(``<name>_torch`` in the same module). The draft-input builders of ``spec_decode_inputs`` are
plain torch on every device. Importing this package imports neither vLLM nor Triton;
attributes load lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core.sdk import lazy_exports
from vllm_ascend.kernels._version import __version__

if TYPE_CHECKING:  # real signatures for type checkers; at runtime the names load lazily
    from vllm_ascend.kernels._backend import KernelBackendError as KernelBackendError
    from vllm_ascend.kernels._backend import use_triton as use_triton
    from vllm_ascend.kernels.bad_words import apply_bad_words as apply_bad_words
    from vllm_ascend.kernels.conv1d import causal_conv1d_fn as causal_conv1d_fn
    from vllm_ascend.kernels.conv1d import causal_conv1d_update as causal_conv1d_update
    from vllm_ascend.kernels.gated_delta_rule import chunk_gated_delta_rule as chunk_gated_delta_rule
    from vllm_ascend.kernels.gated_delta_rule import recurrent_gated_delta_rule as recurrent_gated_delta_rule
    from vllm_ascend.kernels.gdn_gating import fused_gdn_gating as fused_gdn_gating
    from vllm_ascend.kernels.gumbel import gumbel_sample as gumbel_sample
    from vllm_ascend.kernels.kv_zero import zero_kv_blocks as zero_kv_blocks
    from vllm_ascend.kernels.logprobs import compute_token_logprobs as compute_token_logprobs
    from vllm_ascend.kernels.logprobs import compute_topk_logprobs as compute_topk_logprobs
    from vllm_ascend.kernels.lora import lora_expand as lora_expand
    from vllm_ascend.kernels.lora import lora_expand_segmented as lora_expand_segmented
    from vllm_ascend.kernels.lora import lora_expand_segmented_slices as lora_expand_segmented_slices
    from vllm_ascend.kernels.lora import lora_expand_slices as lora_expand_slices
    from vllm_ascend.kernels.lora import lora_reserve as lora_reserve
    from vllm_ascend.kernels.lora import lora_shrink as lora_shrink
    from vllm_ascend.kernels.lora import lora_shrink_segmented as lora_shrink_segmented
    from vllm_ascend.kernels.lora import lora_shrink_segmented_slices as lora_shrink_segmented_slices
    from vllm_ascend.kernels.lora import lora_shrink_slices as lora_shrink_slices
    from vllm_ascend.kernels.lora import lora_token_order as lora_token_order
    from vllm_ascend.kernels.min_p import apply_min_p as apply_min_p
    from vllm_ascend.kernels.ngram import ngram_propose as ngram_propose
    from vllm_ascend.kernels.penalties import apply_penalties as apply_penalties
    from vllm_ascend.kernels.penalties import penalty_counts_add as penalty_counts_add
    from vllm_ascend.kernels.penalties import penalty_counts_clear as penalty_counts_clear
    from vllm_ascend.kernels.rejection import PLACEHOLDER_TOKEN_ID as PLACEHOLDER_TOKEN_ID
    from vllm_ascend.kernels.rejection import expand_batch_to_tokens as expand_batch_to_tokens
    from vllm_ascend.kernels.rejection import rejection_block_sample as rejection_block_sample
    from vllm_ascend.kernels.rejection import rejection_entropy_sample as rejection_entropy_sample
    from vllm_ascend.kernels.rejection import rejection_greedy_sample as rejection_greedy_sample
    from vllm_ascend.kernels.rejection import rejection_random_sample as rejection_random_sample
    from vllm_ascend.kernels.rejection import rejection_synthetic_sample as rejection_synthetic_sample
    from vllm_ascend.kernels.rejection import sample_recovered_tokens as sample_recovered_tokens
    from vllm_ascend.kernels.rejection import typical_acceptance_threshold as typical_acceptance_threshold
    from vllm_ascend.kernels.rms_norm import triton_q_rms as triton_q_rms
    from vllm_ascend.kernels.slot_mapping import PAD_SLOT_ID as PAD_SLOT_ID
    from vllm_ascend.kernels.slot_mapping import compute_slot_mapping as compute_slot_mapping
    from vllm_ascend.kernels.spec_decode_inputs import (
        copy_and_expand_eagle_inputs as copy_and_expand_eagle_inputs,
    )
    from vllm_ascend.kernels.spec_decode_inputs import (
        eagle_prepare_inputs_padded as eagle_prepare_inputs_padded,
    )
    from vllm_ascend.kernels.spec_decode_inputs import (
        eagle_prepare_next_token_padded as eagle_prepare_next_token_padded,
    )
    from vllm_ascend.kernels.spec_decode_inputs import eagle_step_slot_mapping as eagle_step_slot_mapping
    from vllm_ascend.kernels.state_copy import batch_memcpy as batch_memcpy
    from vllm_ascend.kernels.temperature import apply_temperature as apply_temperature
    from vllm_ascend.kernels.top_k_top_p import apply_top_k_top_p as apply_top_k_top_p
    from vllm_ascend.kernels.warmup import kernel_warmup as kernel_warmup
    from vllm_ascend.kernels.warmup import penalties_triton_warmup as penalties_triton_warmup
    from vllm_ascend.kernels.warmup import register_warmup as register_warmup
    from vllm_ascend.kernels.warmup import rejection_sampler_triton_warmup as rejection_sampler_triton_warmup
    from vllm_ascend.kernels.warmup import triton_rms_warmup as triton_rms_warmup

_EXPORTS = {
    "apply_temperature": "vllm_ascend.kernels.temperature",
    "gumbel_sample": "vllm_ascend.kernels.gumbel",
    "apply_min_p": "vllm_ascend.kernels.min_p",
    "apply_top_k_top_p": "vllm_ascend.kernels.top_k_top_p",
    "apply_penalties": "vllm_ascend.kernels.penalties",
    "penalty_counts_add": "vllm_ascend.kernels.penalties",
    "penalty_counts_clear": "vllm_ascend.kernels.penalties",
    "apply_bad_words": "vllm_ascend.kernels.bad_words",
    "compute_token_logprobs": "vllm_ascend.kernels.logprobs",
    "compute_topk_logprobs": "vllm_ascend.kernels.logprobs",
    "zero_kv_blocks": "vllm_ascend.kernels.kv_zero",
    "compute_slot_mapping": "vllm_ascend.kernels.slot_mapping",
    "causal_conv1d_fn": "vllm_ascend.kernels.conv1d",
    "causal_conv1d_update": "vllm_ascend.kernels.conv1d",
    "fused_gdn_gating": "vllm_ascend.kernels.gdn_gating",
    "chunk_gated_delta_rule": "vllm_ascend.kernels.gated_delta_rule",
    "recurrent_gated_delta_rule": "vllm_ascend.kernels.gated_delta_rule",
    "batch_memcpy": "vllm_ascend.kernels.state_copy",
    "ngram_propose": "vllm_ascend.kernels.ngram",
    "lora_expand": "vllm_ascend.kernels.lora",
    "lora_expand_segmented": "vllm_ascend.kernels.lora",
    "lora_shrink": "vllm_ascend.kernels.lora",
    "lora_shrink_segmented": "vllm_ascend.kernels.lora",
    "lora_token_order": "vllm_ascend.kernels.lora",
    "lora_reserve": "vllm_ascend.kernels.lora",
    "lora_expand_slices": "vllm_ascend.kernels.lora",
    "lora_expand_segmented_slices": "vllm_ascend.kernels.lora",
    "lora_shrink_slices": "vllm_ascend.kernels.lora",
    "lora_shrink_segmented_slices": "vllm_ascend.kernels.lora",
    "rejection_greedy_sample": "vllm_ascend.kernels.rejection",
    "rejection_random_sample": "vllm_ascend.kernels.rejection",
    "sample_recovered_tokens": "vllm_ascend.kernels.rejection",
    "rejection_block_sample": "vllm_ascend.kernels.rejection",
    "typical_acceptance_threshold": "vllm_ascend.kernels.rejection",
    "rejection_entropy_sample": "vllm_ascend.kernels.rejection",
    "rejection_synthetic_sample": "vllm_ascend.kernels.rejection",
    "expand_batch_to_tokens": "vllm_ascend.kernels.rejection",
    "PLACEHOLDER_TOKEN_ID": "vllm_ascend.kernels.rejection",
    "triton_q_rms": "vllm_ascend.kernels.rms_norm",
    "PAD_SLOT_ID": "vllm_ascend.kernels.slot_mapping",
    "eagle_step_slot_mapping": "vllm_ascend.kernels.spec_decode_inputs",
    "eagle_prepare_inputs_padded": "vllm_ascend.kernels.spec_decode_inputs",
    "eagle_prepare_next_token_padded": "vllm_ascend.kernels.spec_decode_inputs",
    "copy_and_expand_eagle_inputs": "vllm_ascend.kernels.spec_decode_inputs",
    "KernelBackendError": "vllm_ascend.kernels._backend",
    "use_triton": "vllm_ascend.kernels._backend",
    "kernel_warmup": "vllm_ascend.kernels.warmup",
    "penalties_triton_warmup": "vllm_ascend.kernels.warmup",
    "rejection_sampler_triton_warmup": "vllm_ascend.kernels.warmup",
    "triton_rms_warmup": "vllm_ascend.kernels.warmup",
    "register_warmup": "vllm_ascend.kernels.warmup",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
