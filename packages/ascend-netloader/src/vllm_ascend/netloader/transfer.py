"""The seed's TCP data plane: tensor bytes as length-prefixed frames, straight from memory.

A connection carries one ``TENSOR_REQUEST`` (empty ``names`` = every tensor); the answer is the
requested tensors in manifest order as ``TENSOR`` frames of at most ``chunk_bytes`` each, then
``END``. A bad request is answered with one ``ERROR`` frame. Payloads are sent from the tensors'
memory without copies (``socket.sendall`` of memoryviews).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from vllm_ascend.netloader.manifest import Manifest, ManifestError, TensorEntry
from vllm_ascend.netloader.protocol import FrameReader, MessageType, ProtocolError, encode, encode_prefix

DEFAULT_CHUNK_BYTES = 16 << 20


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
    """Answers tensor requests on ``host:port`` (``port=0`` picks a free port) from a thread per connection."""

    def __init__(
        self,
        manifest: Manifest,
        data: dict[str, memoryview],
        host: str = "127.0.0.1",
        port: int = 0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self.manifest, self.data, self.chunk_bytes = manifest, data, chunk_bytes
        self._listener = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
        self.host, self.port = host, self._listener.getsockname()[1]
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> TensorStreamServer:
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
            threading.Thread(
                target=self._serve, args=(conn,), name="netloader-stream-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                entries = self._read_request(conn)
            except (ProtocolError, ManifestError) as exc:
                with contextlib.suppress(OSError):
                    conn.sendall(encode(MessageType.ERROR, {"message": str(exc)}))
                return
            except OSError:
                return
            with contextlib.suppress(OSError):  # the client went away: nothing left to serve
                for part in tensor_frames(entries, self.data, self.chunk_bytes):
                    self._send(conn, part)

    def _read_request(self, conn: socket.socket) -> list[TensorEntry]:
        frame = FrameReader(conn.recv_into).next()
        if frame is None or frame.type is not MessageType.TENSOR_REQUEST:
            got = "an empty stream" if frame is None else f"a {frame.type.name} frame"
            raise ProtocolError(f"expected a TENSOR_REQUEST frame, got {got}")
        names = frame.header["names"]
        return list(self.manifest.tensors) if not names else self.manifest.select(names)

    def _send(self, conn: socket.socket, part: bytes | memoryview) -> None:
        conn.sendall(part)
