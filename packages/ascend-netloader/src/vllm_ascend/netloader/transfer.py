"""The seed's TCP data plane: tensor bytes as length-prefixed frames, straight from memory.

Every connection starts with the seed's ``CHALLENGE`` frame (a fresh nonce and whether a token is
required); with a token the client answers ``AUTH`` (the nonce's HMAC, :mod:`.security`). Then it
sends one ``TENSOR_REQUEST`` (empty ``names`` = every tensor); the answer is the requested tensors
in manifest order as ``TENSOR`` frames of at most ``chunk_bytes`` each, then ``END``. Anything that
goes wrong (a bad frame, a failed MAC, a request not complete within ``timeout`` seconds) is
answered with one ``ERROR`` frame and the connection is closed. At most ``max_connections`` are
served at once (one thread each); further ones get an ``ERROR`` frame (plain TCP) or are closed
(TLS) at once. Payloads are sent from the tensors' memory without copies (``sendall`` of memoryviews).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Iterator

from vllm_ascend.netloader.manifest import Manifest, TensorEntry
from vllm_ascend.netloader.protocol import (
    BUSY_PREFIX,
    FrameReader,
    MessageType,
    ProtocolError,
    encode,
    encode_prefix,
    error_frame,
)
from vllm_ascend.netloader.security import STREAM_CONTEXT, ServerSecurity, mac_matches

DEFAULT_CHUNK_BYTES = 16 << 20
DEFAULT_MAX_CONNECTIONS = 32
DEFAULT_TIMEOUT = 30.0
_REFUSE_TIMEOUT = 1.0
"""Seconds spent handing a refused connection its ERROR frame."""

logger = logging.getLogger(__name__)


def tensor_frames(
    entries: list[TensorEntry], data: dict[str, memoryview], chunk_bytes: int
) -> Iterator[bytes | memoryview]:
    """Frame prefixes and payload slices for ``entries``, then the END frame."""
    for entry in entries:
        raw = data[entry.name]
        for start in range(0, max(entry.nbytes, 1), chunk_bytes):
            piece = raw[start : start + chunk_bytes]
            header = {
                "name": entry.name,
                "offset": entry.offset + start,
                "start": start,
                "length": len(piece),
            }
            yield encode_prefix(MessageType.TENSOR, header, len(piece))
            if len(piece):
                yield piece
    yield encode_prefix(MessageType.END, {"tensors": len(entries), "bytes": sum(e.nbytes for e in entries)})


class TensorStreamServer:
    """Answers tensor requests on ``host:port`` (``port=0`` picks a free port), one thread per connection.

    ``timeout`` bounds the time a client has to complete its request (TLS handshake and authentication
    included) and the sending of each frame (at most ``chunk_bytes``) to it; ``max_connections`` caps the
    connections served at once.
    """

    def __init__(
        self,
        manifest: Manifest,
        data: dict[str, memoryview],
        host: str = "127.0.0.1",
        port: int = 0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        *,
        security: ServerSecurity | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        if max_connections <= 0:
            raise ValueError(f"max_connections must be positive, got {max_connections}")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self.security = ServerSecurity() if security is None else security
        self.security.check_bind(host)
        self._tls = self.security.server_context()
        self.manifest, self.data, self.chunk_bytes = manifest, data, chunk_bytes
        self.max_connections, self.timeout = max_connections, timeout
        self._listener = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
        self.host, self.port = host, self._listener.getsockname()[1]
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._active = 0
        self._lock = threading.Lock()
        self.refused = 0

    @property
    def tls(self) -> bool:
        return self._tls is not None

    @property
    def active(self) -> int:
        """Connections being served now."""
        with self._lock:
            return self._active

    def start(self) -> TensorStreamServer:
        """Start accepting (once: a started server is returned as is)."""
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._accept_loop, name="netloader-stream", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                admitted = self._active < self.max_connections
                self._active += admitted
            if not admitted:
                self._refuse(conn)
                continue
            try:
                threading.Thread(
                    target=self._serve_counted, args=(conn,), name="netloader-stream-conn", daemon=True
                ).start()
            except RuntimeError:  # the process cannot start another thread: turn the client away
                with self._lock:
                    self._active -= 1
                self._refuse(conn)

    def _refuse(self, conn: socket.socket) -> None:
        """Turn away a connection over the cap without a thread: an ERROR frame (plain TCP), then close."""
        self.refused += 1
        with conn:
            if self._tls is None:
                conn.settimeout(_REFUSE_TIMEOUT)
                message = f"{BUSY_PREFIX} {self.max_connections} connections are being served; retry later"
                with contextlib.suppress(OSError):
                    conn.sendall(error_frame(message))

    def _serve_counted(self, conn: socket.socket) -> None:
        try:
            self._serve(conn)
        finally:
            with self._lock:
                self._active -= 1

    def _serve(self, conn: socket.socket) -> None:
        """Serve one connection; every failure is answered with an ERROR frame (best effort) and a close."""
        deadline = time.monotonic() + self.timeout
        stream: socket.socket = conn
        try:
            conn.settimeout(self.timeout)
            if self._tls is not None:
                stream = self._tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
                stream.do_handshake()
            entries = self._read_request(stream, deadline)
        except ssl.SSLError as exc:
            logger.debug("netloader stream: TLS handshake failed: %s", exc)
            stream.close()
            return
        except Exception as exc:  # a bad peer must never leave a thread traceback behind
            self._answer_error(stream, exc)
            return
        try:
            stream.settimeout(self.timeout)
            for part in tensor_frames(entries, self.data, self.chunk_bytes):
                self._send(stream, part)
        except OSError:  # the client went away or stopped reading: nothing left to serve
            pass
        except Exception as exc:
            self._answer_error(stream, exc)
            return
        finally:
            stream.close()

    def _answer_error(self, stream: socket.socket, exc: Exception) -> None:
        if isinstance(exc, TimeoutError):
            message = f"no complete request within {self.timeout:g} s"
        elif isinstance(exc, ValueError):
            message = str(exc)
        else:
            message = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError, ValueError):
            stream.settimeout(_REFUSE_TIMEOUT)
            stream.sendall(error_frame(message))
        with contextlib.suppress(OSError):
            stream.close()

    def _read_request(self, conn: socket.socket, deadline: float) -> list[TensorEntry]:
        """Challenge, check the client's MAC when a token is set, and read its TENSOR_REQUEST by ``deadline``."""

        def recv_into(buf: memoryview) -> int:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request deadline passed")
            conn.settimeout(left)
            return conn.recv_into(buf)

        token = self.security.token
        nonce = secrets.token_bytes(32)
        conn.sendall(encode(MessageType.CHALLENGE, {"nonce": nonce.hex(), "auth": token is not None}))
        reader = FrameReader(recv_into)
        frame = reader.next()
        if token is not None:
            if frame is None or frame.type is not MessageType.AUTH:
                got = "an empty stream" if frame is None else f"a {frame.type.name} frame"
                raise ProtocolError(f"authentication required: expected an AUTH frame, got {got}")
            if not mac_matches(token, STREAM_CONTEXT, nonce, frame.header["mac"]):
                raise ProtocolError("authentication failed: the MAC does not match this seed's token")
            frame = reader.next()
        if frame is None or frame.type is not MessageType.TENSOR_REQUEST:
            got = "an empty stream" if frame is None else f"a {frame.type.name} frame"
            raise ProtocolError(f"expected a TENSOR_REQUEST frame, got {got}")
        names = frame.header["names"]
        return list(self.manifest.tensors) if not names else self.manifest.select(names)

    def _send(self, conn: socket.socket, part: bytes | memoryview) -> None:
        conn.sendall(part)
