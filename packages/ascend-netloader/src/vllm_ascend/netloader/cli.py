"""``vllm-ascend netloader-seed``: serve a safetensors checkpoint to netloader clients."""

from __future__ import annotations

import argparse
import threading

from vllm_ascend.core.registry import CliCommand


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="model directory (*.safetensors) or one file")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="HTTP port (default: a free port)")
    parser.add_argument("--stream-port", type=int, default=0, help="TCP stream port (default: a free port)")
    parser.add_argument("--chunk-mib", type=int, default=16, help="bytes per stream frame, MiB (default: 16)")


def _run(args: argparse.Namespace) -> int:
    from vllm_ascend.netloader.seed_server import SeedServer, load_checkpoint

    state_dict = load_checkpoint(args.checkpoint)
    server = SeedServer.serving(state_dict, args.host, args.port, args.stream_port, args.chunk_mib << 20)
    server.start()
    manifest = server.stream.manifest
    print(
        f"seed serving {len(manifest)} tensors ({manifest.total_bytes / 2**20:.1f} MiB) from {args.checkpoint} "
        f"at {server.url} (stream port {server.stream.port}); Ctrl-C stops it",
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
