"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.sdk import ExtensionDescriptor
from vllm_ascend.quant._version import __version__


def register() -> None:
    """Register ``--quantization ascend`` and ``vllm-ascend quantize`` as lazy paths (nothing heavy imported)."""
    from vllm_ascend.core.sdk import CLI_COMMANDS, QUANT_METHODS

    QUANT_METHODS.register("ascend", "vllm_ascend.quant.config:AscendQuantConfig")
    CLI_COMMANDS.register("quantize", "vllm_ascend.quant.cli:QUANTIZE_COMMAND")


EXTENSION = ExtensionDescriptor(
    name="quant",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("quant_methods", "cli_commands"),
    register=register,
    description="ModelSlim quantized checkpoints (--quantization ascend) and the quantize exporter",
)
