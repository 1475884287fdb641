"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.sdk import ExtensionDescriptor
from vllm_ascend.kernels._version import __version__


def register() -> None:
    """Fill core's registries with lazy paths (nothing heavy is imported here)."""
    from vllm_ascend.core.sdk import CLI_COMMANDS

    CLI_COMMANDS.register("warmup", "vllm_ascend.kernels.cli:WARMUP_COMMAND")


EXTENSION = ExtensionDescriptor(
    name="kernels",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("cli_commands",),
    register=register,
    description="Triton kernels with torch references; `vllm-ascend warmup` builds their compile cache ahead",
)
