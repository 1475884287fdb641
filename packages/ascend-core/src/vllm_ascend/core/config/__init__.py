"""Ascend configuration: ``AscendConfig`` (from vLLM's ``additional_config``) and its lifecycle."""

from vllm_ascend.core.config.ascend_config import (
    SIBLING_SECTIONS,
    AscendConfig,
    clear_ascend_config,
    get_ascend_config,
    get_section,
    init_ascend_config,
)
from vllm_ascend.core.config.schema import ConfigError, Section
from vllm_ascend.core.config.sections import UNSUPPORTED_OPTIONS, RejectionSamplerConfig, RlConfig

__all__ = [
    "SIBLING_SECTIONS",
    "UNSUPPORTED_OPTIONS",
    "AscendConfig",
    "ConfigError",
    "RejectionSamplerConfig",
    "RlConfig",
    "Section",
    "clear_ascend_config",
    "get_ascend_config",
    "get_section",
    "init_ascend_config",
]
