"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.sdk import ExtensionDescriptor
from vllm_ascend.runner._version import __version__


def register() -> None:
    """Fill core's registries with lazy paths (nothing heavy is imported here)."""
    from vllm_ascend.core.sdk import CLI_COMMANDS, CONFIG_SECTIONS, WEIGHT_TRANSFER_ENGINES, WORKERS

    WORKERS.register("default", "vllm_ascend.runner.worker:NPUWorker")
    for backend in ("hccl", "gloo"):  # the device's collective backend: NPUs, the reference device
        WEIGHT_TRANSFER_ENGINES.register(
            backend, "vllm_ascend.runner.weight_transfer:CollectiveWeightTransferEngine"
        )
    CLI_COMMANDS.register("demo", "vllm_ascend.runner.demo:DEMO_COMMAND")
    CLI_COMMANDS.register("serve", "vllm_ascend.runner.serve:SERVE_COMMAND")
    CONFIG_SECTIONS.register(
        "ascend_compilation_config",
        "vllm_ascend.runner.compilation.config:validate_ascend_compilation_config",
    )


EXTENSION = ExtensionDescriptor(
    name="runner",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("workers", "cli_commands", "config_sections", "weight_transfer_engines"),
    register=register,
    description=(
        "NPU worker, model runner, attention backend, custom ops, sampler, graph fusion passes "
        "(additional_config.ascend_compilation_config); weight updates from a trainer (hccl / gloo); "
        "`vllm-ascend demo` and `serve`"
    ),
)
