"""Bookkeeping of a seed's connections that have not authenticated yet, shared by both ports.

Unauthenticated peers must not be able to deny service to authenticated ones, so a connection
only counts against a port's ``max_connections`` once it has authenticated and sent its request.
Until then it is *pending*: it has ``handshake_timeout`` seconds to get there, and a
:class:`PendingBook` holds at most ``max_pending`` pending connections in all and
``max_pending_per_peer`` from one IP address. Admitting a connection over either limit drops the
oldest pending one (of that address, or overall): an honest client needs milliseconds to
authenticate, so a flood of idle connections only ever pushes out other idle connections.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from vllm_ascend.netloader.protocol import BUSY_PREFIX

DEFAULT_HANDSHAKE_TIMEOUT = 5.0
DEFAULT_MAX_PENDING = 128
DEFAULT_MAX_PENDING_PER_PEER = 16

Drop = Callable[[str], None]
"""Closes a pending connection, given the reason (what its peer is told, when it can be). It runs under
the book's lock, so that a connection is dropped and marked so at once; it must not call the book."""


def check_limits(
    max_connections: int,
    timeout: float,
    handshake_timeout: float,
    max_pending: int,
    max_pending_per_peer: int,
) -> None:
    """Refuse limits a seed cannot run with, naming the keyword and what it accepts."""
    for name, value in (
        ("max_connections", max_connections),
        ("max_pending", max_pending),
        ("max_pending_per_peer", max_pending_per_peer),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name, seconds in (("timeout", timeout), ("handshake_timeout", handshake_timeout)):
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= 86400:
            raise ValueError(f"{name} must be a number of seconds in (0, 86400], got {seconds!r}")


class PendingBook:
    """Pending connections in admission order, with a total and a per-address limit (thread-safe).

    Keys are the caller's connection objects; each comes with its peer address and a :data:`Drop`.
    """

    def __init__(self, max_pending: int, max_pending_per_peer: int) -> None:
        self.max_pending, self.max_pending_per_peer = max_pending, max_pending_per_peer
        self._entries: OrderedDict[Hashable, tuple[str, Drop, float]] = OrderedDict()
        self._by_peer: dict[str, OrderedDict[Hashable, None]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def admit(self, key: Hashable, peer: str, drop: Drop) -> None:
        """Add ``key`` (as the newest; again if it was pending); drop the oldest pending connection when a limit is exceeded."""
        with self._lock:
            if key in self._entries:
                self._remove(key)
            self._entries[key] = (peer, drop, time.monotonic())
            self._by_peer.setdefault(peer, OrderedDict())[key] = None
            if len(self._by_peer[peer]) > self.max_pending_per_peer:
                self._remove(next(iter(self._by_peer[peer])))(
                    f"{BUSY_PREFIX} dropped, more than {self.max_pending_per_peer} unauthenticated "
                    f"connections from {peer}"
                )
            if len(self._entries) > self.max_pending:
                self._remove(next(iter(self._entries)))(
                    f"{BUSY_PREFIX} dropped, more than {self.max_pending} unauthenticated connections"
                )

    def release(self, key: Hashable) -> bool:
        """Take ``key`` off the book (it authenticated, or closed); False when it had been dropped already."""
        with self._lock:
            if key not in self._entries:
                return False
            self._remove(key)
            return True

    def expire(self, timeout: float, reason: str) -> float | None:
        """Drop the connections pending for ``timeout`` seconds or more; seconds until the next one is due."""
        with self._lock:
            now = time.monotonic()
            while self._entries:
                key, (_, _, since) = next(iter(self._entries.items()))
                if since + timeout > now:
                    return since + timeout - now
                self._remove(key)(reason)
            return None

    def drop_all(self, reason: str) -> None:
        """Drop every pending connection (the seed stops)."""
        with self._lock:
            for key in list(self._entries):
                self._remove(key)(reason)

    def _remove(self, key: Hashable) -> Drop:
        peer, drop, _ = self._entries.pop(key)
        mine = self._by_peer[peer]
        del mine[key]
        if not mine:
            del self._by_peer[peer]
        return drop
