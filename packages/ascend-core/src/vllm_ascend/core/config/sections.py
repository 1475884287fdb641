"""The sub-configs of ``additional_config`` that core serves, and the options it refuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vllm_ascend.core.config.schema import ConfigError, Section, option


@dataclass(frozen=True)
class RejectionSamplerConfig(Section):
    """How speculative draft tokens are verified (read by the runner's rejection sampler)."""

    PATH: ClassVar[str] = "additional_config.rejection_sampler_config"
    SUPPORTED: ClassVar[tuple[str, ...]] = ("strict",)

    verify_method: str = option(
        "strict",
        choices=("strict", "block", "entropy"),
        doc="strict: token-wise rejection sampling (block and entropy verification are not served yet).",
    )

    def _validate(self) -> None:
        if self.verify_method not in self.SUPPORTED:
            from vllm_ascend.core._version import __version__

            raise ConfigError(
                f"`{self.PATH}.verify_method` = {self.verify_method!r} is not supported yet by "
                f"vllm-ascend {__version__}; supported: {', '.join(repr(m) for m in self.SUPPORTED)}"
            )


#: Upstream ``additional_config`` options this version refuses (key path below ``additional_config``
#: -> what they would do). Giving any of them is a ConfigError; the core README lists the same table.
UNSUPPORTED_OPTIONS: dict[str, str] = {
    "ascend_compilation_config": "graph compilation with Ascend fusion passes",
    "xlite_graph_config": "the xlite graph runtime",
    "rl_config": "RL rollout defaults (sleep level, batch invariance)",
    "dynamic_spec_config": "speculative token count adapted to the acceptance rate",
    "rejection_sampler_config.entropy_threshold": "entropy-gated speculative verification",
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
