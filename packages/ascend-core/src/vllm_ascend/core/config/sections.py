"""The sub-configs of ``additional_config`` that core serves, and the options it refuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vllm_ascend.core._version import __version__
from vllm_ascend.core.config.schema import ConfigError, Section, option


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


@dataclass(frozen=True)
class RlConfig(Section):
    """Reinforcement-learning rollouts: a trainer drives the engine (sleep / wake-up, weight updates).

    ``enabled`` is the master switch; every other field needs it (a sub-field set without it would be a
    silent no-op, so it is refused). The process-wide effects (environment variables) are applied by the
    platform at config time, before vLLM builds its HTTP routes or spawns workers.
    """

    PATH: ClassVar[str] = "additional_config.rl_config"

    enabled: bool = option(
        False,
        doc=(
            "Serve RL rollouts: sets VLLM_SERVER_DEV_MODE=1, so vLLM's API server exposes its development and "
            "RL routes (/sleep, /wake_up, /is_sleeping, the weight-transfer routes). Those routes have no "
            "access control of their own: serve them only to the trainer."
        ),
    )
    sleep_mode_extra_cleanup: bool = option(
        False,
        doc=(
            "Sleep also drops the captured graphs, freeing their memory pools; each is captured again on its "
            "first use after waking (HCCL communicators are kept). Needs enabled=true and "
            "model_config.enable_sleep_mode (vllm serve --enable-sleep-mode)."
        ),
    )
    enable_training_consistency: bool = option(
        False,
        doc=(
            "Attention on the FA3 backend of the external flash_attn_npu_v3 package, to match a trainer's "
            "numerics. Not supported yet: only false is allowed."
        ),
    )
    enable_batch_invariant: bool = option(
        False,
        doc=(
            "Batch-invariant serving, the same switch as VLLM_ASCEND_BATCH_INVARIANT=1 (which this sets): a "
            "request's results do not depend on the rest of its batch. Needs enabled=true."
        ),
    )

    def _validate(self) -> None:
        if self.enable_training_consistency:
            raise ConfigError(
                f"{self.PATH}.enable_training_consistency=true is not supported yet by vllm-ascend "
                f"{__version__} (FA3 attention from flash_attn_npu_v3); allowed: false"
            )
        if not self.enabled:
            for name in ("sleep_mode_extra_cleanup", "enable_batch_invariant"):
                if getattr(self, name):
                    raise ConfigError(
                        f"{self.PATH}.{name}=true needs {self.PATH}.enabled=true (rl_config.enabled is the "
                        f"master switch; without it {name} would do nothing); set enabled to true or {name} "
                        "to false"
                    )


#: Upstream ``additional_config`` options this version refuses (key path below ``additional_config``
#: -> what they would do). Giving any of them is a ConfigError; the core README lists the same table.
UNSUPPORTED_OPTIONS: dict[str, str] = {
    "xlite_graph_config": "the xlite graph runtime",
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
