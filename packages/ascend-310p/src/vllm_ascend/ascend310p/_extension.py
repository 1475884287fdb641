"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.ascend310p._version import __version__
from vllm_ascend.core.sdk import ExtensionDescriptor


def register() -> None:
    """Fill core's registries with lazy paths (nothing heavy is imported here)."""
    from vllm_ascend.core.sdk import DEVICE_OVERLAYS, WORKERS

    DEVICE_OVERLAYS.register("310p", "vllm_ascend.ascend310p.overlay:OVERLAY")
    WORKERS.register("310p", "vllm_ascend.ascend310p.worker:NPUWorker310")


EXTENSION = ExtensionDescriptor(
    name="ascend310p",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("device_overlays", "workers"),
    register=register,
    description=(
        "Atlas 310P: profile, NPU and reference adaptors (attention ops, host-RNG random_fill), and the 310P "
        "worker naming its attention backend (the model runner is the runner's V2, or V1 where vLLM falls back)"
    ),
)
