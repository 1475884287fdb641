"""The Mooncake transfer engine, as the connectors use it: one per worker process.

Mooncake is the real engine on every host (its TCP transport off Ascend, its Ascend transport on
Ascend hosts); this module only imports it with a clear hint, starts it in ``P2PHANDSHAKE`` mode (no
metadata server: peers are addressed as ``host:rpc_port``), registers memory and moves byte ranges.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any

#: pause before the one retry of a failed batch transfer
RETRY_DELAY_S = 0.05

INSTALL_HINT = (
    "install vllm-ascend[kvtransfer] (Mooncake's TCP/RDMA build) or vllm-ascend[kvtransfer-npu] on Ascend "
    "hosts; Mooncake also needs Debian's libibverbs1 (apt-get install libibverbs1)"
)
DISTRIBUTIONS = (
    "mooncake-transfer-engine-npu",
    "mooncake-transfer-engine-non-cuda",
    "mooncake-transfer-engine",
)


class TransferError(RuntimeError):
    """A Mooncake call failed; the message names the call, the peer and the return code."""


def load_engine_class() -> type:
    """Mooncake's ``TransferEngine`` class, or an ``ImportError`` saying what to install."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise ImportError(f"the Mooncake transfer engine is not importable ({exc}); {INSTALL_HINT}") from exc
    return TransferEngine


def installed_distribution() -> tuple[str, str] | None:
    """(distribution, version) of the installed Mooncake build, if any."""
    for dist in DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


@dataclass(frozen=True)
class Transfer:
    """Byte ranges to move between this process and one peer, as three equal-length lists."""

    local: list[int]
    remote: list[int]
    lengths: list[int]

    def __post_init__(self) -> None:
        if not len(self.local) == len(self.remote) == len(self.lengths):
            raise ValueError("a transfer needs as many local and remote addresses as lengths")

    @property
    def nbytes(self) -> int:
        return sum(self.lengths)


class MooncakeEngine:
    """One initialized Mooncake engine: registered regions and synchronous batch reads/writes."""

    def __init__(self, host: str, protocol: str) -> None:
        engine_cls = load_engine_class()
        self.host, self.protocol = host, protocol
        self._engine: Any = engine_cls()
        rc = self._engine.initialize(host, "P2PHANDSHAKE", protocol, "")
        if rc != 0:
            raise TransferError(
                f"Mooncake TransferEngine.initialize({host!r}, 'P2PHANDSHAKE', {protocol!r}) returned {rc}"
            )
        self.rpc_port = int(self._engine.get_rpc_port())
        self._registered: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    @property
    def session_id(self) -> str:
        """How a peer names this engine."""
        return f"{self.host}:{self.rpc_port}"

    def register(self, address: int, nbytes: int) -> None:
        """Register ``nbytes`` at ``address`` for remote reads and writes (once per range)."""
        with self._lock:
            if (address, nbytes) in self._registered:
                return
            rc = self._engine.register_memory(address, nbytes)
            if rc != 0:
                raise TransferError(f"Mooncake register_memory({address:#x}, {nbytes}) returned {rc}")
            self._registered.append((address, nbytes))

    def read(self, peer: str, transfer: Transfer) -> None:
        """Copy the peer's ``transfer.remote`` ranges into our ``transfer.local`` ranges."""
        self._move("read", peer, transfer)

    def write(self, peer: str, transfer: Transfer) -> None:
        """Copy our ``transfer.local`` ranges into the peer's ``transfer.remote`` ranges."""
        self._move("write", peer, transfer)

    def _move(self, direction: str, peer: str, transfer: Transfer) -> None:
        if not transfer.lengths:
            return
        call = getattr(self._engine, f"batch_transfer_sync_{direction}")
        start = time.monotonic()
        rc = call(peer, transfer.local, transfer.remote, transfer.lengths)
        if rc != 0:
            # once more: the ranges are the same, and a TCP transfer starved of CPU can fail once and then pass
            # (seen under a load average of 20 on 2 cores); a peer that is gone fails again
            time.sleep(RETRY_DELAY_S)
            rc = call(peer, transfer.local, transfer.remote, transfer.lengths)
        if rc != 0:
            raise TransferError(
                f"Mooncake batch_transfer_sync_{direction} with {peer} ({len(transfer.lengths)} ranges, "
                f"{transfer.nbytes} bytes) returned {rc} after {time.monotonic() - start:.1f} s (two tries)"
            )

    def close(self) -> None:
        """Unregister every range (the engine itself lives until the process ends)."""
        with self._lock:
            for address, _ in self._registered:
                self._engine.unregister_memory(address)
            self._registered.clear()


def probe() -> dict[str, str]:
    """What ``vllm-ascend doctor`` shows: the Mooncake build, the transport the connectors would use here and
    whether an engine initializes with it (on 127.0.0.1)."""
    from vllm_ascend.core.sdk import detect

    protocol = "ascend" if detect().mode.value == "npu" else "tcp"
    found = installed_distribution()
    report = {
        "engine": f"{found[0]} {found[1]}" if found else f"Mooncake not installed ({INSTALL_HINT})",
        "transport": f"{protocol} (P2PHANDSHAKE, no metadata server)",
    }
    try:
        engine = MooncakeEngine("127.0.0.1", protocol)
    except (ImportError, TransferError) as exc:
        report["initializes"] = f"no: {exc}"
    else:
        report["initializes"] = f"yes (session {engine.session_id})"
    return report
