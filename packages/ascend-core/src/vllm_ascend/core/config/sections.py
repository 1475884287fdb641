"""The sub-configs of ``additional_config``: one frozen, self-validating dataclass per feature."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from vllm_ascend.core.config.schema import ConfigError, Section, field_meta, option

EPLB_POLICIES = {"random": 0, "default": 1, "swift": 2, "flashlb": 3}


@dataclass(frozen=True)
class AscendFusionConfig(Section):
    """Which graph fusion passes run when graph fusion is enabled."""

    PATH: ClassVar[str] = "additional_config.ascend_compilation_config.fusion"

    fuse_norm_quant: bool = option(True, doc="Fuse (Add)RMSNorm followed by (dynamic/MX) quantization.")
    fuse_qknorm_rope: bool = option(True, doc="Fuse Q/K RMSNorm followed by rotary embedding.")
    fuse_muls_add: bool = option(True, doc="Fuse x * scale + y into one muls_add op.")
    fold_allgather_chunk: bool = option(
        True, doc="Fold all_gather followed by its inverse chunk into identity."
    )
    eliminate_noop: bool = option(True, doc="Drop view/reshape nodes that do not change the shape.")


@dataclass(frozen=True)
class AscendCompilationConfig(Section):
    """Graph compilation on Ascend: fusion passes, the npugraph_ex path and compile ranges."""

    PATH: ClassVar[str] = "additional_config.ascend_compilation_config"

    enable_graph_fusion: bool = option(True, doc="Run the pattern-matching fusion passes.")
    enable_npugraph_ex: bool = option(
        False, doc="Compile through the NPU graph extension instead of fusion passes."
    )
    compile_ranges_split_points: tuple[int, ...] = field(
        default_factory=tuple,
        metadata=field_meta(
            "Token counts at which compiled graphs are split into ranges (strictly increasing)."
        ),
    )
    fusion: AscendFusionConfig = field(
        default_factory=AscendFusionConfig, metadata=field_meta("Individual fusion pass switches.")
    )

    def _validate(self) -> None:
        points = self.compile_ranges_split_points
        for i, point in enumerate(points):
            if point < 1:
                raise ConfigError(
                    f"{self.PATH}.compile_ranges_split_points[{i}] = {point} is out of range; allowed: >= 1"
                )
            if i and point <= points[i - 1]:
                raise ConfigError(
                    f"{self.PATH}.compile_ranges_split_points must be strictly increasing; "
                    f"[{i}] = {point} follows {points[i - 1]}"
                )

    def compile_ranges(self, max_num_batched_tokens: int) -> list[tuple[int, int]]:
        """Inclusive token ranges ``[(1, p1), (p1 + 1, p2), ..., (pk + 1, max)]`` below the batch limit."""
        bounds = [p for p in self.compile_ranges_split_points if p < max_num_batched_tokens]
        bounds.append(max_num_batched_tokens)
        ranges, start = [], 1
        for end in bounds:
            ranges.append((start, end))
            start = end + 1
        return ranges


@dataclass(frozen=True)
class EplbConfig(Section):
    """Expert-parallel load balancing: static expert maps, redundant experts, dynamic re-placement."""

    PATH: ClassVar[str] = "additional_config.eplb_config"

    dynamic_eplb: bool = option(False, doc="Re-place experts periodically from recorded expert load.")
    expert_map_path: str | None = option(None, doc="JSON expert map giving the initial placement.")
    expert_map_record_path: str | None = option(
        None, doc="Where dynamic EPLB writes the placement it computes (JSON expert map)."
    )
    num_redundant_experts: int = option(0, ge=0, doc="Extra physical expert slots holding replicas.")
    expert_heat_collection_interval: int = option(
        400, ge=1, doc="Forward steps of expert load collected before each re-balancing."
    )
    algorithm_execution_interval: int = option(
        30, ge=1, doc="Forward steps over which a computed placement is applied layer by layer."
    )
    num_warmup_iterations: int = option(
        0, ge=0, doc="Forward steps after start-up whose expert load is not recorded."
    )
    load_collection_phase: str = option(
        "all", choices=("all", "prefill", "decode"), doc="Which batches' expert load is recorded."
    )
    eplb_policy_type: int = option(
        2,
        choices=(0, 1, 2, 3),
        aliases=EPLB_POLICIES,
        doc="Re-balancing policy: 0 random, 1 default, 2 swift, 3 flashlb (names accepted).",
    )

    def _validate(self) -> None:
        if self.expert_map_record_path is not None and not self.dynamic_eplb:
            raise ConfigError(
                f"{self.PATH}.expert_map_record_path requires {self.PATH}.dynamic_eplb = true "
                "(only dynamic EPLB computes placements to record)"
            )
        for key in ("expert_map_path", "expert_map_record_path"):
            value = getattr(self, key)
            if value is not None and not value.endswith(".json"):
                raise ConfigError(f"{self.PATH}.{key} = {value!r} must name a .json file")
        if self.expert_map_path is not None and self.expert_map_path == self.expert_map_record_path:
            raise ConfigError(
                f"{self.PATH}.expert_map_record_path must differ from {self.PATH}.expert_map_path "
                "(recording would overwrite the input map)"
            )

    @property
    def policy_name(self) -> str:
        return next(name for name, code in EPLB_POLICIES.items() if code == self.eplb_policy_type)

    @property
    def enabled(self) -> bool:
        """Whether any EPLB feature (static map, redundancy or dynamic) is in use."""
        return self.dynamic_eplb or self.expert_map_path is not None or self.num_redundant_experts > 0


@dataclass(frozen=True)
class RejectionSamplerConfig(Section):
    """How speculative draft tokens are verified."""

    PATH: ClassVar[str] = "additional_config.rejection_sampler_config"

    DEFAULT_ENTROPY_THRESHOLD: ClassVar[float] = 0.5

    verify_method: str = option(
        "strict",
        choices=("strict", "block", "entropy"),
        doc="strict: token-wise rejection sampling; block: block verification; entropy: entropy-gated verify.",
    )
    entropy_threshold: float | None = option(
        None, gt=0, doc="Entropy (nats) gate for verify_method='entropy' (default 0.5)."
    )

    def _validate(self) -> None:
        if self.entropy_threshold is not None and self.verify_method != "entropy":
            raise ConfigError(
                f"{self.PATH}.entropy_threshold only applies when {self.PATH}.verify_method = 'entropy' "
                f"(got {self.verify_method!r})"
            )
        if self.verify_method == "entropy" and self.entropy_threshold is None:
            object.__setattr__(self, "entropy_threshold", self.DEFAULT_ENTROPY_THRESHOLD)


@dataclass(frozen=True)
class RlConfig(Section):
    """Defaults for reinforcement-learning rollout workers."""

    PATH: ClassVar[str] = "additional_config.rl_config"

    enabled: bool = option(False, doc="Run as an RL rollout engine.")
    batch_invariant: bool | None = option(
        None, doc="Bitwise batch-size-invariant results (default: on when enabled)."
    )
    sleep_level: int = option(
        1, choices=(1, 2), doc="Sleep mode level between rollouts: 1 offload, 2 discard weights."
    )

    def _validate(self) -> None:
        if self.batch_invariant is None:
            object.__setattr__(self, "batch_invariant", self.enabled)


@dataclass(frozen=True)
class DynamicSpecConfig(Section):
    """Adapt the number of speculative tokens to the observed acceptance rate."""

    PATH: ClassVar[str] = "additional_config.dynamic_spec_config"

    enabled: bool = option(False, doc="Adjust the speculative token count at run time.")
    min_num_speculative_tokens: int = option(0, ge=0, doc="Lower bound (0 lets speculation switch off).")
    max_num_speculative_tokens: int | None = option(
        None, ge=1, doc="Upper bound (default: the speculative config's num_speculative_tokens)."
    )
    acceptance_window: int = option(64, ge=1, doc="Steps over which the acceptance rate is averaged.")

    def _validate(self) -> None:
        high = self.max_num_speculative_tokens
        if high is not None and self.min_num_speculative_tokens > high:
            raise ConfigError(
                f"{self.PATH}.min_num_speculative_tokens = {self.min_num_speculative_tokens} must be <= "
                f"{self.PATH}.max_num_speculative_tokens = {high}"
            )


@dataclass(frozen=True)
class FinegrainedTPConfig(Section):
    """Tensor parallelism for single layer kinds, independent of the model's TP size (0 = off)."""

    PATH: ClassVar[str] = "additional_config.finegrained_tp_config"

    lmhead_tensor_parallel_size: int = option(0, ge=0, doc="TP size of the LM head.")
    embedding_tensor_parallel_size: int = option(0, ge=0, doc="TP size of the vocabulary embedding.")
    oproj_tensor_parallel_size: int = option(0, ge=0, doc="TP size of the attention output projection.")
    mlp_tensor_parallel_size: int = option(0, ge=0, doc="TP size of dense MLP layers.")

    @property
    def lmhead_tp_enable(self) -> bool:
        return self.lmhead_tensor_parallel_size > 1

    @property
    def embedding_tp_enable(self) -> bool:
        return self.embedding_tensor_parallel_size > 1

    @property
    def oproj_tp_enable(self) -> bool:
        return self.oproj_tensor_parallel_size > 1

    @property
    def mlp_tp_enable(self) -> bool:
        return self.mlp_tensor_parallel_size > 1


@dataclass(frozen=True)
class XliteGraphConfig(Section):
    """The xlite graph runtime."""

    PATH: ClassVar[str] = "additional_config.xlite_graph_config"

    enabled: bool = option(False, doc="Run decode through xlite graphs.")
    full_mode: bool = option(False, doc="Also run prefill through xlite (default: decode only).")

    def _validate(self) -> None:
        if self.full_mode and not self.enabled:
            raise ConfigError(f"{self.PATH}.full_mode = true requires {self.PATH}.enabled = true")


@dataclass(frozen=True)
class ProfilingChunkConfig(Section):
    """Size prefill chunks from a timing model fitted on profiled executions."""

    PATH: ClassVar[str] = "additional_config.profiling_chunk_config"

    enabled: bool = option(False, doc="Choose chunk sizes from measured step latency.")
    target_step_latency_ms: float = option(50.0, gt=0, doc="Step latency the chunk size aims for.")
    min_chunk_size: int = option(256, ge=16, doc="Smallest prefill chunk in tokens.")
    max_chunk_size: int | None = option(None, ge=16, doc="Largest chunk (default: max_num_batched_tokens).")

    def _validate(self) -> None:
        if self.max_chunk_size is not None and self.min_chunk_size > self.max_chunk_size:
            raise ConfigError(
                f"{self.PATH}.min_chunk_size = {self.min_chunk_size} must be <= "
                f"{self.PATH}.max_chunk_size = {self.max_chunk_size}"
            )


@dataclass(frozen=True)
class BatchJobSchedConfig(Section):
    """Throughput-oriented scheduling of offline batch jobs."""

    PATH: ClassVar[str] = "additional_config.batch_job_sched_config"

    enabled: bool = option(False, doc="Group requests of batch jobs before scheduling them.")
    max_batch_wait_ms: float = option(10.0, ge=0, doc="Longest a request waits for its batch to fill.")
    max_jobs_per_batch: int = option(256, ge=1, doc="Requests grouped into one batch at most.")


@dataclass(frozen=True)
class ShortRequestFirstConfig(Section):
    """Schedule short prompts first, with a starvation guard for long ones."""

    PATH: ClassVar[str] = "additional_config.short_request_first_config"

    enabled: bool = option(False, doc="Order waiting requests by prompt length.")
    short_prompt_threshold: int = option(1024, ge=1, doc="Prompts up to this many tokens count as short.")
    max_wait_s: float = option(30.0, gt=0, doc="A long request waiting this long is scheduled next.")


@dataclass(frozen=True)
class DyntraLBConfig(Section):
    """Dynamic request migration between data-parallel engine cores."""

    PATH: ClassVar[str] = "additional_config.dyntra_lb_config"

    enabled: bool = option(False, doc="Balance running requests across DP ranks.")
    balance_interval: int = option(16, ge=1, doc="Engine steps between balancing rounds.")
    imbalance_threshold: float = option(1.2, ge=1.0, doc="Balance when max/mean rank load exceeds this.")
    diagnostics: bool = option(False, doc="Log per-rank loads and the migrations chosen.")


@dataclass(frozen=True)
class SchedulerConfig(Section):
    """Scheduler implementation choices."""

    PATH: ClassVar[str] = "additional_config.scheduler_config"

    recompute_scheduler_enable: bool = option(
        False, doc="Use the recompute scheduler (preempt by recompute)."
    )
    scheduler_cls: str | None = option(
        None, doc="Qualified name 'package.module.Class' of a custom scheduler."
    )

    def _validate(self) -> None:
        if self.scheduler_cls is not None:
            module, _, name = self.scheduler_cls.rpartition(".")
            if not module or not name.isidentifier():
                raise ConfigError(
                    f"{self.PATH}.scheduler_cls = {self.scheduler_cls!r} must be a qualified name "
                    "like 'package.module.Class'"
                )
            if self.recompute_scheduler_enable:
                raise ConfigError(
                    f"{self.PATH}.scheduler_cls and {self.PATH}.recompute_scheduler_enable = true "
                    "both choose the scheduler; set only one"
                )


@dataclass(frozen=True)
class SparseKVOffloadConfig(Section):
    """Offload cold KV blocks of sparse-attention models to host memory."""

    PATH: ClassVar[str] = "additional_config.sparse_kv_offload_config"

    enabled: bool = option(False, doc="Keep only hot KV blocks on the device.")
    kv_cache_dtype: str = option("auto", choices=("auto", "c8"), doc="auto: model dtype; c8: int8 KV cache.")
    offload_ratio: float = option(0.5, gt=0, le=1, doc="Fraction of KV blocks kept in host memory.")
    host_buffer_gb: float = option(8.0, gt=0, doc="Host memory reserved for offloaded blocks (GiB).")
