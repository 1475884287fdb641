"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.extensions import ExtensionDescriptor
from vllm_ascend.eplb._version import __version__


def register() -> None:
    """Register the ``eplb_config`` validator (a lazy path) and arrange for vLLM's ``MoERunner`` to be
    replaced where our platform is active (deferred until vLLM imports it)."""
    from vllm_ascend.core.registry import CONFIG_SECTIONS
    from vllm_ascend.eplb.moe import register_moe_runner

    CONFIG_SECTIONS.register("eplb_config", "vllm_ascend.eplb.config:validate_eplb_config")
    register_moe_runner()


EXTENSION = ExtensionDescriptor(
    name="eplb",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("config_sections",),
    register=register,
    description="additional_config.eplb_config, EPLB policies and the reference MoE runner with EPLB",
)
