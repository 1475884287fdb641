"""Sampling, KV-cache and sequence kernels: portable Triton with plain-torch references.

Every public function dispatches per call on its tensors' device (see ``_backend``): the Triton
kernel where Triton can run there, else the torch reference of the same signature
(``<name>_torch`` in the same module). Importing this package imports neither vLLM nor Triton;
attributes load lazily.
"""

from __future__ import annotations

from vllm_ascend.core.lazy import lazy_exports
from vllm_ascend.kernels._version import __version__

_EXPORTS = {
    "apply_temperature": "vllm_ascend.kernels.temperature",
    "gumbel_sample": "vllm_ascend.kernels.gumbel",
    "apply_min_p": "vllm_ascend.kernels.min_p",
    "apply_top_k_top_p": "vllm_ascend.kernels.top_k_top_p",
    "apply_penalties": "vllm_ascend.kernels.penalties",
    "apply_bad_words": "vllm_ascend.kernels.bad_words",
    "compute_token_logprobs": "vllm_ascend.kernels.logprobs",
    "compute_topk_logprobs": "vllm_ascend.kernels.logprobs",
    "zero_kv_blocks": "vllm_ascend.kernels.kv_zero",
    "compute_slot_mapping": "vllm_ascend.kernels.slot_mapping",
    "causal_conv1d_fn": "vllm_ascend.kernels.conv1d",
    "causal_conv1d_update": "vllm_ascend.kernels.conv1d",
    "fused_gdn_gating": "vllm_ascend.kernels.gdn_gating",
    "rejection_greedy_sample": "vllm_ascend.kernels.rejection",
    "rejection_random_sample": "vllm_ascend.kernels.rejection",
    "sample_recovered_tokens": "vllm_ascend.kernels.rejection",
    "expand_batch_to_tokens": "vllm_ascend.kernels.rejection",
    "PLACEHOLDER_TOKEN_ID": "vllm_ascend.kernels.rejection",
    "triton_q_rms": "vllm_ascend.kernels.rms_norm",
    "PAD_SLOT_ID": "vllm_ascend.kernels.slot_mapping",
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
