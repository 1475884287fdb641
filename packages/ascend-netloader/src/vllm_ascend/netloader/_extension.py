"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.sdk import ExtensionDescriptor
from vllm_ascend.netloader._version import __version__


def register() -> None:
    """Fill core's registries with lazy paths (nothing heavy is imported here)."""
    from vllm_ascend.core.sdk import CLI_COMMANDS, MODEL_LOADERS

    MODEL_LOADERS.register("netloader", "vllm_ascend.netloader.loader:NetLoader")
    CLI_COMMANDS.register("netloader-seed", "vllm_ascend.netloader.cli:SEED_COMMAND")


EXTENSION = ExtensionDescriptor(
    name="netloader",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("model_loaders", "cli_commands"),
    register=register,
    description="Network model loading from peer instances",
)
