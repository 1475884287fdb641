"""``kv_transfer_config`` for the Mooncake connectors, validated once at config time.

Upstream vllm-ascend's ``kv_connector_extra_config`` keys are accepted where they are honoured
(``prefill`` / ``decode`` with ``tp_size`` and ``dp_size``, ``use_ascend_direct``); every other key is
refused by name with the allowed ones, so a config that carried over never silently loses a setting.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from vllm_ascend.core.sdk import ConfigError

#: Keys of ``kv_connector_extra_config`` this sibling honours, with what each does.
EXTRA_KEYS: dict[str, str] = {
    "prefill": "the prefill instances' parallelism {'tp_size': int, 'dp_size': int} (checked at handshake)",
    "decode": "the decode instances' parallelism {'tp_size': int, 'dp_size': int} (checked at handshake)",
    "use_ascend_direct": "bool: Mooncake's Ascend transport (true) or its TCP transport (false)",
    "side_channel_host": "address this instance's handshake socket binds and advertises",
    "abort_request_timeout": "seconds prefill keeps a finished request's blocks for decode to pull",
    "transfer_timeout": "seconds decode waits for a handshake or a layer-wise push before recomputing",
    "num_transfer_threads": "worker threads moving blocks (1 to 64)",
}
_PARALLEL_KEYS = ("tp_size", "dp_size")
ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass(frozen=True)
class ParallelShape:
    """A peer group's declared parallelism (``None``: not declared, taken from the handshake)."""

    tp_size: int | None = None
    dp_size: int | None = None


@dataclass(frozen=True)
class MooncakeTransferConfig:
    """What a Mooncake connector needs from ``kv_transfer_config`` (one instance's view)."""

    engine_id: str
    role: str
    kv_port: int
    side_channel_host: str
    use_ascend_direct: bool
    abort_request_timeout: float
    transfer_timeout: float
    num_transfer_threads: int
    load_failure_policy: str
    prefill: ParallelShape
    decode: ParallelShape

    @property
    def is_producer(self) -> bool:
        return self.role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self.role in ("kv_consumer", "kv_both")

    @property
    def protocol(self) -> str:
        """Mooncake's transport name."""
        return "ascend" if self.use_ascend_direct else "tcp"

    def side_channel_port(self, dp_rank: int, tp_rank: int, tp_size: int) -> int:
        """Each worker's handshake port: ``kv_port`` + its rank in the instance (DP-major)."""
        return self.kv_port + dp_rank * tp_size + tp_rank

    @classmethod
    def from_vllm_config(cls, vllm_config: Any, *, on_npu: bool | None = None) -> MooncakeTransferConfig:
        transfer = vllm_config.kv_transfer_config
        if transfer is None:
            raise ConfigError("kv_transfer_config must be set for the Mooncake connectors")
        if transfer.kv_role not in ROLES:
            raise ConfigError(
                f"kv_transfer_config.kv_role = {transfer.kv_role!r} is not supported; allowed: {', '.join(ROLES)}"
            )
        port = transfer.kv_port
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
            raise ConfigError(
                f"kv_transfer_config.kv_port must be an integer from 1024 to 65535, got {port!r}"
            )
        extra = dict(transfer.kv_connector_extra_config or {})
        unknown = sorted(set(extra) - set(EXTRA_KEYS))
        if unknown:
            raise ConfigError(
                f"kv_transfer_config.kv_connector_extra_config key(s) {', '.join(map(repr, unknown))} "
                f"not supported by vllm-ascend's {transfer.kv_connector}; allowed: {', '.join(EXTRA_KEYS)}"
            )
        if on_npu is None:
            from vllm_ascend.core.sdk import detect

            on_npu = detect().mode.value == "npu"
        direct = extra.get("use_ascend_direct", on_npu)
        if not isinstance(direct, bool):
            raise ConfigError(
                "kv_transfer_config.kv_connector_extra_config.use_ascend_direct must be true or false, "
                f"got {direct!r}"
            )
        host = extra.get("side_channel_host", os.environ.get("VLLM_HOST_IP") or "127.0.0.1")
        if not isinstance(host, str) or not host:
            raise ConfigError(
                f"kv_transfer_config.kv_connector_extra_config.side_channel_host must be a host name, got {host!r}"
            )
        return cls(
            engine_id=str(transfer.engine_id),
            role=transfer.kv_role,
            kv_port=port,
            side_channel_host=host,
            use_ascend_direct=direct,
            abort_request_timeout=_seconds(extra, "abort_request_timeout", 480.0),
            transfer_timeout=_seconds(extra, "transfer_timeout", 30.0),
            num_transfer_threads=_integer(extra, "num_transfer_threads", 4, 1, 64),
            load_failure_policy=transfer.kv_load_failure_policy,
            prefill=_parallel(extra, "prefill"),
            decode=_parallel(extra, "decode"),
        )


def _seconds(extra: dict[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(
            f"kv_transfer_config.kv_connector_extra_config.{key} must be a number of seconds above 0, got {value!r}"
        )
    return float(value)


def _integer(extra: dict[str, Any], key: str, default: int, low: int, high: int, path: str = "") -> int:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"kv_transfer_config.kv_connector_extra_config.{path}{key} must be an integer from {low} to "
            f"{high}, got {value!r}"
        )
    return value


def _parallel(extra: dict[str, Any], key: str) -> ParallelShape:
    raw = extra.get(key)
    if raw is None:
        return ParallelShape()
    if not isinstance(raw, dict):
        raise ConfigError(
            f"kv_transfer_config.kv_connector_extra_config.{key} must be a mapping with keys "
            f"{', '.join(_PARALLEL_KEYS)}, got {raw!r}"
        )
    unknown = sorted(set(raw) - set(_PARALLEL_KEYS))
    if unknown:
        raise ConfigError(
            f"kv_transfer_config.kv_connector_extra_config.{key} key(s) {', '.join(map(repr, unknown))} not "
            f"supported; allowed: {', '.join(_PARALLEL_KEYS)}"
        )
    values = {k: _integer(raw, k, 1, 1, 65536, f"{key}.") for k in _PARALLEL_KEYS if k in raw}
    return ParallelShape(**values)
