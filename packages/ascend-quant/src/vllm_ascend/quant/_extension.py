"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.extensions import ExtensionDescriptor
from vllm_ascend.quant._version import __version__


def register() -> None:
    """Fill core's registries with lazy paths (nothing heavy is imported here)."""
    from vllm_ascend.core.registry import QUANT_METHODS

    QUANT_METHODS.register("ascend", "vllm_ascend.quant.description:QuantDescription")


EXTENSION = ExtensionDescriptor(
    name="quant",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("quant_methods",),
    register=register,
    description="ModelSlim quantization descriptions and schemes",
)
