"""A KV pool in Mooncake Store, shared by instances: a bounded client for the connector that caches blocks.

One key is one KV block; its bytes are the concatenation of several buffers (one piece per layer per K/V),
put and got with Mooncake's ``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``, so no
staging copy is made. Every call is bounded by ``op_timeout_s``, because Mooncake's client is not:
against a dead, frozen or wrong master its calls take seconds to minutes, and some hold the GIL while they
wait. A pool that fails answers :class:`PoolUnavailable` (the caller recomputes) and is ``healthy`` again
once the master answers. The facts below were checked by running this Mooncake build on 127.0.0.1; see
``POOL-FACTS.md`` next to this package for the commands and numbers.

- ``setup`` with ``metadata_server="P2PHANDSHAKE"`` needs no metadata server (no HTTP, no etcd); two clients
  in two processes see each other's keys and read each other's bytes.
- ``setup`` **holds the GIL** while it retries: against a closed port it returns ``-1`` after ~90 s (20
  tries); against a port that accepts but never answers (a frozen master) it blocks for minutes. A worker
  thread cannot bound it, so :class:`KVPool` first connects to the master's port, then runs a throw-away
  ``setup`` in a child process bounded by the timeout, and only then sets up in this process.
- Once set up, a dead master usually answers ``batch_is_exist`` / gets with ``-900`` (RPC_FAIL) at once the
  first time (once it did not answer for > 3 s), then each put/get takes ~4.3-4.5 s (its reconnect attempt)
  before ``-900``; these calls release the GIL, so a daemon thread bounds them. The client reconnects by itself when the master comes back (keys the
  old master knew are gone).
- ``close`` and the store's destructor unmount the segment over RPC **holding the GIL**: ~16.5 s with the
  master dead. So the store object is never freed by Python, and ``close`` skips the RPC when unhealthy.
- Codes: ``0`` ok; get answers bytes read; ``-704`` key not found (never put, evicted, removed); ``-600``
  destination buffers smaller than the object, ``-800`` larger; ``-200`` no space in the pool (put);
  ``-706`` remove refused while the key's lease (``default_kv_lease_ttl``, 10 s; every exist/get renews it)
  runs. A key put twice answers ``0`` and keeps its first bytes (and size).
- A full pool refuses puts (``-200``) while the master evicts leased-out keys in the background
  (``eviction_high_watermark_ratio``, ``eviction_ratio``); an evicted key's get answers ``-704``.
"""

from __future__ import annotations

import ctypes
import logging
import math
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from vllm_ascend.core.sdk import ConfigError

logger = logging.getLogger(__name__)

T = TypeVar("T")

INSTALL_HINT = (
    "install vllm-ascend[kvtransfer] (Mooncake's TCP/RDMA build, which ships Mooncake Store) or "
    "vllm-ascend[kvtransfer-npu] on Ascend hosts; Mooncake also needs Debian's libibverbs1"
)
PROTOCOLS = ("tcp", "rdma", "ascend")
MiB = 1 << 20

# Mooncake Store's ErrorCode values (mooncake-store/include/types.h) as the Python binding returns them.
OK = 0
NO_AVAILABLE_HANDLE = -200  # no space left in the pool for a put
INVALID_PARAMS = -600  # also: destination buffers smaller than the object
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
TRANSFER_FAIL = -800  # also: destination buffers larger than the object
RPC_FAIL = -900
RPC_TIMEOUT = -901
_MASTER_GONE = frozenset({RPC_FAIL, RPC_TIMEOUT})

#: ``from_extra_config`` keys -> what each sets. Aliases are upstream vllm-ascend's ``mooncake.json`` names.
EXTRA_KEYS: dict[str, str] = {
    "master": "HOST:PORT of mooncake_master (required)",
    "local_hostname": "address other clients reach this one's segment at",
    "protocol": f"Mooncake transport, one of {', '.join(PROTOCOLS)}",
    "metadata_server": "P2PHANDSHAKE (no metadata server) or a metadata server URL",
    "global_segment_size": "bytes this client contributes to the pool (int, or '256MB', '1GB', ...)",
    "local_buffer_size": "bytes of this client's staging buffer (int, or '64MB', ...)",
    "op_timeout_s": "seconds any one pool call may take",
}
ALIASES: dict[str, str] = {
    "master_server_address": "master",
    "master_server_addr": "master",
    "mooncake_master": "master",
}
_UNITS = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
_UNITS.update({"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40})
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
_MAX_TIMEOUT = 3600.0
_PROBE_KEY = "vllm-ascend/kv-pool/probe"


class PoolUnavailable(RuntimeError):
    """The master is unreachable, frozen or died: callers fall back to recomputing."""


def parse_size(field: str, value: Any) -> int:
    """Bytes from an int or ``"<n>[B|KB|MB|GB|TB]"`` (binary units, as upstream's ``mooncake.json``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value)) and match[2].upper() in _UNITS:
        size = int(match[1]) * _UNITS[match[2].upper()]
    else:
        size = -1
    if size < 0:
        raise ConfigError(
            f"kv pool {field} must be a byte count (an integer >= 0, or a number with B, KB, MB, GB or TB), "
            f"got {value!r}"
        )
    return size


def split_master(master: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as (host, port), or a ConfigError naming ``master``."""
    host, sep, port_text = master.rpartition(":") if isinstance(master, str) else ("", "", "")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    port = int(port_text) if port_text.isdigit() else 0
    if not sep or not host or not 1 <= port <= 65535:
        raise ConfigError(f"kv pool master must be HOST:PORT with a port from 1 to 65535, got {master!r}")
    return host, port


@dataclass(frozen=True)
class PoolConfig:
    """How to reach the pool and what this client brings to it (checked on construction)."""

    master: str
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    #: ``P2PHANDSHAKE``: clients exchange segment descriptors directly, no metadata server to run.
    metadata_server: str = "P2PHANDSHAKE"
    global_segment_size: int = 256 * MiB
    local_buffer_size: int = 64 * MiB
    op_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        split_master(self.master)
        for field in ("local_hostname", "metadata_server"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"kv pool {field} must be a non-empty string, got {value!r}")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(
                f"kv pool protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}"
            )
        for field in ("global_segment_size", "local_buffer_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"kv pool {field} must be an integer number of bytes >= 0, got {value!r}")
        timeout = self.op_timeout_s
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or not 0 < timeout <= _MAX_TIMEOUT
        ):
            raise ConfigError(
                f"kv pool op_timeout_s must be a number of seconds above 0 and at most {_MAX_TIMEOUT:g}, "
                f"got {timeout!r}"
            )

    @property
    def master_host_port(self) -> tuple[str, int]:
        return split_master(self.master)

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any], *, other_keys: Collection[str] = ()) -> PoolConfig:
        """Read :data:`EXTRA_KEYS` (or their upstream :data:`ALIASES`) from ``extra``; ``other_keys`` are
        keys the caller handles itself (skipped here); any other key is refused by name."""
        values: dict[str, Any] = {}
        given: dict[str, str] = {}
        unknown = []
        for key, value in extra.items():
            if key in other_keys:
                continue
            field = ALIASES.get(key, key)
            if field not in EXTRA_KEYS:
                unknown.append(key)
                continue
            if field in given:
                raise ConfigError(f"kv pool {field} is given twice, as {given[field]!r} and {key!r}")
            given[field] = key
            values[field] = value
        if unknown:
            allowed = [*EXTRA_KEYS, *ALIASES]
            raise ConfigError(
                f"kv pool config key(s) {', '.join(map(repr, sorted(unknown)))} not supported; "
                f"allowed: {', '.join(allowed)}"
            )
        if "master" not in values:
            raise ConfigError(
                "kv pool master (HOST:PORT of mooncake_master) is required; "
                f"give it as {', '.join(['master', *ALIASES])}"
            )
        for field in ("global_segment_size", "local_buffer_size"):
            if field in values:
                values[field] = parse_size(field, values[field])
        try:
            return cls(**values)
        except ConfigError as exc:
            aliased = [f"{field} was given as {key!r}" for field, key in given.items() if field != key]
            if aliased:
                raise ConfigError(f"{exc} ({'; '.join(aliased)})") from None
            raise


def load_store_class() -> type:
    """Mooncake's ``MooncakeDistributedStore``, or an ImportError saying what to install."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise ImportError(f"Mooncake Store is not importable ({exc}); {INSTALL_HINT}") from exc
    return MooncakeDistributedStore


def _keep_forever(obj: object) -> None:
    """Never let Python free ``obj``: a store's destructor unmounts over RPC holding the GIL (~16 s with the
    master dead, at any garbage collection or at exit). What it holds goes with the process."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


# A throw-away client in a child process: it tells whether the master answers a real setup in time, which a
# thread cannot (setup holds the GIL). It contributes no memory and exits without unmounting anything.
_PROBE = """
import os, sys
from mooncake.store import MooncakeDistributedStore
rc = MooncakeDistributedStore().setup({"local_hostname": sys.argv[1], "metadata_server": sys.argv[2],
    "master_server_addr": sys.argv[3], "protocol": "tcp", "global_segment_size": 0, "local_buffer_size": 0})
print(rc, flush=True)
os._exit(0 if rc == 0 else 3)
"""


class KVPool:
    """A Mooncake Store client whose every call returns within ``op_timeout_s``.

    Register the host memory the KV blocks live in once (:meth:`register`), then put and get whole blocks by
    key; each key's bytes are the concatenation of its buffers, in order. Calls are safe from several
    threads. A call abandoned at its timeout keeps running in Mooncake: a late get may still write into its
    destination buffers, so treat a timed-out get's buffers as garbage until they are rewritten.
    """

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self._store_class = load_store_class()
        self._lock = threading.Lock()
        self._closed = False
        self._healthy = False
        self._store: Any = None
        self._next_retry = 0.0
        self._last_error = ""
        deadline = time.monotonic() + config.op_timeout_s
        self._check_master(deadline)
        self._store = self._setup()
        self._healthy = True

    # -- connection -----------------------------------------------------------------------------------------

    def _unavailable(self, what: str) -> PoolUnavailable:
        return PoolUnavailable(f"kv pool master {self.config.master}: {what}")

    def _check_master(self, deadline: float) -> None:
        """Raise PoolUnavailable unless the master accepts a connection and answers a client's setup before
        ``deadline``."""
        host, port = self.config.master_host_port
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(left, 0.01)):
                pass
        except OSError as exc:
            raise self._unavailable(f"cannot connect ({exc.strerror or exc})") from None
        left = deadline - time.monotonic()
        command = [sys.executable, "-c", _PROBE, self.config.local_hostname, self.config.metadata_server]
        try:
            proc = subprocess.run(
                [*command, self.config.master],
                capture_output=True,
                text=True,
                timeout=max(left, 0.01),
            )
        except subprocess.TimeoutExpired:
            raise self._unavailable(
                f"accepts connections but did not answer a client's setup within {self.config.op_timeout_s:g} s"
            ) from None
        if proc.returncode != 0:
            detail = proc.stdout.strip() or (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise self._unavailable(f"a client's setup failed (status {proc.returncode}: {detail})")

    def _setup(self) -> Any:
        store = self._store_class()
        _keep_forever(store)
        c = self.config
        rc = store.setup(
            {
                "local_hostname": c.local_hostname,
                "metadata_server": c.metadata_server,
                "master_server_addr": c.master,
                "protocol": c.protocol,
                "global_segment_size": c.global_segment_size,
                "local_buffer_size": c.local_buffer_size,
            }
        )
        if rc != OK:
            raise self._unavailable(f"setup failed with status {rc} (protocol {c.protocol})")
        return store

    def reconnect(self) -> bool:
        """Check that the master answers an RPC again (the Mooncake client reconnects by itself: this only
        looks); returns ``healthy``. Until the client has mounted its segment on a restarted master, puts
        can still answer False (no room)."""
        if self._closed:
            return False
        host, port = self.config.master_host_port
        try:
            with socket.create_connection((host, port), timeout=min(self.config.op_timeout_s, 1.0)):
                pass
            # A real RPC: health_check answers 0 from a stale flag right after the master died or came back.
            answer = self._bounded("batch_is_exist", lambda: self._store.batch_is_exist([_PROBE_KEY]))
            status = OK if answer and answer[0] in (0, 1) else answer[0]
            why = f"an existence check answered {status}"
        except OSError as exc:
            status, why = -1, f"cannot connect ({exc.strerror or exc})"
        except PoolUnavailable as exc:
            status, why = -1, str(exc)
        with self._lock:
            self._healthy = status == OK
            if not self._healthy:
                self._last_error = why
            self._next_retry = time.monotonic() + (0 if self._healthy else self.config.op_timeout_s)
        return self._healthy

    @property
    def healthy(self) -> bool:
        """False after a :class:`PoolUnavailable` until a reconnect succeeds (calls retry it at most once per
        ``op_timeout_s``)."""
        return self._healthy and not self._closed

    def _mark_unhealthy(self, why: str) -> PoolUnavailable:
        with self._lock:
            if self._healthy:
                logger.warning("kv pool %s unavailable: %s; callers recompute", self.config.master, why)
            self._healthy = False
            self._last_error = why
            self._next_retry = time.monotonic() + self.config.op_timeout_s
        return self._unavailable(why)

    def _ready(self) -> None:
        if self._closed:
            raise RuntimeError("kv pool is closed")
        if self._healthy:
            return
        if time.monotonic() < self._next_retry or not self.reconnect():
            raise self._unavailable(f"unavailable since: {self._last_error}")

    def _bounded(self, what: str, call: Callable[[], T]) -> T:
        """``call()`` on a daemon thread; PoolUnavailable if it has not returned within ``op_timeout_s``."""
        box: list[tuple[bool, Any]] = []
        done = threading.Event()

        def work() -> None:
            try:
                box.append((True, call()))
            except BaseException as exc:  # handed to the caller's thread
                box.append((False, exc))
            finally:
                done.set()

        threading.Thread(target=work, name=f"kv-pool-{what}", daemon=True).start()
        if not done.wait(self.config.op_timeout_s):
            raise self._mark_unhealthy(f"{what} did not return within {self.config.op_timeout_s:g} s")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def _call(self, what: str, call: Callable[[], list[int]]) -> list[int]:
        self._ready()
        codes = self._bounded(what, call)
        gone = [code for code in codes if code in _MASTER_GONE]
        if gone:
            raise self._mark_unhealthy(f"{what} failed with status {gone[0]} (master RPC failed)")
        return codes

    # -- data -----------------------------------------------------------------------------------------------

    def register(self, ptr: int, nbytes: int) -> None:
        """Register host memory ``[ptr, ptr + nbytes)`` so puts and gets move it without a staging copy. It must
        stay allocated while registered and may not overlap a registered region."""
        if nbytes <= 0 or ptr <= 0:
            raise ValueError(f"register needs a pointer and a positive size, got ptr={ptr}, nbytes={nbytes}")
        self._ready()
        status = self._bounded("register_buffer", lambda: self._store.register_buffer(ptr, nbytes))
        if status != OK:
            hint = " (it overlaps a registered region)" if status == INVALID_PARAMS else ""
            raise self._unavailable(f"register_buffer({ptr:#x}, {nbytes}) failed with status {status}{hint}")

    def unregister(self, ptr: int) -> None:
        """Forget memory registered at ``ptr`` (before freeing it: a region may not overlap a registered one)."""
        self._ready()
        status = self._bounded("unregister_buffer", lambda: self._store.unregister_buffer(ptr))
        if status != OK:
            raise self._unavailable(f"unregister_buffer({ptr:#x}) failed with status {status}")

    def exists(self, keys: list[str]) -> list[bool]:
        """Whether each key is in the pool now (an existence check also renews the key's lease)."""
        if not keys:
            return []
        keys = list(keys)
        return [code == 1 for code in self._call("batch_is_exist", lambda: self._store.batch_is_exist(keys))]

    def put(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[bool]:
        """Store key i as the concatenation of buffers ``ptrs[i]`` (``sizes[i]`` bytes each). True per key
        stored or already present (its first bytes are kept); False when the pool had no room."""
        keys, ptrs, sizes = _check_batch("put", keys, ptrs, sizes)
        if not keys:
            return []
        codes = self._call(
            "batch_put_from_multi_buffers",
            lambda: self._store.batch_put_from_multi_buffers(keys, ptrs, sizes),
        )
        return [code in (OK, OBJECT_ALREADY_EXISTS) for code in codes]

    def get(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[bool]:
        """Read key i into buffers ``ptrs[i]`` in order. True per key read whole; False for a key missing,
        evicted, or whose size differs from ``sum(sizes[i])`` (its buffers are left as they were)."""
        keys, ptrs, sizes = _check_batch("get", keys, ptrs, sizes)
        if not keys:
            return []
        codes = self._call(
            "batch_get_into_multi_buffers",
            lambda: self._store.batch_get_into_multi_buffers(keys, ptrs, sizes),
        )
        return [code == sum(parts) for code, parts in zip(codes, sizes, strict=True)]

    def close(self) -> None:
        """Leave the pool: unmount this client's segment (its keys go with it). Skipped while unhealthy,
        because Mooncake's close then blocks for ~16 s holding the GIL; the master drops the client after
        its ``client_ttl``."""
        if self._closed:
            return
        self._closed = True
        if self._store is None:
            return
        if self._healthy and self._bounded("health_check", self._store.health_check) == OK:
            status = self._store.close()
            if status != OK:
                logger.warning("kv pool %s: close answered status %s", self.config.master, status)
        else:
            logger.warning("kv pool %s: master unavailable, leaving without unmounting", self.config.master)
        self._healthy = False


def _check_batch(
    what: str, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]
) -> tuple[list[str], list[list[int]], list[list[int]]]:
    keys, ptrs, sizes = list(keys), [list(p) for p in ptrs], [list(s) for s in sizes]
    if not len(keys) == len(ptrs) == len(sizes):
        raise ValueError(
            f"{what} needs one ptrs list and one sizes list per key, got {len(keys)} keys, {len(ptrs)} ptrs "
            f"lists and {len(sizes)} sizes lists"
        )
    for key, key_ptrs, key_sizes in zip(keys, ptrs, sizes, strict=True):
        if not isinstance(key, str) or not key:
            raise ValueError(f"{what} keys must be non-empty strings, got {key!r}")
        if not key_ptrs or len(key_ptrs) != len(key_sizes):
            raise ValueError(
                f"{what} key {key!r} needs as many buffers as sizes (at least one), got {len(key_ptrs)} "
                f"buffers and {len(key_sizes)} sizes"
            )
        if any(size <= 0 for size in key_sizes):
            raise ValueError(f"{what} key {key!r} has a buffer size <= 0: {key_sizes}")
    return keys, ptrs, sizes
