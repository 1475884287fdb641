"""``AscendConfig``: every Ascend option of vLLM's ``additional_config``, and its process-wide instance.

Built once per process by ``NPUPlatform.check_and_update_config`` through
:func:`init_ascend_config`; read everywhere else with :func:`get_ascend_config`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from vllm_ascend.core.config.schema import ConfigError, Section, field_meta, option
from vllm_ascend.core.config.sections import (
    AscendCompilationConfig,
    BatchJobSchedConfig,
    DynamicSpecConfig,
    DyntraLBConfig,
    EplbConfig,
    FinegrainedTPConfig,
    ProfilingChunkConfig,
    RejectionSamplerConfig,
    RlConfig,
    SchedulerConfig,
    ShortRequestFirstConfig,
    SparseKVOffloadConfig,
    XliteGraphConfig,
)
from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.family import current_family
from vllm_ascend.core.logger import init_logger

logger = init_logger(__name__)

_A2, _A3, _A5 = AscendDeviceType.A2, AscendDeviceType.A3, AscendDeviceType.A5
MEGAMOE_FAMILIES = (_A3, _A5)
# Hierarchical MC2 (intra-node HCCS, inter-node RoCE) exists for A2 clusters; A3/A5 supernodes are full mesh.
# 310P has no MC2 at all.
MC2_ALGORITHM_FAMILIES = {"auto": (_A2, _A3, _A5), "fullmesh": (_A2, _A3, _A5), "hierarchy": (_A2,)}


def _names(families: tuple[AscendDeviceType, ...]) -> str:
    return ", ".join(f.value for f in families)


@dataclass(frozen=True)
class AscendConfig(Section):
    """All Ascend-specific options; ``AscendConfig.from_dict(additional_config)`` validates them."""

    PATH: ClassVar[str] = "additional_config"

    ascend_compilation_config: AscendCompilationConfig = field(
        default_factory=AscendCompilationConfig, metadata=field_meta("Graph compilation and fusion.")
    )
    eplb_config: EplbConfig = field(
        default_factory=EplbConfig, metadata=field_meta("Expert-parallel load balancing.")
    )
    rejection_sampler_config: RejectionSamplerConfig = field(
        default_factory=RejectionSamplerConfig, metadata=field_meta("Speculative verification.")
    )
    rl_config: RlConfig = field(default_factory=RlConfig, metadata=field_meta("RL rollout defaults."))
    dynamic_spec_config: DynamicSpecConfig = field(
        default_factory=DynamicSpecConfig, metadata=field_meta("Dynamic speculation.")
    )
    finegrained_tp_config: FinegrainedTPConfig = field(
        default_factory=FinegrainedTPConfig, metadata=field_meta("Per-layer TP sizes.")
    )
    xlite_graph_config: XliteGraphConfig = field(
        default_factory=XliteGraphConfig, metadata=field_meta("xlite graph runtime.")
    )
    profiling_chunk_config: ProfilingChunkConfig = field(
        default_factory=ProfilingChunkConfig, metadata=field_meta("Latency-model prefill chunking.")
    )
    batch_job_sched_config: BatchJobSchedConfig = field(
        default_factory=BatchJobSchedConfig, metadata=field_meta("Batch-job scheduling.")
    )
    short_request_first_config: ShortRequestFirstConfig = field(
        default_factory=ShortRequestFirstConfig, metadata=field_meta("Short-request-first scheduling.")
    )
    dyntra_lb_config: DyntraLBConfig = field(
        default_factory=DyntraLBConfig, metadata=field_meta("DP request balancing.")
    )
    scheduler_config: SchedulerConfig = field(
        default_factory=SchedulerConfig, metadata=field_meta("Scheduler choice.")
    )
    sparse_kv_offload_config: SparseKVOffloadConfig = field(
        default_factory=SparseKVOffloadConfig, metadata=field_meta("Sparse KV offload.")
    )
    enable_shared_expert_dp: bool = option(False, doc="Run shared experts data-parallel instead of TP.")
    multistream_overlap_shared_expert: bool = option(
        False, doc="Overlap shared experts with routed experts on a second stream."
    )
    enable_cpu_binding: bool = option(False, doc="Bind each worker to CPUs close to its NPU.")
    enable_kv_nz: bool = option(False, doc="Keep the KV cache in FRACTAL_NZ layout.")
    mc2_comm_algorithm: str = option(
        "auto", choices=tuple(MC2_ALGORITHM_FAMILIES), doc="MC2 dispatch/combine algorithm."
    )
    enable_megamoe: bool = option(False, doc="Fused dispatch+expert+combine MoE kernel (A3/A5, EP only).")
    dump_config_path: str | None = option(
        None, doc="Write the effective config as JSON to this file at start."
    )

    def _validate(self) -> None:
        p = self.PATH
        if self.xlite_graph_config.enabled and self.ascend_compilation_config.enable_npugraph_ex:
            raise ConfigError(
                f"{p}.xlite_graph_config.enabled = true conflicts with "
                f"{p}.ascend_compilation_config.enable_npugraph_ex = true (two graph runtimes); enable one"
            )
        if (
            self.sparse_kv_offload_config.enabled
            and self.sparse_kv_offload_config.kv_cache_dtype == "c8"
            and self.enable_kv_nz
        ):
            raise ConfigError(
                f"{p}.sparse_kv_offload_config.kv_cache_dtype = 'c8' is incompatible with "
                f"{p}.enable_kv_nz = true (C8 offload copies ND blocks); disable one"
            )
        if self.scheduler_config.scheduler_cls is not None and self.dyntra_lb_config.enabled:
            raise ConfigError(
                f"{p}.scheduler_config.scheduler_cls conflicts with {p}.dyntra_lb_config.enabled = true "
                "(DyntraLB brings its own scheduler); set only one"
            )
        if self.short_request_first_config.enabled and self.batch_job_sched_config.enabled:
            raise ConfigError(
                f"{p}.short_request_first_config.enabled = true conflicts with "
                f"{p}.batch_job_sched_config.enabled = true (both reorder the waiting queue); enable one"
            )

    # ---- construction, serialisation -------------------------------------------------------

    @classmethod
    def from_json(cls, text: str) -> AscendConfig:
        return cls.from_dict(_parse_json(text))

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def dump(self, path: str | os.PathLike[str]) -> Path:
        """Write the config as JSON (parent directories created); returns the path written."""
        target = Path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(self.to_json() + "\n", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"{self.PATH}.dump_config_path = {str(path)!r} cannot be written: {exc}"
            ) from exc
        return target

    # ---- checks against vLLM's config and the device ---------------------------------------

    def derive_and_validate(self, vllm_config: Any = None, family: Any = None) -> AscendConfig:
        """Check options against vLLM's parallel/scheduler/speculative config and the device family.

        Returns the config with derived values filled in (defaults that depend on vLLM's config);
        raises :class:`ConfigError` naming both sides of any conflict.
        """
        fam = AscendDeviceType.parse(family) if family is not None else None
        derived = self._check_family(fam)
        if vllm_config is None:
            return derived
        return derived._check_vllm(vllm_config)

    def _check_family(self, fam: AscendDeviceType | None) -> AscendConfig:
        p = self.PATH
        if fam is None:
            return self
        if fam not in MC2_ALGORITHM_FAMILIES[self.mc2_comm_algorithm] and self.mc2_comm_algorithm != "auto":
            available = [a for a, fams in MC2_ALGORITHM_FAMILIES.items() if fam in fams]
            raise ConfigError(
                f"{p}.mc2_comm_algorithm = {self.mc2_comm_algorithm!r} is not available on {fam.value}; "
                f"allowed on {fam.value}: {', '.join(repr(a) for a in available) or 'auto (MC2 is not used)'}"
            )
        if self.enable_megamoe and fam not in MEGAMOE_FAMILIES:
            raise ConfigError(
                f"{p}.enable_megamoe = true is not supported on {fam.value}; supported families: "
                f"{_names(MEGAMOE_FAMILIES)}"
            )
        return self

    def _check_vllm(self, vllm_config: Any) -> AscendConfig:
        p = self.PATH
        parallel = vllm_config.parallel_config
        ep = bool(getattr(parallel, "enable_expert_parallel", False))
        tp = int(getattr(parallel, "tensor_parallel_size", 1))
        dp = int(getattr(parallel, "data_parallel_size", 1))
        spec = getattr(vllm_config, "speculative_config", None)
        num_spec = getattr(spec, "num_speculative_tokens", None) if spec is not None else None
        sched = getattr(vllm_config, "scheduler_config", None)
        max_batched = getattr(sched, "max_num_batched_tokens", None)
        need_ep = "requires expert parallelism (parallel_config.enable_expert_parallel = True, --enable-expert-parallel)"

        eplb = self.eplb_config
        if eplb.enabled and not ep:
            key = (
                "dynamic_eplb"
                if eplb.dynamic_eplb
                else ("expert_map_path" if eplb.expert_map_path is not None else "num_redundant_experts")
            )
            raise ConfigError(f"{p}.eplb_config.{key} {need_ep}")
        if self.mc2_comm_algorithm != "auto" and not ep:
            raise ConfigError(f"{p}.mc2_comm_algorithm = {self.mc2_comm_algorithm!r} {need_ep}")
        if self.enable_megamoe and not ep:
            raise ConfigError(f"{p}.enable_megamoe = true {need_ep}")

        world = tp * dp
        ftp = self.finegrained_tp_config
        for key in ("lmhead", "embedding", "oproj", "mlp"):
            size = getattr(ftp, f"{key}_tensor_parallel_size")
            if size and world % size:
                raise ConfigError(
                    f"{p}.finegrained_tp_config.{key}_tensor_parallel_size = {size} must divide the world size "
                    f"tensor_parallel_size × data_parallel_size = {tp} × {dp} = {world}"
                )

        if self.dyntra_lb_config.enabled and dp < 2:
            raise ConfigError(
                f"{p}.dyntra_lb_config.enabled = true requires data_parallel_size >= 2 (got {dp})"
            )
        if self.enable_shared_expert_dp and tp < 2:
            raise ConfigError(
                f"{p}.enable_shared_expert_dp = true requires tensor_parallel_size >= 2 (got {tp})"
            )

        if self.rejection_sampler_config.verify_method != "strict" and spec is None:
            raise ConfigError(
                f"{p}.rejection_sampler_config.verify_method = {self.rejection_sampler_config.verify_method!r} "
                "requires speculative decoding (vLLM speculative_config)"
            )
        dyn = self.dynamic_spec_config
        changes: dict[str, Any] = {}
        if dyn.enabled:
            if spec is None or num_spec is None:
                raise ConfigError(
                    f"{p}.dynamic_spec_config.enabled = true requires speculative decoding (vLLM speculative_config)"
                )
            if dyn.max_num_speculative_tokens is None:
                changes["dynamic_spec_config"] = dyn.replace(
                    max_num_speculative_tokens=max(num_spec, dyn.min_num_speculative_tokens, 1)
                )
            elif dyn.max_num_speculative_tokens > num_spec:
                raise ConfigError(
                    f"{p}.dynamic_spec_config.max_num_speculative_tokens = {dyn.max_num_speculative_tokens} "
                    f"must be <= speculative_config.num_speculative_tokens = {num_spec}"
                )

        if max_batched is not None:
            for i, point in enumerate(self.ascend_compilation_config.compile_ranges_split_points):
                if point >= max_batched:
                    raise ConfigError(
                        f"{p}.ascend_compilation_config.compile_ranges_split_points[{i}] = {point} must be < "
                        f"scheduler_config.max_num_batched_tokens = {max_batched}"
                    )
            chunk = self.profiling_chunk_config
            if chunk.max_chunk_size is not None and chunk.max_chunk_size > max_batched:
                raise ConfigError(
                    f"{p}.profiling_chunk_config.max_chunk_size = {chunk.max_chunk_size} must be <= "
                    f"scheduler_config.max_num_batched_tokens = {max_batched}"
                )
            if chunk.enabled and chunk.max_chunk_size is None:
                changes["profiling_chunk_config"] = chunk.replace(
                    max_chunk_size=max(max_batched, chunk.min_chunk_size)
                )
        return self.replace(**changes) if changes else self


def supports_megamoe(config: AscendConfig, family: Any, expert_parallel: bool) -> bool:
    """Whether the fused MegaMoE path may run: asked for, on an A3/A5 device, with EP."""
    return config.enable_megamoe and expert_parallel and AscendDeviceType.parse(family) in MEGAMOE_FAMILIES


_config: AscendConfig | None = None


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"additional_config is not valid JSON: {exc}") from exc


def _additional_config_of(source: Any) -> Mapping[str, Any] | None:
    if source is None or isinstance(source, Mapping):
        return source
    if isinstance(source, str):
        return _parse_json(source)
    if hasattr(source, "additional_config"):
        value = source.additional_config
        if value is None or isinstance(value, Mapping):
            return value
        raise ConfigError(
            f"additional_config must be a JSON object (dict), got {type(value).__name__} {value!r}"
        )
    raise ConfigError(
        f"init_ascend_config expects a vLLM VllmConfig, a dict or a JSON string, got {type(source).__name__}"
    )


def init_ascend_config(source: Any = None, family: Any = None) -> AscendConfig:
    """Build, validate and install the process-wide :class:`AscendConfig`.

    ``source`` is a vLLM ``VllmConfig`` (its ``additional_config`` is read and its parallel,
    scheduler and speculative settings are checked), a plain dict, a JSON string, or None.
    ``family`` defaults to the running device's family where it is known.
    """
    global _config
    data = _additional_config_of(source)
    vllm_config = source if hasattr(source, "parallel_config") else None
    config = AscendConfig.from_dict(data).derive_and_validate(
        vllm_config, family if family is not None else current_family()
    )
    if config.dump_config_path is not None:
        written = config.dump(config.dump_config_path)
        logger.info("Ascend config written to %s", written)
    _config = config
    return config


def _current_vllm_config() -> Any:
    try:
        from vllm.config.vllm import get_current_vllm_config_or_none
    except ImportError:
        return None
    return get_current_vllm_config_or_none()


def get_ascend_config() -> AscendConfig:
    """The process-wide config.

    In a process where the platform hook did not run (a vLLM worker process), it is built on
    first use from vLLM's current config (set while vLLM constructs the model).
    """
    if _config is None:
        current = _current_vllm_config()
        if current is not None:
            return init_ascend_config(current)
        raise RuntimeError(
            "Ascend config is not initialised in this process: call init_ascend_config(vllm_config) "
            "(NPUPlatform.check_and_update_config does this)"
        )
    return _config


def clear_ascend_config() -> None:
    """Forget the process-wide config (tests; re-initialisation with another vLLM config)."""
    global _config
    _config = None
