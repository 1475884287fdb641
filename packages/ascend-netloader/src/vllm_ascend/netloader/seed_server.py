"""The seed side: a FastAPI control plane over a state dict, run by uvicorn in a thread.

Endpoints: ``GET /manifest`` (the :class:`~.manifest.Manifest` as JSON), ``GET /tensors/{name}``
(raw bytes; ``start``/``end`` query parameters select a byte range), ``GET /transfer`` (the TCP
port of the :class:`~.transfer.TensorStreamServer` that streams tensors in bulk, and whether it
uses TLS and a token), ``GET /auth/nonce`` and ``GET /health``. With a token, every endpoint but
``/health`` and ``/auth/nonce`` needs the header ``X-Netloader-Auth: <nonce>:<mac>`` over a fresh
single-use nonce (:mod:`.security`); with a certificate, both ports speak TLS.

Like the stream port, the HTTP port keeps unauthenticated peers from crowding out authenticated
ones (:mod:`.admission`): a connection without a request in flight is pending (bounded per peer
address and in all, the oldest dropped first, closed ``handshake_timeout`` seconds after it opened
or after its last response), and only authenticated requests count against ``max_connections``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import ssl
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, HTTPException, Query, Response
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from vllm_ascend.netloader.admission import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_PER_PEER,
    PendingBook,
)
from vllm_ascend.netloader.manifest import Manifest
from vllm_ascend.netloader.protocol import BUSY_PREFIX, VERSION
from vllm_ascend.netloader.security import (
    AUTH_HEADER,
    HTTP_CONTEXT,
    HttpNonces,
    ServerSecurity,
    is_mac,
    mac_matches,
)
from vllm_ascend.netloader.transfer import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TIMEOUT,
    TensorStreamServer,
    listen,
)

logger = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/auth/nonce"})
"""The endpoints that need no token (and do not count against the request cap)."""
_NONCE_HEX = re.compile(rf"[0-9a-fA-F]{{{2 * HttpNonces.SIZE}}}")


class CheckpointError(ValueError):
    """A checkpoint that cannot be served: missing, without safetensors files, unreadable or malformed."""


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files in directory ``path`` (or of one file)."""
    from safetensors import SafetensorError, safe_open

    root = Path(path)
    try:
        if root.is_dir():
            files = sorted(root.glob("*.safetensors"))
            if not files:
                others = sorted(p.name for p in root.iterdir())
                found = (
                    f"found {', '.join(others[:3])}{', …' if len(others) > 3 else ''}"
                    if others
                    else "it is empty"
                )
                raise CheckpointError(f"directory {root} holds no *.safetensors files ({found})")
        elif root.exists():
            files = [root]
        else:
            raise CheckpointError(f"{root} does not exist")
        out: dict[str, torch.Tensor] = {}
        owner: dict[str, str] = {}
        for file in files:
            if not file.is_file():
                raise CheckpointError(f"{file} is not a regular file")
            try:
                with safe_open(str(file), framework="pt") as handle:
                    for name in handle.keys():
                        if name in out:
                            raise CheckpointError(
                                f"tensor {name!r} is in both {owner[name]} and {file.name} of {root}"
                            )
                        out[name], owner[name] = handle.get_tensor(name), file.name
            except SafetensorError as exc:
                raise CheckpointError(f"{file} is not a valid safetensors file ({exc})") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {exc.filename or root}: {exc.strerror or exc}") from None
    return out


class RequestGate:
    """ASGI wrapper of the seed's app: authenticates each request but :data:`OPEN_PATHS` (with a token),
    then admits at most ``max_requests`` at once (503 ``seed busy`` past that). Unauthenticated requests
    are answered here, so they never take a slot."""

    def __init__(self, app: ASGIApp, token: bytes | None, nonces: HttpNonces, max_requests: int) -> None:
        self.app, self.token, self.nonces, self.max_requests = app, token, nonces, max_requests
        self.active = 0  # the event loop's thread only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        status, problem = self._authenticate(scope)
        if problem is None and self.active >= self.max_requests:
            status, problem = 503, f"{BUSY_PREFIX} {self.max_requests} requests are being served; retry later"
        if problem is not None:
            await JSONResponse({"detail": problem}, status_code=status)(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1

    def _authenticate(self, scope: Scope) -> tuple[int, str | None]:
        """``(status, problem)``: problem None when the request may go on."""
        if self.token is None:
            return 200, None
        header = AUTH_HEADER.lower().encode()
        values = [value for name, value in scope["headers"] if name == header]
        if not values:
            return 401, f"this seed requires a token: send {AUTH_HEADER}: <nonce>:<mac>"
        nonce_hex, _, answer = values[0].decode("latin-1").partition(":")
        if not _NONCE_HEX.fullmatch(nonce_hex) or not is_mac(answer):
            return 401, (
                f"authentication failed: {AUTH_HEADER} must be <nonce>:<mac>, a nonce from GET /auth/nonce "
                "and its MAC as 64 hexadecimal digits"
            )
        nonce = bytes.fromhex(nonce_hex)
        problem = self.nonces.check(nonce)
        if problem is None and not mac_matches(self.token, HTTP_CONTEXT, nonce, answer):
            problem = "the MAC does not match this seed's token"
        if problem is None:
            problem = self.nonces.use(nonce)
        if problem is None:
            return 200, None
        if problem.startswith(BUSY_PREFIX):
            return 503, problem
        return 401, f"authentication failed: {problem}"


def create_app(
    manifest: Manifest,
    data: dict[str, memoryview],
    stream_port: int,
    token: bytes | None = None,
    stream_tls: bool = False,
    *,
    max_requests: int = DEFAULT_MAX_CONNECTIONS,
    nonce_ttl: float = 60.0,
) -> FastAPI:
    """The seed's HTTP control plane for ``manifest``/``data``, pointing at the TCP stream port.

    With ``token``, requests must carry a MAC over a nonce from ``GET /auth/nonce`` (valid ``nonce_ttl``
    seconds, once); at most ``max_requests`` authenticated requests are served at once (:class:`RequestGate`).
    """
    manifest_json = manifest.to_dict()
    app = FastAPI(title="vllm-ascend netloader seed", docs_url=None, redoc_url=None, openapi_url=None)
    nonces = HttpNonces(ttl=nonce_ttl)
    app.add_middleware(RequestGate, token=token, nonces=nonces, max_requests=max_requests)

    # the cheap endpoints are async (answered on the event loop); the others run in FastAPI's thread pool
    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"status": "ok", "tensors": len(manifest), "bytes": manifest.total_bytes}

    @app.get("/auth/nonce")
    async def auth_nonce() -> dict[str, object]:
        return {"nonce": nonces.issue().hex(), "auth": token is not None}

    @app.get("/manifest")
    def get_manifest() -> dict[str, object]:
        return manifest_json

    @app.get("/transfer")
    async def transfer() -> dict[str, object]:
        return {"port": stream_port, "protocol": VERSION, "tls": stream_tls, "auth": token is not None}

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


def _seed_protocol(
    book: PendingBook, handshake_timeout: float, write_timeout: float, tls: ssl.SSLContext | None
) -> type:
    """uvicorn's h11 protocol for the seed's HTTP port.

    A connection without a request in flight is pending in ``book`` and is closed ``handshake_timeout``
    seconds after it opened (TLS handshake included) or after its last response; one whose client does
    not take a response for ``write_timeout`` seconds is aborted. TLS is started here (``start_tls``)
    rather than by the server, so that connections still in their handshake are pending too.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    late = f"no complete request within {handshake_timeout:g} s"

    class SeedH11Protocol(H11Protocol):
        _raw: asyncio.Transport
        _peer = "unknown"
        _closed = False
        _deadline: asyncio.TimerHandle | None = None
        _stall: asyncio.TimerHandle | None = None
        _tls_task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference to tasks
        _early: list[bytes]

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._raw, self._early = transport, []
            peer = transport.get_extra_info("peername")
            self._peer = str(peer[0]) if peer else "unknown"
            self._pend()
            if tls is None:
                super().connection_made(transport)
                return
            transport.pause_reading()  # the handshake below reads first
            self.connections.add(self)  # so that uvicorn's shutdown waits for (and closes) it too
            self._tls_task = self.loop.create_task(self._start_tls())

        async def _start_tls(self) -> None:
            assert tls is not None
            try:
                secured = await self.loop.start_tls(
                    self._raw, self, tls, server_side=True, ssl_handshake_timeout=handshake_timeout
                )
            except Exception as exc:  # a failed handshake: start_tls closed the transport
                logger.debug("netloader seed: TLS handshake with %s failed: %s", self._peer, exc)
                secured = None
            if secured is None or self._closed:  # failed, or closed (dropped) before it completed
                self._forget()
                return
            super().connection_made(secured)  # type: ignore[arg-type]
            early, self._early = self._early, []
            for data in early:
                super().data_received(data)

        def data_received(self, data: bytes) -> None:
            if self.transport is None:  # decrypted before _start_tls resumed
                self._early.append(data)
            else:
                super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:  # a request is in flight
                book.release(self)
                self._cancel("_deadline")

        def on_response_complete(self) -> None:
            self._pend()
            super().on_response_complete()

        def pause_writing(self) -> None:
            super().pause_writing()
            self._cancel("_stall")
            self._stall = self.loop.call_later(write_timeout, self._raw.abort)

        def resume_writing(self) -> None:
            self._cancel("_stall")
            super().resume_writing()

        def connection_lost(self, exc: Exception | None) -> None:
            self._closed = True
            self._forget()
            if self.transport is not None:
                super().connection_lost(exc)

        def shutdown(self) -> None:
            if self.transport is None:  # still in its TLS handshake
                self._raw.close()
            else:
                super().shutdown()

        def _forget(self) -> None:
            self.connections.discard(self)
            book.release(self)
            self._cancel("_deadline")
            self._cancel("_stall")

        def _pend(self) -> None:
            """Wait for a request (again): pending in the book, closed at the deadline."""
            book.admit(self, self._peer, self._drop)
            self._cancel("_deadline")
            self._deadline = self.loop.call_later(handshake_timeout, self._expire)

        def _expire(self) -> None:
            if book.release(self):
                self._drop(late)

        def _drop(self, reason: str) -> None:
            logger.debug("netloader seed: closing a connection from %s: %s", self._peer, reason)
            if self._raw.get_write_buffer_size():
                self._raw.abort()  # a response the peer never took: do not wait for it to
            else:
                self._raw.close()

        def _cancel(self, timer: str) -> None:
            handle = getattr(self, timer)
            if handle is not None:
                handle.cancel()
                setattr(self, timer, None)

    return SeedH11Protocol


class SeedServer:
    """A seed: the HTTP app on ``host:port`` (uvicorn, background thread) and its TCP stream server.

    ``app`` defaults to :func:`create_app` over the stream server's manifest and data. Both ports use
    the stream server's :class:`~.security.ServerSecurity` (token and TLS certificate) and its limits
    (``max_connections``, ``timeout``, ``handshake_timeout``, ``max_pending``, ``max_pending_per_peer``).
    """

    def __init__(
        self, stream: TensorStreamServer, host: str = "127.0.0.1", port: int = 0, app: Any = None
    ) -> None:
        import uvicorn

        self.stream = stream
        self.security = stream.security
        self.security.check_bind(host)
        if app is None:
            app = create_app(
                stream.manifest,
                stream.data,
                stream.port,
                self.security.token,
                stream.tls,
                max_requests=stream.max_connections,
            )
        self.app = app
        self._socket = listen(host, port, "HTTP port")
        self.host, self.port = host, self._socket.getsockname()[1]
        self._book = PendingBook(stream.max_pending, stream.max_pending_per_peer)
        protocol = _seed_protocol(
            self._book, stream.handshake_timeout, stream.timeout, self.security.server_context()
        )
        config = uvicorn.Config(
            self.app,
            loop="asyncio",  # the TLS hand-off in the protocol is asyncio's start_tls
            log_level="warning",
            access_log=False,
            lifespan="off",
            http=protocol,
            timeout_keep_alive=max(1, math.ceil(stream.handshake_timeout)),
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
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_per_peer: int = DEFAULT_MAX_PENDING_PER_PEER,
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
            handshake_timeout=handshake_timeout,
            max_pending=max_pending,
            max_pending_per_peer=max_pending_per_peer,
        )
        try:
            return cls(stream, host, port)
        except BaseException:
            stream.stop()  # close the stream port it opened
            raise

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.security.tls else 'http'}://{host}:{self.port}"

    @property
    def pending(self) -> int:
        """HTTP connections without a request in flight."""
        return len(self._book)

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
