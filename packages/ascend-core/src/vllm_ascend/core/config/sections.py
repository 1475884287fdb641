"""The sub-configs of ``additional_config`` that core serves, and the options it refuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vllm_ascend.core.config.schema import Section, option


@dataclass(frozen=True)
class RejectionSamplerConfig(Section):
    """How speculative draft tokens are verified (read by the runner's rejection sampler)."""

    PATH: ClassVar[str] = "additional_config.rejection_sampler_config"
    SUPPORTED: ClassVar[tuple[str, ...]] = ("strict", "block", "entropy")

    verify_method: str = option(
        "strict",
        choices=SUPPORTED,
        doc=(
            "strict: token-wise rejection sampling; block: block verification (Sun et al. 2024), "
            "distribution-preserving, accepts at least as many drafts; entropy: typical acceptance "
            "(Cai et al. 2024), accepts a draft d while p(d) >= min(posterior_threshold, "
            "posterior_alpha * exp(-H(p))), NOT distribution-preserving. Greedy requests always "
            "accept exactly the target argmax."
        ),
    )
    posterior_threshold: float = option(
        0.09,
        gt=0,
        le=1,
        doc="entropy verification: the highest target probability a draft ever needs (epsilon).",
    )
    posterior_alpha: float = option(
        0.3,
        gt=0,
        doc="entropy verification: the scale of the entropy-dependent threshold alpha * exp(-H).",
    )


#: Upstream ``additional_config`` options this version refuses (key path below ``additional_config``
#: -> what they would do). Giving any of them is a ConfigError; the core README lists the same table.
UNSUPPORTED_OPTIONS: dict[str, str] = {
    "xlite_graph_config": "the xlite graph runtime",
    "rl_config": "RL rollout defaults (sleep level, batch invariance)",
    "rejection_sampler_config.entropy_threshold": "upstream's entropy gate on verification (verify_method "
    "'entropy' here is typical acceptance, tuned by posterior_threshold / posterior_alpha)",
    "finegrained_tp_config": "per-layer tensor-parallel sizes",
    "profiling_chunk_config": "prefill chunk sizes from a fitted latency model",
    "batch_job_sched_config": "batch-job scheduling",
    "short_request_first_config": "short-request-first scheduling",
    "dyntra_lb_config": "request migration between data-parallel ranks",
    "scheduler_config": "Ascend scheduler choices (recompute scheduler, custom class)",
    "sparse_kv_offload_config": "sparse KV-cache offload to host memory",
    "enable_shared_expert_dp": "shared experts run data-parallel",
    "multistream_overlap_shared_expert": "shared experts overlapped on a second stream",
    "enable_kv_nz": "the KV cache in FRACTAL_NZ layout",
    "mc2_comm_algorithm": "the MC2 dispatch/combine algorithm",
    "enable_megamoe": "the fused dispatch+expert+combine MoE kernel",
}
