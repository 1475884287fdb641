"""``vllm-ascend pd-proxy``: serve the prefill/decode proxy (:mod:`vllm_ascend.kvtransfer.proxy`).

Every mistake is one line on stderr that names the option and what it allows (``pd-proxy: --decode must be
http(s)://HOST:PORT, got localhost:8200``), never a traceback: status 2 for arguments that cannot work, 1 when
the proxy cannot listen (port in use, unknown host). Values are taken as text by argparse and checked here.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
from typing import NoReturn
from urllib.parse import urlsplit

from vllm_ascend.core.sdk import CliCommand

PROG = "pd-proxy"
USAGE_ERROR = 2
START_ERROR = 1
_MAX_SECONDS = 86400.0
_URL_FORM = "http(s)://HOST:PORT"


class UsageError(ValueError):
    """A command-line mistake; its message names the option."""


def _url(option: str, text: str) -> str:
    """``text`` as ``scheme://host:port`` (no path, query or credentials), or a usage error naming ``option``."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        port = None
    if (
        port is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise UsageError(f"{option} must be {_URL_FORM}, got {text}")
    return f"{parts.scheme}://{parts.netloc}"


def _urls(option: str, texts: list[str]) -> list[str]:
    urls = [_url(option, text) for text in texts]
    for url in urls:
        if urls.count(url) > 1:
            raise UsageError(f"{option} must name each instance once, got {url} {urls.count(url)} times")
    return urls


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise UsageError(f"--port must be an integer from 1 to 65535, got {text}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= _MAX_SECONDS):
        raise UsageError(
            f"--timeout must be a number of seconds above 0 and at most {_MAX_SECONDS:g}, got {text}"
        )
    return value


def _exit_usage(message: str) -> NoReturn:
    """argparse's own errors (a missing --decode, an option without its value) as one line too."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)


def _configure(parser: argparse.ArgumentParser) -> None:
    from vllm_ascend.kvtransfer.proxy import DEFAULT_TIMEOUT, METASERVER_PATH

    parser.error = _exit_usage  # type: ignore[method-assign]
    parser.add_argument(
        "--prefill",
        action="append",
        required=True,
        metavar="URL",
        help=f"a prefill instance, {_URL_FORM} (repeat for several)",
    )
    parser.add_argument(
        "--decode",
        action="append",
        required=True,
        metavar="URL",
        help=f"a decode instance, {_URL_FORM} (repeat for several)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", default="8000", help="port to listen on (default: %(default)s)")
    parser.add_argument(
        "--layerwise",
        action="store_true",
        help="for MooncakeLayerwiseConnector: decode goes first and posts its blocks to "
        f"{METASERVER_PATH}, then prefill pushes layer by layer (default: MooncakeConnectorV1's pull)",
    )
    parser.add_argument(
        "--public-url",
        metavar="URL",
        help=f"with --layerwise, where decode instances reach this proxy, {_URL_FORM} "
        "(default: http://HOST:PORT, 0.0.0.0 as 127.0.0.1)",
    )
    parser.add_argument(
        "--timeout",
        default=f"{DEFAULT_TIMEOUT:g}",
        metavar="SECONDS",
        help="seconds an instance has for each step of a request: connecting, each read (default: %(default)s)",
    )


def _run(args: argparse.Namespace) -> int:
    """Check the arguments, listen, serve until Ctrl-C; mistakes are one line on stderr."""
    try:
        prefill, decode = _urls("--prefill", args.prefill), _urls("--decode", args.decode)
        port, timeout = _port(args.port), _seconds(args.timeout)
        if args.public_url is not None and not args.layerwise:
            raise UsageError("--public-url is only used with --layerwise")
        public_url = _url("--public-url", args.public_url) if args.public_url is not None else None
        if not args.host:
            raise UsageError("--host must be an address or host name, got an empty string")
    except UsageError as exc:
        return _report(str(exc), USAGE_ERROR)
    try:
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        sock = socket.create_server((args.host, port), family=family)
    except OSError as exc:
        return _report(f"--host {args.host} --port {port}: cannot listen: {exc.strerror or exc}", START_ERROR)
    if public_url is None:
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        public_url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    return _serve(sock, prefill, decode, args.layerwise, public_url, timeout)


def _serve(
    sock: socket.socket,
    prefill: list[str],
    decode: list[str],
    layerwise: bool,
    public_url: str,
    timeout: float,
) -> int:
    import uvicorn

    from vllm_ascend.kvtransfer.proxy import create_app

    app = create_app(prefill, decode, layerwise=layerwise, public_url=public_url, timeout=timeout)
    mode = "layerwise (decode first)" if layerwise else "pull (prefill first)"
    print(
        f"pd-proxy at {public_url}, {mode}: prefill {' '.join(prefill)}; decode {' '.join(decode)}; "
        "Ctrl-C stops it",
        flush=True,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    with sock:
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:
            # uvicorn stops gracefully on Ctrl-C, then raises it again for its caller.
            print("pd-proxy stopped", flush=True)
    return 0


def _report(message: str, status: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return status


PD_PROXY_COMMAND = CliCommand(
    name=PROG,
    help="OpenAI-compatible proxy in front of prefill and decode vLLM instances (PD disaggregation)",
    configure=_configure,
    run=_run,
)
