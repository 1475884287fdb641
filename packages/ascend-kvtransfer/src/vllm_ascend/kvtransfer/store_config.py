"""``kv_transfer_config`` of ``AscendStoreConnector``, validated once at config time.

The connector's own keys are below; the pool's (master address, protocol, segment sizes, timeouts) go to
:meth:`~vllm_ascend.kvtransfer.pool.PoolConfig.from_extra_config`, which refuses unknown ones by name. Upstream
vllm-ascend's keys carry over where they mean something here; a Mooncake config file named by
``MOONCAKE_CONFIG_PATH`` (upstream's way) fills pool fields the extra config leaves out.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from vllm_ascend.core.sdk import ConfigError
from vllm_ascend.kvtransfer.pool import PoolConfig

#: Keys of ``kv_connector_extra_config`` the connector itself honours, with what each does.
STORE_KEYS: dict[str, str] = {
    "backend": "the pool's store: 'mooncake' (Mooncake Store)",
    "load_async": "bool (default true): load pool hits while other requests run; false: before the step",
    "consumer_is_to_put": "bool (default false): a kv_consumer also puts its blocks into the pool",
    "consumer_is_to_load": "bool (default true): a kv_consumer loads pool hits",
    "pool_namespace": "str: share blocks only among instances naming the same namespace (default: from the model)",
    "lookup_rpc_port": "accepted for upstream configs; unused (the scheduler asks the pool directly)",
    "prefill_pp_size": "1 only (pipeline parallel prefill is not served by the pool connector)",
    "prefill_pp_layer_partition": "unset only",
}
BACKENDS = ("mooncake",)
ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass(frozen=True)
class StoreConnectorConfig:
    role: str
    load_async: bool
    saves: bool
    loads: bool
    namespace: str | None
    pool: PoolConfig

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> StoreConnectorConfig:
        transfer = vllm_config.kv_transfer_config
        if transfer is None:
            raise ConfigError("kv_transfer_config must be set for AscendStoreConnector")
        role = transfer.kv_role or "kv_both"
        if role not in ROLES:
            raise ConfigError(
                f"kv_transfer_config.kv_role = {role!r} is not supported by AscendStoreConnector; "
                f"allowed: {', '.join(ROLES)}"
            )
        extra = dict(transfer.kv_connector_extra_config or {})
        own = {key: extra.pop(key) for key in list(extra) if key in STORE_KEYS}
        backend = own.get("backend", "mooncake")
        if backend not in BACKENDS:
            raise ConfigError(
                f"kv_connector_extra_config.backend = {backend!r} is not supported by vllm-ascend; "
                f"supported: {', '.join(BACKENDS)}"
            )
        if (
            own.get("prefill_pp_size", 1) not in (1, None)
            or own.get("prefill_pp_layer_partition") is not None
        ):
            raise ConfigError(
                "kv_connector_extra_config.prefill_pp_size / prefill_pp_layer_partition: pipeline-parallel "
                "prefill is not supported by vllm-ascend's AscendStoreConnector; supported: prefill_pp_size 1"
            )
        flags = {}
        for key, default in (
            ("load_async", True),
            ("consumer_is_to_put", False),
            ("consumer_is_to_load", True),
        ):
            value = own.get(key, default)
            if not isinstance(value, bool):
                raise ConfigError(f"kv_connector_extra_config.{key} must be true or false, got {value!r}")
            flags[key] = value
        namespace = own.get("pool_namespace")
        if namespace is not None and (not isinstance(namespace, str) or not namespace or "/" in namespace):
            raise ConfigError(
                f"kv_connector_extra_config.pool_namespace must be a non-empty string without '/', got {namespace!r}"
            )
        try:
            pool = PoolConfig.from_extra_config({**_mooncake_config_file(), **extra})
        except ConfigError as error:
            raise ConfigError(f"{error} (AscendStoreConnector's own keys: {', '.join(STORE_KEYS)})") from None
        consumer = role == "kv_consumer"
        return cls(
            role=role,
            load_async=flags["load_async"],
            saves=not consumer or flags["consumer_is_to_put"],
            loads=not consumer or flags["consumer_is_to_load"],
            namespace=namespace,
            pool=pool,
        )


def _mooncake_config_file() -> dict[str, Any]:
    """Upstream's ``MOONCAKE_CONFIG_PATH`` JSON (pool fields), or nothing when unset."""
    path = os.environ.get("MOONCAKE_CONFIG_PATH")
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as error:
        raise ConfigError(f"MOONCAKE_CONFIG_PATH={path!r}: cannot read a JSON object ({error})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"MOONCAKE_CONFIG_PATH={path!r}: expected a JSON object, got {type(data).__name__}")
    if not data.get("device_name"):
        data.pop("device_name", None)  # upstream's files name no device for TCP
    return data
