"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.sdk import ExtensionDescriptor
from vllm_ascend.eplb._version import __version__


def register() -> None:
    """Register the ``eplb_config`` validator and the expert-placement schedule (lazy paths)."""
    from vllm_ascend.core.sdk import CONFIG_SECTIONS, MOE_PLACEMENTS

    CONFIG_SECTIONS.register("eplb_config", "vllm_ascend.eplb.config:validate_eplb_config")
    MOE_PLACEMENTS.register("default", "vllm_ascend.eplb.schedule:schedule_for")


EXTENSION = ExtensionDescriptor(
    name="eplb",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("config_sections", "moe_placements"),
    register=register,
    description="additional_config.eplb_config, EPLB policies and the expert-placement schedule of MoE layers",
)
