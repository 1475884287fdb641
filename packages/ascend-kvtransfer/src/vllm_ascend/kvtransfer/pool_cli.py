"""``vllm-ascend kv-pool``: run the KV pool's master, Mooncake Store's ``mooncake_master`` from the wheel.

The command and :func:`start_master` / :func:`wait_ready` (what tests use) start the master the same way:
bound to ``--host``, its RPC on ``--port`` and its HTTP metrics/admin server on ``--metrics-port``, no
metadata server (clients use ``P2PHANDSHAKE``). Once the port accepts connections the command prints
``kv-pool master at HOST:PORT``, forwards SIGTERM/SIGINT to the master and exits with its status (128 + the
signal if a signal ended it). Mistakes are one line on stderr naming the option: status 2 for arguments,
1 when the master cannot start (binary missing, port taken: the master exits 1).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO, Any, NoReturn

from vllm_ascend.core.sdk import CliCommand

PROG = "kv-pool"
USAGE_ERROR = 2
START_ERROR = 1
BINARY = "mooncake_master"
DEFAULT_PORT = 50051
DEFAULT_METRICS_PORT = 9003
INSTALL_HINT = "install vllm-ascend[kvtransfer] (it ships mooncake_master)"
_FLAG_NAME = "abcdefghijklmnopqrstuvwxyz0123456789_"


class UsageError(ValueError):
    """A command-line mistake; its message names the option."""


class MasterError(RuntimeError):
    """The master binary is missing, exited early or did not listen in time."""


def find_master_binary() -> str:
    """``mooncake_master``: next to ``sys.executable`` (the venv's), inside the ``mooncake`` package, on PATH."""
    candidates = [Path(sys.executable).parent / BINARY]
    spec = importlib.util.find_spec("mooncake")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(location) / BINARY for location in spec.submodule_search_locations]
    on_path = shutil.which(BINARY)
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    looked = ", ".join(str(c) for c in candidates) or "nowhere"
    raise MasterError(f"{BINARY} not found (looked at {looked} and PATH); {INSTALL_HINT}")


def master_flags(
    host: str,
    port: int,
    *,
    metrics_port: int = DEFAULT_METRICS_PORT,
    eviction_high_watermark_ratio: float | None = None,
    eviction_ratio: float | None = None,
    lease_ttl_ms: int | None = None,
    client_ttl_s: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> list[str]:
    """The master's gflags for these settings (``extra``: any other ``--name=value`` it knows)."""
    flags = {
        "rpc_address": host,
        "rpc_port": port,
        "metrics_host": host,
        "metrics_port": metrics_port,
        "eviction_high_watermark_ratio": eviction_high_watermark_ratio,
        "eviction_ratio": eviction_ratio,
        "default_kv_lease_ttl": lease_ttl_ms,
        "client_ttl": client_ttl_s,
        **(extra or {}),
    }
    rendered = []
    for name, value in flags.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        rendered.append(f"--{name}={value}")
    return rendered


def start_master(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    binary: str | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    **settings: Any,
) -> subprocess.Popen[bytes]:
    """Start ``mooncake_master`` (settings: those of :func:`master_flags`); pair with :func:`wait_ready`.
    MasterError if the binary is missing or ``host:port`` is taken (then wait_ready would see the other
    listener)."""
    command = [binary or find_master_binary(), *master_flags(host, port, **settings)]
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        socket.create_server((host, port), family=family).close()
    except OSError as exc:
        raise MasterError(f"--host {host} --port {port}: cannot listen: {exc.strerror or exc}") from None
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, preexec_fn=_die_with_parent
    )


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the process that started it dies, so a killed
    ``vllm-ascend kv-pool`` (even by SIGKILL, which it cannot forward) takes its master down with it."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def wait_ready(proc: subprocess.Popen[Any], host: str, port: int, timeout: float = 30.0) -> None:
    """Return once ``host:port`` accepts a connection; MasterError if ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        status = proc.poll()
        if status is not None:
            raise MasterError(f"{BINARY} exited with status {status} before listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise MasterError(f"{BINARY} did not listen on {host}:{port} within {timeout:g} s")
        time.sleep(0.05)


def _port(option: str, text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if not 1 <= value <= 65535:
        raise UsageError(f"{option} must be an integer from 1 to 65535, got {text}")
    return value


def _ratio(option: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise UsageError(f"{option} must be a number above 0 and at most 1, got {text}")
    return value


def _positive(option: str, text: str | None, unit: str) -> int | None:
    if text is None:
        return None
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise UsageError(f"{option} must be a whole number of {unit} of at least 1, got {text}")
    return value


def _extra(texts: list[str]) -> dict[str, str]:
    extra = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not name or set(name) - set(_FLAG_NAME):
            raise UsageError(f"--master-flag must be NAME=VALUE with a mooncake_master flag name, got {text}")
        extra[name] = value
    return extra


def _exit_usage(message: str) -> NoReturn:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.error = _exit_usage  # type: ignore[method-assign]
    parser.add_argument("--host", default="127.0.0.1", help="address the master binds (default: %(default)s)")
    parser.add_argument(
        "--port", default=str(DEFAULT_PORT), help="the master's RPC port (default: %(default)s)"
    )
    parser.add_argument(
        "--metrics-port",
        default=str(DEFAULT_METRICS_PORT),
        help="the master's HTTP metrics/admin port on --host (default: %(default)s)",
    )
    parser.add_argument(
        "--eviction-high-watermark-ratio",
        metavar="RATIO",
        help="pool fill (0-1] at which the master starts evicting (mooncake's default: 0.9)",
    )
    parser.add_argument(
        "--eviction-ratio",
        metavar="RATIO",
        help="share (0-1] of objects evicted per round (mooncake's: 0.05)",
    )
    parser.add_argument(
        "--lease-ttl-ms",
        metavar="MS",
        help="milliseconds a key stays un-evictable after each put/exists/get (mooncake's: 10000)",
    )
    parser.add_argument(
        "--client-ttl",
        metavar="SECONDS",
        help="seconds without a heartbeat before a client's segment is dropped (mooncake's: 10)",
    )
    parser.add_argument(
        "--master-flag",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other mooncake_master flag, passed on as --NAME=VALUE (repeat for several)",
    )
    parser.add_argument(
        "--start-timeout", default="30", metavar="SECONDS", help="seconds to wait for the port (default: 30)"
    )


def _run(args: argparse.Namespace) -> int:
    """Check the arguments, start the master, report it, forward signals, exit with its status."""
    try:
        if not args.host:
            raise UsageError("--host must be an address or host name, got an empty string")
        port, metrics_port = _port("--port", args.port), _port("--metrics-port", args.metrics_port)
        if port == metrics_port:
            raise UsageError(f"--metrics-port must differ from --port, both are {port}")
        settings: dict[str, Any] = {
            "metrics_port": metrics_port,
            "eviction_high_watermark_ratio": _ratio(
                "--eviction-high-watermark-ratio", args.eviction_high_watermark_ratio
            ),
            "eviction_ratio": _ratio("--eviction-ratio", args.eviction_ratio),
            "lease_ttl_ms": _positive("--lease-ttl-ms", args.lease_ttl_ms, "milliseconds"),
            "client_ttl_s": _positive("--client-ttl", args.client_ttl, "seconds"),
            "extra": _extra(args.master_flag),
        }
        start_timeout = _seconds(args.start_timeout)
    except UsageError as exc:
        return _report(str(exc), USAGE_ERROR)
    try:
        binary = find_master_binary()
    except MasterError as exc:
        return _report(str(exc), START_ERROR)
    try:
        proc = start_master(args.host, port, binary=binary, **settings)
    except MasterError as exc:
        return _report(str(exc), START_ERROR)
    forwarded: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        forwarded.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            wait_ready(proc, args.host, port, start_timeout)
        except MasterError as exc:
            if proc.poll() is None and not forwarded:
                proc.kill()
            proc.wait()
            return _report(str(exc), START_ERROR) if not forwarded else _status(proc.returncode)
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"kv-pool master at {host}:{port}", flush=True)
        return _status(proc.wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 3600):
        raise UsageError(f"--start-timeout must be a number of seconds above 0 and at most 3600, got {text}")
    return value


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _report(message: str, status: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return status


KV_POOL_COMMAND = CliCommand(
    name=PROG,
    help="run the KV pool's master (Mooncake Store's mooncake_master) for the pool connector",
    configure=_configure,
    run=_run,
)
