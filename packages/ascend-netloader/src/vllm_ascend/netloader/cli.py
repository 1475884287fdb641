"""``vllm-ascend netloader-seed``: serve a safetensors checkpoint to netloader clients."""

from __future__ import annotations

import argparse
import sys
import threading

from vllm_ascend.core.registry import CliCommand
from vllm_ascend.netloader.security import TOKEN_ENV


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="model directory (*.safetensors) or one file")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s); a non-loopback address needs a token",
    )
    parser.add_argument("--port", type=int, default=0, help="HTTP port (default: a free port)")
    parser.add_argument("--stream-port", type=int, default=0, help="TCP stream port (default: a free port)")
    parser.add_argument("--chunk-mib", type=int, default=16, help="bytes per stream frame, MiB (default: 16)")
    parser.add_argument(
        "--token-file", help=f"file holding the shared token clients must prove (default: ${TOKEN_ENV})"
    )
    parser.add_argument(
        "--token-env",
        default=TOKEN_ENV,
        help="environment variable holding the token when --token-file is not given (default: %(default)s)",
    )
    parser.add_argument("--tls-cert", help="PEM certificate: both ports speak TLS (needs --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--max-connections",
        type=int,
        default=32,
        help="connections served at once per port; more are refused (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds a client has to send its request, and to take each frame (default: %(default)s)",
    )


def _run(args: argparse.Namespace) -> int:
    from vllm_ascend.netloader.security import SecurityError, ServerSecurity, read_token
    from vllm_ascend.netloader.seed_server import SeedServer, load_checkpoint

    try:
        token = read_token(args.token_file, args.token_env)
        security = ServerSecurity(token, args.tls_cert, args.tls_key)
        security.check_bind(args.host)
    except SecurityError as exc:
        print(f"netloader-seed: {exc}", file=sys.stderr, flush=True)
        return 2
    state_dict = load_checkpoint(args.checkpoint)
    server = SeedServer.serving(
        state_dict,
        args.host,
        args.port,
        args.stream_port,
        args.chunk_mib << 20,
        security=security,
        max_connections=args.max_connections,
        timeout=args.timeout,
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
    name="netloader-seed",
    help="serve a safetensors checkpoint to vLLM instances loading with load_format=netloader",
    configure=_configure,
    run=_run,
)
