"""The seed's TCP data plane: tensor bytes as length-prefixed frames, straight from memory.

Every connection starts with the seed's ``CHALLENGE`` frame (a fresh nonce and whether a token is
required); with a token the client answers ``AUTH`` (the nonce's HMAC, :mod:`.security`). Then it
sends one ``TENSOR_REQUEST`` (empty ``names`` = every tensor); the answer is the requested tensors
in manifest order as ``TENSOR`` frames of at most ``chunk_bytes`` each, then ``END``. Anything that
goes wrong (a bad frame, a failed MAC, a request not complete in time) is answered with one
``ERROR`` frame and the connection is closed.

Until its request is complete (TLS handshake and authentication included) a connection is pending
(:mod:`.admission`): it has ``handshake_timeout`` seconds, and pending connections are bounded per
peer address and in all, the oldest dropped first. Only then does it take one of the
``max_connections`` serving slots (one thread each); without a free slot it is answered ``seed busy``.
Payloads are sent from the tensors' memory without copies (``sendall`` of memoryviews).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import secrets
import socket
import ssl
import threading
from collections.abc import Iterator

from vllm_ascend.netloader.admission import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_PER_PEER,
    PendingBook,
    check_limits,
)
from vllm_ascend.netloader.manifest import Manifest, ManifestError, TensorEntry
from vllm_ascend.netloader.protocol import (
    BUSY_PREFIX,
    FrameReader,
    MessageType,
    ProtocolError,
    encode,
    encode_prefix,
    error_frame,
)
from vllm_ascend.netloader.security import (
    NONCE_BYTES,
    STREAM_CONTEXT,
    ServerSecurity,
    is_mac,
    mac_matches,
)

DEFAULT_CHUNK_BYTES = 16 << 20
DEFAULT_MAX_CONNECTIONS = 32
DEFAULT_TIMEOUT = 30.0
STREAM_PORT = "stream port"
"""How :class:`ListenError` names the stream port (the HTTP port is ``HTTP port``)."""
_ERROR_SEND_TIMEOUT = 1.0
"""Seconds spent handing a connection its ERROR frame before closing it."""

logger = logging.getLogger(__name__)


class ListenError(OSError):
    """A port of the seed could not be opened. ``what`` names the port; ``port_at_fault`` tells a port in use
    (or privileged) from a host that cannot be listened on."""

    def __init__(self, message: str, what: str, port_at_fault: bool) -> None:
        super().__init__(message)
        self.what, self.port_at_fault = what, port_at_fault


def listen(host: str, port: int, what: str) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port); :class:`ListenError` when it cannot be."""
    # proto=IPPROTO_TCP: asyncio then sets TCP_NODELAY on the HTTP port's connections (no Nagle delays)
    sock = socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        return sock
    except OSError as exc:
        sock.close()
        in_use = exc.errno == errno.EADDRINUSE
        reason = "the address is already in use" if in_use else (exc.strerror or str(exc))
        raise ListenError(
            f"cannot listen on {host}:{port} for the {what}: {reason}",
            what,
            in_use or isinstance(exc, PermissionError),
        ) from None


class _Pending:
    """A connection before its request is complete: its socket (TLS-wrapped once that starts) and why it
    was dropped, if it was."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock, self.peer = sock, peer
        self.reason = ""
        self._lock = threading.Lock()

    def wrap(self, context: ssl.SSLContext) -> ssl.SSLSocket:
        with self._lock:
            wrapped = context.wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
            self.sock = wrapped
        return wrapped

    def drop(self, reason: str) -> None:
        """Stop reading from the peer (a blocked read returns at once); the handler then says ``reason``."""
        with self._lock:
            self.reason = reason
            with contextlib.suppress(OSError):  # the plain shutdown: SSLSocket.shutdown would unwrap TLS
                socket.socket.shutdown(self.sock, socket.SHUT_RD)


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

    ``handshake_timeout`` bounds the time from connecting to a complete request (TLS handshake and
    authentication included); ``max_pending``/``max_pending_per_peer`` bound the connections in that
    state (:mod:`.admission`). ``max_connections`` caps the requests served at once, and each frame
    (at most ``chunk_bytes``) must be taken by the client within ``timeout`` seconds.
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
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_per_peer: int = DEFAULT_MAX_PENDING_PER_PEER,
    ) -> None:
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
        check_limits(max_connections, timeout, handshake_timeout, max_pending, max_pending_per_peer)
        self.security = ServerSecurity() if security is None else security
        self.security.check_bind(host)
        self._tls = self.security.server_context()
        self.manifest, self.data, self.chunk_bytes = manifest, data, chunk_bytes
        self.max_connections, self.timeout = max_connections, timeout
        self.handshake_timeout = handshake_timeout
        self.max_pending, self.max_pending_per_peer = max_pending, max_pending_per_peer
        self._late = f"no complete request within {handshake_timeout:g} s"
        self._listener = listen(host, port, STREAM_PORT)
        self.host, self.port = host, self._listener.getsockname()[1]
        self._book = PendingBook(max_pending, max_pending_per_peer)
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._active = 0
        self._lock = threading.Lock()
        self.refused = 0
        """Authenticated requests answered ``seed busy`` (every serving slot taken)."""

    @property
    def tls(self) -> bool:
        return self._tls is not None

    @property
    def active(self) -> int:
        """Requests being served now."""
        with self._lock:
            return self._active

    @property
    def pending(self) -> int:
        """Connections that have not completed their request yet."""
        return len(self._book)

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
        self._book.drop_all("the seed is stopping")

    def _accept_loop(self) -> None:
        """Accept connections, and drop pending ones whose handshake deadline passed (between accepts)."""
        while not self._closing.is_set():
            wait = self._book.expire(self.handshake_timeout, self._late)
            try:
                self._listener.settimeout(None if wait is None else max(wait, 0.001))
                conn, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(self.handshake_timeout)
            pending = _Pending(conn, str(address[0]))
            self._book.admit(pending, pending.peer, pending.drop)
            try:
                threading.Thread(
                    target=self._handle, args=(pending,), name="netloader-stream-conn", daemon=True
                ).start()
            except RuntimeError:  # the process cannot start another thread: turn the client away
                self._book.release(pending)
                self._answer_error(conn, f"{BUSY_PREFIX} the seed cannot start another thread; retry later")

    def _handle(self, pending: _Pending) -> None:
        """Take one connection from its CHALLENGE to a serving slot (or an ERROR frame and a close)."""
        stream: socket.socket = pending.sock
        if self._tls is not None:
            try:
                stream = pending.wrap(self._tls)
                stream.do_handshake()
            except (OSError, ValueError) as exc:
                logger.debug("netloader stream: TLS handshake with %s failed: %s", pending.peer, exc)
                self._book.release(pending)
                stream.close()
                return
        problem: str | None = None  # what to answer instead of serving ("": close without a word)
        try:
            entries = self._read_request(stream)
        except TimeoutError:
            problem = self._late
        except OSError:
            problem = ""  # the peer went away: nobody to answer
        except (ProtocolError, ManifestError) as exc:  # messages of our own
            problem = str(exc)
        except Exception:  # a bug must neither kill the thread loudly nor reach an unauthenticated peer
            logger.exception("netloader stream: unexpected error reading a request from %s", pending.peer)
            problem = "internal error of the seed while reading the request (see its log)"
        if not self._book.release(pending):  # dropped: too many pending, past the deadline, or stopping
            problem = pending.reason
        if problem is not None:
            self._answer_error(stream, problem)
            return
        with self._lock:
            admitted = self._active < self.max_connections
            self._active += admitted
            self.refused += not admitted
        if not admitted:
            message = f"{BUSY_PREFIX} {self.max_connections} requests are being served; retry later"
            self._answer_error(stream, message)
            return
        try:
            self._serve(stream, entries)
        finally:
            with self._lock:
                self._active -= 1

    def _serve(self, stream: socket.socket, entries: list[TensorEntry]) -> None:
        """Send ``entries`` to an authenticated client; a failure is answered with an ERROR frame (best effort)."""
        try:
            stream.settimeout(self.timeout)
            for part in tensor_frames(entries, self.data, self.chunk_bytes):
                self._send(stream, part)
        except OSError:  # the client went away or stopped reading: nothing left to serve
            pass
        except Exception as exc:
            self._answer_error(
                stream, str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            )
        finally:
            stream.close()

    def _answer_error(self, stream: socket.socket, message: str) -> None:
        """Send one ERROR frame (none for an empty ``message``), then close."""
        with contextlib.suppress(OSError, ValueError):
            if message:
                stream.settimeout(_ERROR_SEND_TIMEOUT)
                stream.sendall(error_frame(message))
        with contextlib.suppress(OSError):
            stream.close()

    def _read_request(self, conn: socket.socket) -> list[TensorEntry]:
        """Challenge, check the client's MAC when a token is set, and read its TENSOR_REQUEST."""
        token = self.security.token
        nonce = secrets.token_bytes(NONCE_BYTES)
        conn.sendall(encode(MessageType.CHALLENGE, {"nonce": nonce.hex(), "auth": token is not None}))
        reader = FrameReader(conn.recv_into)
        frame = reader.next()
        if token is not None:
            if frame is None or frame.type is not MessageType.AUTH:
                got = "an empty stream" if frame is None else f"a {frame.type.name} frame"
                raise ProtocolError(f"authentication required: expected an AUTH frame, got {got}")
            if not is_mac(frame.header["mac"]):
                raise ProtocolError(
                    "authentication failed: the AUTH frame's 'mac' must be 64 hexadecimal digits (HMAC-SHA256)"
                )
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
