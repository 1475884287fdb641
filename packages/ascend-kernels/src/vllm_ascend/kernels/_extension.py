"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.extensions import ExtensionDescriptor
from vllm_ascend.kernels._version import __version__

KERNEL_NAMES = (
    "apply_temperature",
    "gumbel_sample",
    "apply_min_p",
    "apply_top_k_top_p",
    "apply_penalties",
    "apply_bad_words",
    "compute_token_logprobs",
    "compute_topk_logprobs",
    "zero_kv_blocks",
    "compute_slot_mapping",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "fused_gdn_gating",
    "rejection_greedy_sample",
    "rejection_random_sample",
    "sample_recovered_tokens",
    "expand_batch_to_tokens",
    "triton_q_rms",
)


def register() -> None:
    """Fill core's registries with lazy paths (nothing heavy is imported here)."""
    from vllm_ascend.core.registry import KERNELS

    for name in KERNEL_NAMES:
        KERNELS.register(name, f"vllm_ascend.kernels:{name}")


EXTENSION = ExtensionDescriptor(
    name="kernels",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("kernels",),
    register=register,
    description="Triton sampling, KV-cache and sequence kernels with torch references",
)
