"""Ascend configuration: ``AscendConfig`` (from vLLM's ``additional_config``) and its lifecycle."""

from vllm_ascend.core.config.ascend_config import (
    AscendConfig,
    clear_ascend_config,
    get_ascend_config,
    init_ascend_config,
    supports_megamoe,
)
from vllm_ascend.core.config.schema import ConfigError, Section
from vllm_ascend.core.config.sections import (
    EPLB_POLICIES,
    AscendCompilationConfig,
    AscendFusionConfig,
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

__all__ = [
    "EPLB_POLICIES",
    "AscendCompilationConfig",
    "AscendConfig",
    "AscendFusionConfig",
    "BatchJobSchedConfig",
    "ConfigError",
    "DynamicSpecConfig",
    "DyntraLBConfig",
    "EplbConfig",
    "FinegrainedTPConfig",
    "ProfilingChunkConfig",
    "RejectionSamplerConfig",
    "RlConfig",
    "SchedulerConfig",
    "Section",
    "ShortRequestFirstConfig",
    "SparseKVOffloadConfig",
    "XliteGraphConfig",
    "clear_ascend_config",
    "get_ascend_config",
    "init_ascend_config",
    "supports_megamoe",
]
