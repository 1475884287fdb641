"""``additional_config.ascend_compilation_config``: which Ascend graph passes run when vLLM compiles."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from vllm_ascend.core.sdk import Section, option

PATH = "additional_config.ascend_compilation_config"
#: The name core's ``get_section`` reads it by.
SECTION = "ascend_compilation_config"


@dataclass(frozen=True)
class AscendCompilationConfig(Section):
    """Graph pass switches, read by :class:`GraphFusionPassManager` through core's
    ``get_section("ascend_compilation_config")``; they act only where vLLM compiles the model
    (``compilation_config.mode`` VLLM_COMPILE)."""

    PATH: ClassVar[str] = PATH

    enable_graph_fusion: bool = option(
        True, doc="Master switch: false runs none of the Ascend graph passes below."
    )
    fuse_norm_quant: bool = option(
        True,
        doc="add_rms_norm / rms_norm followed by a static or dynamic int8 quant -> one fused norm-quant op.",
    )
    fuse_qknorm_rope: bool = option(
        True, doc="Per-head RMSNorm of q and k followed by rotary embedding -> one qk_rmsnorm_rope op."
    )
    fuse_muls_add: bool = option(True, doc="x * scalar + y (same shape and dtype) -> one muls_add op.")
    fuse_act_quant: bool = option(
        True, doc="swiglu followed by a static or dynamic int8 quant -> one fused activation-quant op."
    )
    eliminate_noops: bool = option(
        True, doc="Remove view/reshape/slice nodes that keep their input's shape; collapse reshape chains."
    )


def validate_ascend_compilation_config(
    raw: Mapping[str, Any], vllm_config: Any = None
) -> AscendCompilationConfig:
    """Core's ``CONFIG_SECTIONS`` validator: the typed switches (unknown keys and non-bools refused)."""
    return AscendCompilationConfig.from_dict(raw)
