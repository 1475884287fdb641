"""The seed side: a FastAPI app that serves a state dict, and a uvicorn server in a thread.

Endpoints: ``GET /manifest`` (the :class:`~.manifest.Manifest` as JSON), ``GET /tensors/{name}``
(raw bytes; ``start``/``end`` query parameters select a byte range), ``POST /batch`` (body: one
``TENSOR_REQUEST`` frame; response: ``TENSOR`` frames of at most ``chunk_bytes`` in manifest
order, then ``END``) and ``GET /health``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import StreamingResponse
from vllm_ascend.netloader.manifest import Manifest, ManifestError
from vllm_ascend.netloader.protocol import MEDIA_TYPE, FrameReader, MessageType, ProtocolError, encode_prefix

DEFAULT_CHUNK_BYTES = 16 << 20


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


def create_app(state_dict: Mapping[str, torch.Tensor], chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> FastAPI:
    """The seed app for ``state_dict`` (bytes and checksums are taken once, here)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    manifest, data = Manifest.from_state_dict(state_dict)
    manifest_json = manifest.to_dict()
    app = FastAPI(title="vllm-ascend netloader seed")

    def frames(names: list[str]) -> Iterator[bytes | memoryview]:
        entries = manifest.select(names)
        for entry in entries:
            raw = data[entry.name]
            for start in range(0, max(entry.nbytes, 1), chunk_bytes):
                piece = raw[start : start + chunk_bytes]
                header = {"name": entry.name, "offset": entry.offset + start, "start": start, "length": len(piece)}
                yield encode_prefix(MessageType.TENSOR, header, len(piece))
                if len(piece):
                    yield piece
        total = sum(e.nbytes for e in entries)
        yield encode_prefix(MessageType.END, {"tensors": len(entries), "bytes": total})

    @app.get("/health")
    def health() -> dict[str, object]:
        return {"status": "ok", "tensors": len(manifest), "bytes": manifest.total_bytes}

    @app.get("/manifest")
    def get_manifest() -> dict[str, object]:
        return manifest_json

    @app.get("/tensors/{name:path}")
    def get_tensor(name: str, start: int = Query(0), end: int | None = Query(None)) -> Response:
        if name not in manifest:
            raise HTTPException(404, f"tensor {name!r} is not served by this seed")
        size = manifest.entry(name).nbytes
        stop = size if end is None else end
        if not 0 <= start <= stop <= size:
            raise HTTPException(416, f"byte range [{start}, {stop}) is outside tensor {name!r} of {size} bytes")
        return Response(content=bytes(data[name][start:stop]), media_type="application/octet-stream")

    @app.post("/batch")
    async def batch(request: Request) -> StreamingResponse:
        reader = FrameReader(iter([await request.body()]))
        try:
            frame = reader.next()
            if frame is None or frame.type is not MessageType.TENSOR_REQUEST:
                got = "an empty body" if frame is None else f"a {frame.type.name} frame"
                raise ProtocolError(f"expected one TENSOR_REQUEST frame, got {got}")
            if reader.next() is not None:
                raise ProtocolError("expected one TENSOR_REQUEST frame, got more")
            names = frame.header["names"] or [e.name for e in manifest.tensors]
            manifest.select(names)
        except (ProtocolError, ManifestError) as exc:
            raise HTTPException(400, str(exc)) from None
        return StreamingResponse(frames(names), media_type=MEDIA_TYPE)

    return app


class SeedServer:
    """Run an ASGI ``app`` with uvicorn on a background thread (``port=0`` picks a free port)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.app = app
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = host, self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @classmethod
    def serving(
        cls,
        state_dict: Mapping[str, torch.Tensor],
        host: str = "127.0.0.1",
        port: int = 0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> SeedServer:
        """A server for the seed app of ``state_dict``."""
        return cls(create_app(state_dict, chunk_bytes), host, port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> SeedServer:
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

    def __enter__(self) -> SeedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
