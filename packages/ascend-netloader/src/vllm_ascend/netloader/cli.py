"""``vllm-ascend netloader-seed``: serve a safetensors checkpoint to netloader clients.

Every mistake is one line on stderr that names the option or file (``netloader-seed: --chunk-mib must be
an integer from 1 to 1024, got 0``) and a non-zero exit status, never a traceback: 2 for arguments that
cannot work (values, files, certificates), 1 when the seed cannot open its ports (in use, bad host).
Argument values are taken as text by argparse and checked here, so that their messages have that form.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
from typing import NoReturn

from vllm_ascend.core.sdk import CliCommand
from vllm_ascend.netloader.admission import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_PER_PEER,
)
from vllm_ascend.netloader.security import TOKEN_ENV

PROG = "netloader-seed"
USAGE_ERROR = 2
START_ERROR = 1
_MAX_SECONDS = 86400.0


class UsageError(ValueError):
    """A command-line mistake; its message names the option or file."""


def _fail(message: str) -> NoReturn:
    raise UsageError(message)


def _integer(args: argparse.Namespace, option: str, low: int, high: int) -> int:
    text = getattr(args, option.lstrip("-").replace("-", "_"))
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        _fail(f"{option} must be an integer from {low} to {high}, got {text}")
    return value


def _seconds(args: argparse.Namespace, option: str) -> float:
    text = getattr(args, option.lstrip("-").replace("-", "_"))
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= _MAX_SECONDS):
        _fail(f"{option} must be a number of seconds above 0 and at most {_MAX_SECONDS:g}, got {text}")
    return value


def _exit_usage(message: str) -> NoReturn:
    """argparse's own errors (a missing --checkpoint, a flag without its value) as one line too."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.error = _exit_usage  # type: ignore[method-assign]
    parser.add_argument("--checkpoint", required=True, help="model directory (*.safetensors) or one file")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s); a non-loopback address needs a token",
    )
    parser.add_argument("--port", default="0", metavar="PORT", help="HTTP port (default: a free port)")
    parser.add_argument(
        "--stream-port", default="0", metavar="PORT", help="TCP stream port (default: a free port)"
    )
    parser.add_argument(
        "--chunk-mib", default="16", metavar="MIB", help="bytes per stream frame, MiB, 1-1024 (default: 16)"
    )
    parser.add_argument(
        "--token-file", help=f"file holding the shared token clients must prove (default: ${TOKEN_ENV})"
    )
    parser.add_argument(
        "--token-env",
        default=TOKEN_ENV,
        help="environment variable holding the token when --token-file is not given (default: %(default)s)",
    )
    parser.add_argument("--tls-cert", help="PEM certificate: both ports speak TLS (needs --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert (unencrypted)")
    parser.add_argument(
        "--max-connections",
        default="32",
        metavar="N",
        help="authenticated requests served at once per port; more are answered 'seed busy' (default: 32)",
    )
    parser.add_argument(
        "--timeout",
        default="30",
        metavar="S",
        help="seconds a client has to take each stream frame or HTTP response (default: 30)",
    )
    parser.add_argument(
        "--handshake-timeout",
        default=f"{DEFAULT_HANDSHAKE_TIMEOUT:g}",
        metavar="S",
        help="seconds a connection has to authenticate and send its request, counted from opening "
        f"(HTTP: or from its last response) (default: {DEFAULT_HANDSHAKE_TIMEOUT:g})",
    )
    parser.add_argument(
        "--max-pending",
        default=str(DEFAULT_MAX_PENDING),
        metavar="N",
        help="connections per port that have not authenticated yet; past it the oldest is dropped "
        f"(default: {DEFAULT_MAX_PENDING})",
    )
    parser.add_argument(
        "--max-pending-per-peer",
        default=str(DEFAULT_MAX_PENDING_PER_PEER),
        metavar="N",
        help="the same from one IP address (default: %(default)s)",
    )


def _run(args: argparse.Namespace) -> int:
    """Check the arguments, load the checkpoint, serve until Ctrl-C; mistakes are one line on stderr."""
    from vllm_ascend.netloader.security import SecurityError
    from vllm_ascend.netloader.seed_server import CheckpointError
    from vllm_ascend.netloader.transfer import STREAM_PORT, ListenError

    try:
        return _serve(args)
    except (UsageError, SecurityError) as exc:
        return _report(str(exc), USAGE_ERROR)
    except CheckpointError as exc:
        return _report(f"--checkpoint: {exc}", USAGE_ERROR)
    except ListenError as exc:
        if not exc.port_at_fault:
            option = f"--host {args.host}"
        elif exc.what == STREAM_PORT:
            option = f"--stream-port {args.stream_port}"
        else:
            option = f"--port {args.port}"
        return _report(f"{option}: {exc}", START_ERROR)
    except KeyboardInterrupt:
        return _report("interrupted before the seed was serving", 130)


def _report(message: str, status: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return status


def _serve(args: argparse.Namespace) -> int:
    from vllm_ascend.netloader.security import ServerSecurity, read_token
    from vllm_ascend.netloader.seed_server import SeedServer, load_checkpoint

    port = _integer(args, "--port", 0, 65535)
    stream_port = _integer(args, "--stream-port", 0, 65535)
    if port and port == stream_port:
        _fail(f"--port and --stream-port must differ, both are {port}")
    chunk_mib = _integer(args, "--chunk-mib", 1, 1024)
    max_connections = _integer(args, "--max-connections", 1, 4096)
    timeout, handshake_timeout = _seconds(args, "--timeout"), _seconds(args, "--handshake-timeout")
    max_pending = _integer(args, "--max-pending", 1, 65536)
    max_pending_per_peer = _integer(args, "--max-pending-per-peer", 1, 65536)
    if not args.host:
        _fail("--host must be an address or host name, got an empty string")
    token = read_token(args.token_file, args.token_env)
    security = ServerSecurity(token, args.tls_cert, args.tls_key)
    security.check_bind(args.host)
    state_dict = load_checkpoint(args.checkpoint)
    server = SeedServer.serving(
        state_dict,
        args.host,
        port,
        stream_port,
        chunk_mib << 20,
        security=security,
        max_connections=max_connections,
        timeout=timeout,
        handshake_timeout=handshake_timeout,
        max_pending=max_pending,
        max_pending_per_peer=max_pending_per_peer,
    )
    server.start()
    manifest = server.stream.manifest
    extras = [word for word, on in (("token required", token is not None), ("TLS", security.tls)) if on]
    print(
        f"seed serving {len(manifest)} tensors ({manifest.total_bytes / 2**20:.1f} MiB) from {args.checkpoint} "
        f"at {server.url} (stream port {server.stream.port}{''.join('; ' + e for e in extras)}); "
        "Ctrl-C stops it",
        flush=True,
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        print("seed stopped", flush=True)
    finally:
        server.stop()
    return 0


SEED_COMMAND = CliCommand(
    name=PROG,
    help="serve a safetensors checkpoint to vLLM instances loading with load_format=netloader",
    configure=_configure,
    run=_run,
)
