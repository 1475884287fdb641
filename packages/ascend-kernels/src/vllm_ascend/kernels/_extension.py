"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.sdk import ExtensionDescriptor
from vllm_ascend.kernels._version import __version__


def register() -> None:
    """Fill core's registries with lazy paths (nothing heavy is imported here)."""
    from vllm_ascend.core.sdk import CLI_COMMANDS, DEVICE_ADAPTORS

    CLI_COMMANDS.register("warmup", "vllm_ascend.kernels.cli:WARMUP_COMMAND")
    DEVICE_ADAPTORS.register("reference", "vllm_ascend.kernels.device.reference:ReferenceDeviceAdaptor")
    DEVICE_ADAPTORS.register("a2a3", "vllm_ascend.kernels.device.npu:A2A3DeviceAdaptor")
    DEVICE_ADAPTORS.register("a5", "vllm_ascend.kernels.device.a5:A5DeviceAdaptor")


EXTENSION = ExtensionDescriptor(
    name="kernels",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("cli_commands", "device_adaptors"),
    register=register,
    description="Device ops: the family adaptors (torch reference, torch_npu mappings) and Triton kernels with torch "
    "references; `vllm-ascend warmup` builds their compile cache ahead",
)
