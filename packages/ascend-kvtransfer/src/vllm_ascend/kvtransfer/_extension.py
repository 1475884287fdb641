"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.sdk import ExtensionDescriptor
from vllm_ascend.kvtransfer._version import __version__


def register() -> None:
    """Fill core's registries with lazy paths (nothing heavy is imported here)."""
    from vllm_ascend.core.sdk import CLI_COMMANDS, DOCTOR_PROBES, KV_CONNECTORS, KV_OFFLOAD_SPECS

    KV_CONNECTORS.register("MooncakeConnectorV1", "vllm_ascend.kvtransfer.connector:MooncakeConnectorV1")
    KV_CONNECTORS.register(
        "MooncakeLayerwiseConnector", "vllm_ascend.kvtransfer.connector:MooncakeLayerwiseConnector"
    )
    KV_CONNECTORS.register(
        "AscendStoreConnector", "vllm_ascend.kvtransfer.store_connector:AscendStoreConnector"
    )
    KV_OFFLOAD_SPECS.register("NPUOffloadingSpec", "vllm_ascend.kvtransfer.offload:NPUOffloadingSpec")
    CLI_COMMANDS.register("pd-proxy", "vllm_ascend.kvtransfer.proxy_cli:PD_PROXY_COMMAND")
    CLI_COMMANDS.register("kv-pool", "vllm_ascend.kvtransfer.pool_cli:KV_POOL_COMMAND")
    DOCTOR_PROBES.register("kvtransfer", "vllm_ascend.kvtransfer.engine:probe")


EXTENSION = ExtensionDescriptor(
    name="kvtransfer",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("kv_connectors", "kv_offload_specs", "cli_commands", "doctor_probes"),
    register=register,
    description="KV transfer over Mooncake (P/D disaggregation, a KV pool in Mooncake Store), KV offload to host",
)
