"""The seed side: a FastAPI control plane over a state dict, run by uvicorn in a thread.

Endpoints: ``GET /manifest`` (the :class:`~.manifest.Manifest` as JSON), ``GET /tensors/{name}``
(raw bytes; ``start``/``end`` query parameters select a byte range), ``GET /transfer`` (the TCP
port of the :class:`~.transfer.TensorStreamServer` that streams tensors in bulk, and whether it
uses TLS and a token), ``GET /auth/nonce`` and ``GET /health``. With a token, every endpoint but
``/health`` and ``/auth/nonce`` needs the header ``X-Netloader-Auth: <nonce>:<mac>`` over a fresh
single-use nonce (:mod:`.security`); with a certificate, both ports speak TLS.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Response

from vllm_ascend.netloader.manifest import Manifest
from vllm_ascend.netloader.protocol import VERSION
from vllm_ascend.netloader.security import AUTH_HEADER, HTTP_CONTEXT, NonceBook, ServerSecurity, mac_matches
from vllm_ascend.netloader.transfer import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TIMEOUT,
    TensorStreamServer,
)


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


def create_app(
    manifest: Manifest,
    data: dict[str, memoryview],
    stream_port: int,
    token: bytes | None = None,
    stream_tls: bool = False,
) -> FastAPI:
    """The seed's HTTP control plane for ``manifest``/``data``, pointing at the TCP stream port.

    With ``token``, requests must carry a MAC over a nonce from ``GET /auth/nonce``.
    """
    manifest_json = manifest.to_dict()
    app = FastAPI(title="vllm-ascend netloader seed")
    nonces = NonceBook()

    def authorized(credentials: str | None = Header(None, alias=AUTH_HEADER)) -> None:
        if token is None:
            return
        if credentials is None:
            raise HTTPException(401, f"this seed requires a token: send {AUTH_HEADER}: <nonce>:<mac>")
        nonce_hex, _, answer = credentials.partition(":")
        try:
            nonce = bytes.fromhex(nonce_hex)
        except ValueError:
            nonce = b""
        if not nonces.consume(nonce) or not mac_matches(token, HTTP_CONTEXT, nonce, answer):
            raise HTTPException(401, "authentication failed: unknown or used nonce, or a wrong MAC")

    guarded = [Depends(authorized)]

    @app.get("/health")
    def health() -> dict[str, object]:
        return {"status": "ok", "tensors": len(manifest), "bytes": manifest.total_bytes}

    @app.get("/auth/nonce")
    def auth_nonce() -> dict[str, object]:
        return {"nonce": nonces.issue().hex(), "auth": token is not None}

    @app.get("/manifest", dependencies=guarded)
    def get_manifest() -> dict[str, object]:
        return manifest_json

    @app.get("/transfer", dependencies=guarded)
    def transfer() -> dict[str, object]:
        return {"port": stream_port, "protocol": VERSION, "tls": stream_tls, "auth": token is not None}

    @app.get("/tensors/{name:path}", dependencies=guarded)
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


def _deadline_protocol(deadline: float) -> type:
    """uvicorn's h11 protocol that also closes a connection without a whole request head ``deadline``
    seconds after it opened or after its last response (uvicorn itself only times idle keep-alive)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class DeadlineH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(deadline, self._expire)

        def _expire(self) -> None:
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

    return DeadlineH11Protocol


class SeedServer:
    """A seed: the HTTP app on ``host:port`` (uvicorn, background thread) and its TCP stream server.

    ``app`` defaults to :func:`create_app` over the stream server's manifest and data. Both ports use
    the stream server's :class:`~.security.ServerSecurity` (token and TLS certificate) and its
    connection cap.
    """

    def __init__(
        self, stream: TensorStreamServer, host: str = "127.0.0.1", port: int = 0, app: Any = None
    ) -> None:
        import uvicorn

        self.stream = stream
        self.security = stream.security
        self.security.check_bind(host)
        if app is None:
            app = create_app(stream.manifest, stream.data, stream.port, self.security.token, stream.tls)
        self.app = app
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = host, self._socket.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http=_deadline_protocol(stream.timeout),
            limit_concurrency=stream.max_connections,
            timeout_keep_alive=max(1, int(stream.timeout)),
            ssl_certfile=self.security.certfile,
            ssl_keyfile=self.security.keyfile,
        )
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
        *,
        security: ServerSecurity | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> SeedServer:
        """A seed for ``state_dict`` (bytes and checksums are taken once, here)."""
        (security or ServerSecurity()).check_bind(host)  # before hashing a large state dict
        manifest, data = Manifest.from_state_dict(state_dict)
        stream = TensorStreamServer(
            manifest,
            data,
            host,
            stream_port,
            chunk_bytes,
            security=security,
            max_connections=max_connections,
            timeout=timeout,
        )
        return cls(stream, host, port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.security.tls else 'http'}://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> SeedServer:
        """Start both ports (a started seed is returned as is, so ``with`` works on one too)."""
        if self._thread is not None:
            return self
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
