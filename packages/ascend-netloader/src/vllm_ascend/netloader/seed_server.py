"""The seed side: a FastAPI control plane over a state dict, run by uvicorn in a thread.

Endpoints: ``GET /manifest`` (the :class:`~.manifest.Manifest` as JSON), ``GET /tensors/{name}``
(raw bytes; ``start``/``end`` query parameters select a byte range), ``GET /transfer`` (the TCP
port of the :class:`~.transfer.TensorStreamServer` that streams tensors in bulk) and ``GET /health``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, HTTPException, Query, Response

from vllm_ascend.netloader.manifest import Manifest
from vllm_ascend.netloader.protocol import VERSION
from vllm_ascend.netloader.transfer import DEFAULT_CHUNK_BYTES, TensorStreamServer


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files in directory ``path`` (or of one file)."""
    from safetensors import safe_open

    root = Path(path)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else [root]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"no safetensors checkpoint at {root}")
    out: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if name in out:
                    raise ValueError(f"tensor {name!r} appears in more than one file of {root}")
                out[name] = handle.get_tensor(name)
    return out


def create_app(manifest: Manifest, data: dict[str, memoryview], stream_port: int) -> FastAPI:
    """The seed's HTTP control plane for ``manifest``/``data``, pointing at the TCP stream port."""
    manifest_json = manifest.to_dict()
    app = FastAPI(title="vllm-ascend netloader seed")

    @app.get("/health")
    def health() -> dict[str, object]:
        return {"status": "ok", "tensors": len(manifest), "bytes": manifest.total_bytes}

    @app.get("/manifest")
    def get_manifest() -> dict[str, object]:
        return manifest_json

    @app.get("/transfer")
    def transfer() -> dict[str, object]:
        return {"port": stream_port, "protocol": VERSION}

    @app.get("/tensors/{name:path}")
    def get_tensor(name: str, start: int = Query(0), end: int | None = Query(None)) -> Response:
        if name not in manifest:
            raise HTTPException(404, f"tensor {name!r} is not served by this seed")
        size = manifest.entry(name).nbytes
        stop = size if end is None else end
        if not 0 <= start <= stop <= size:
            raise HTTPException(
                416, f"byte range [{start}, {stop}) is outside tensor {name!r} of {size} bytes"
            )
        return Response(content=bytes(data[name][start:stop]), media_type="application/octet-stream")

    return app


class SeedServer:
    """A seed: the HTTP app on ``host:port`` (uvicorn, background thread) and its TCP stream server.

    ``app`` defaults to :func:`create_app` over the stream server's manifest and data.
    """

    def __init__(
        self, stream: TensorStreamServer, host: str = "127.0.0.1", port: int = 0, app: Any = None
    ) -> None:
        import uvicorn

        self.stream = stream
        self.app = create_app(stream.manifest, stream.data, stream.port) if app is None else app
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = host, self._socket.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @classmethod
    def serving(
        cls,
        state_dict: Mapping[str, torch.Tensor],
        host: str = "127.0.0.1",
        port: int = 0,
        stream_port: int = 0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> SeedServer:
        """A seed for ``state_dict`` (bytes and checksums are taken once, here)."""
        manifest, data = Manifest.from_state_dict(state_dict)
        return cls(TensorStreamServer(manifest, data, host, stream_port, chunk_bytes), host, port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> SeedServer:
        self.stream.start()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="netloader-seed", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"seed server on {self.url} exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"seed server on {self.url} did not start within {timeout} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._socket.close()
        self.stream.stop()

    def __enter__(self) -> SeedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
