"""The loading side: fetch a seed's manifest and tensors, verify checksums, retry transient failures.

One ``httpx.Client`` is reused for the HTTP control requests. Tensors are streamed over the
seed's TCP stream port (:mod:`.transfer`) and received straight into the destination memory;
each tensor's sha256 is checked before it is handed out, and a tensor whose bytes do not match
is fetched again on its own (``GET /tensors/{name}``). Connection
failures, timeouts and 5xx answers are retried ``retries`` times with jittered exponential back-off
(at most :data:`MAX_BACKOFF` seconds a wait), after which :class:`PeerUnavailable` says why, so a
caller can fall back to another loader. A busy seed (a ``seed busy`` ERROR frame, or 503) is alive
and serving others, so it is waited for instead, up to ``busy_wait`` seconds, without using up ``retries``.

With ``token`` the client authenticates on both channels (HMAC over the seed's nonce, see
:mod:`.security`). An ``https://`` source needs ``ca_file`` (the CA that signed the seed's
certificate) and then uses TLS on the stream port too; a seed whose stream is not TLS is refused.
Everything a seed sends is parsed fail-closed (size, depth and integer bounds).
"""

from __future__ import annotations

import hashlib
import random
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import torch

from vllm_ascend.netloader.manifest import Manifest, ManifestError, TensorEntry
from vllm_ascend.netloader.protocol import (
    BUSY_PREFIX,
    VERSION,
    FrameReader,
    MessageType,
    ProtocolError,
    encode,
    loads_bounded,
    truncate_message,
)
from vllm_ascend.netloader.security import (
    AUTH_HEADER,
    HTTP_CONTEXT,
    STREAM_CONTEXT,
    SecurityError,
    check_token,
    client_context,
    mac,
)

T = TypeVar("T")
_TRANSIENT = (httpx.HTTPStatusError, httpx.TransportError, ProtocolError, OSError)
"""Failures worth retrying (4xx answers are refused in :meth:`_Attempts.failed`)."""
MAX_MANIFEST_BYTES = 256 << 20
MAX_CONTROL_BYTES = 64 << 10
MAX_BACKOFF = 2.0
"""The longest wait between two attempts, in seconds."""
_MIN_BUSY_BACKOFF = 0.05


class NetLoaderError(RuntimeError):
    """Weights could not be obtained from the seed."""


class PeerUnavailable(NetLoaderError):
    """The seed could not be reached or kept failing after the retries."""


class ChecksumError(NetLoaderError):
    """A tensor's bytes kept disagreeing with the manifest's sha256."""


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")


def _is_busy(exc: Exception) -> bool:
    """A seed answering that it is busy: a ``seed busy`` ERROR frame, or HTTP 503."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code == 503
    return isinstance(exc, ProtocolError) and str(exc).startswith(BUSY_PREFIX)


class _Attempts:
    """Retry bookkeeping of one operation of ``client``: failures, and how long the seed has been busy."""

    def __init__(self, client: SeedClient, what: str) -> None:
        self.client, self.what = client, what
        self.failures = 0
        self.busy = 0
        self.busy_until: float | None = None

    def failed(self, exc: Exception) -> None:
        """Raise when ``exc`` is final or the attempts are used up; otherwise wait before the next one."""
        client = self.client
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code < 500:
            raise NetLoaderError(
                f"{self.what}: seed {client.source} answered {_describe(exc.response)}"
            ) from None
        if _is_busy(exc):
            now = time.monotonic()
            if self.busy_until is None:
                self.busy_until = now + client.busy_wait
            left = self.busy_until - now
            if left <= 0:
                last = _describe(exc.response) if isinstance(exc, httpx.HTTPStatusError) else str(exc)
                raise PeerUnavailable(
                    f"{self.what}: seed {client.source} stayed busy for {client.busy_wait:g} s; last answer: {last}"
                ) from None
            self.busy += 1
            delay = min(max(client.backoff, _MIN_BUSY_BACKOFF) * 2 ** (self.busy - 1), MAX_BACKOFF, left)
        else:
            self.failures += 1
            if self.failures > client.retries:
                raise PeerUnavailable(
                    f"{self.what}: seed {client.source} failed {self.failures} attempts; "
                    f"last error: {type(exc).__name__}: {exc}"
                ) from None
            delay = min(client.backoff * 2 ** (self.failures - 1), MAX_BACKOFF)
        time.sleep(delay * random.uniform(0.5, 1.0))


class SeedClient:
    """Client of one seed at ``source`` (``http://host:port``, or ``https://`` with ``ca_file``).

    ``timeout`` bounds each request; failures are retried ``retries`` times, ``backoff`` seconds after
    the first (doubling, jittered); a busy seed is waited for up to ``busy_wait`` seconds (default: ``timeout``).
    """

    def __init__(
        self,
        source: str,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.2,
        *,
        token: str | bytes | None = None,
        ca_file: str | None = None,
        busy_wait: float | None = None,
    ) -> None:
        self.source = source.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.busy_wait = timeout if busy_wait is None else busy_wait
        self._token = None if token is None else check_token(token)
        scheme = urlsplit(self.source).scheme
        if scheme == "https" and ca_file is None:
            raise SecurityError(
                f"source {self.source} is https:// but no CA file is configured: the seed's certificate "
                "cannot be verified (set the CA that signed it, or use an http:// source on a trusted network)"
            )
        if scheme != "https" and ca_file is not None:
            raise SecurityError(
                f"a TLS CA file ({ca_file}) is configured but source {self.source} is not https://; "
                "use https:// so both channels are encrypted"
            )
        self._tls = None if ca_file is None else client_context(ca_file)
        verify: ssl.SSLContext | bool = True if self._tls is None else self._tls
        self._http = httpx.Client(base_url=self.source, timeout=timeout, verify=verify)
        self._manifest: Manifest | None = None
        self._stream_address: tuple[str, int] | None = None
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netloader-sha256")

    def close(self) -> None:
        self._http.close()
        self._hasher.shutdown(wait=True)

    def __enter__(self) -> SeedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport --------------------------------------------------------------------------

    def _retrying(self, what: str, action: Callable[[], T]) -> T:
        """Run ``action``, retrying transport errors, 5xx answers, a busy seed and truncated streams."""
        attempts = _Attempts(self, what)
        while True:
            try:
                return action()
            except _TRANSIENT as exc:
                attempts.failed(exc)

    def _get(self, path: str, limit: int, **params: Any) -> httpx.Response:
        """``GET path``, its answer read only up to ``limit`` bytes (a larger one is a ProtocolError)."""
        headers = self._auth_headers() if self._token is not None else None
        return self._bounded_get(path, limit, params or None, headers)

    def _bounded_get(
        self, path: str, limit: int, params: dict[str, Any] | None, headers: dict[str, str] | None
    ) -> httpx.Response:
        body = bytearray()
        with self._http.stream("GET", path, params=params, headers=headers) as response:
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > limit:
                    raise ProtocolError(f"GET {path}: the seed's answer exceeds {limit} bytes")
        answer = httpx.Response(response.status_code, content=bytes(body), request=response.request)
        answer.raise_for_status()
        return answer

    def _auth_headers(self) -> dict[str, str]:
        """A fresh nonce's MAC for one HTTP request (nothing when the seed asks for no token)."""
        assert self._token is not None
        response = self._bounded_get("/auth/nonce", MAX_CONTROL_BYTES, None, None)
        info = _json(response, "GET /auth/nonce answer")
        nonce = info.get("nonce") if isinstance(info, dict) else None
        try:
            raw = bytes.fromhex(nonce) if isinstance(nonce, str) else b""
        except ValueError:
            raw = b""
        if not raw:
            raise ProtocolError(f"GET /auth/nonce answered {info!r}: expected {{'nonce': hex, 'auth': bool}}")
        if info.get("auth") is False:
            return {}
        return {AUTH_HEADER: f"{nonce}:{mac(self._token, HTTP_CONTEXT, raw)}"}

    # -- manifest ---------------------------------------------------------------------------

    def fetch_manifest(self) -> Manifest:
        """The seed's validated manifest (cached for the client's lifetime)."""
        if self._manifest is None:
            response = self._retrying(
                "fetching the manifest", lambda: self._get("/manifest", MAX_MANIFEST_BYTES)
            )
            try:
                data = _json(response, f"manifest from {self.source}")
            except ProtocolError as exc:
                raise ManifestError([str(exc)]) from None
            self._manifest = Manifest.from_dict(data)
        return self._manifest

    # -- tensors ----------------------------------------------------------------------------

    def fetch_tensor(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """One tensor through ``GET /tensors/{name}``, verified (into ``out`` when given)."""
        entry = self.fetch_manifest().entry(name)
        target = entry.empty() if out is None else out
        entry.check_target(target)
        staging = target if _is_direct(target) else entry.empty()
        view = byte_view(staging)
        for attempt in range(self.retries + 1):
            raw = self._retrying(
                f"fetching tensor {name!r}", lambda: self._get(f"/tensors/{name}", entry.nbytes).content
            )
            if len(raw) != entry.nbytes:
                raise ProtocolError(
                    f"tensor {name!r}: the seed sent {len(raw)} bytes, the manifest says {entry.nbytes}"
                )
            view[:] = raw
            digest = hashlib.sha256(view).hexdigest()
            if digest == entry.sha256:
                break
            if attempt == self.retries:
                raise ChecksumError(_checksum_message(entry, digest, self.retries + 1))
        if staging is not target:
            target.copy_(staging)
        return target

    def fetch_into(self, targets: Mapping[str, torch.Tensor]) -> int:
        """Fill every tensor of ``targets`` (name → preallocated tensor) from the seed; returns bytes."""
        manifest = self.fetch_manifest()
        entries = manifest.select(targets)
        problems: list[str] = []
        for entry in entries:
            try:
                entry.check_target(targets[entry.name])
            except ManifestError as exc:
                problems.extend(exc.problems)
        if problems:
            raise ManifestError(problems)
        # contiguous CPU targets receive the bytes directly; others through a staging tensor each
        buffers = {e.name: targets[e.name] for e in entries if _is_direct(targets[e.name])}
        for entry in self._verified(entries, buffers):
            target = targets[entry.name]
            if buffers[entry.name] is not target:
                target.copy_(buffers.pop(entry.name))
        return sum(e.nbytes for e in entries)

    def iter_tensors(self, names: list[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, CPU tensor)`` for ``names`` (default: all) in stream order, each verified."""
        manifest = self.fetch_manifest()
        entries = list(manifest.tensors) if names is None else manifest.select(names)
        buffers: dict[str, torch.Tensor] = {}
        for entry in self._verified(entries, buffers):
            yield entry.name, buffers.pop(entry.name)

    def _verified(
        self, entries: list[TensorEntry], buffers: dict[str, torch.Tensor]
    ) -> Iterator[TensorEntry]:
        """Stream ``entries`` into ``buffers`` (allocated on demand), yielding each once verified.

        A broken stream is resumed after the last whole tensor, at most ``retries`` times.
        """
        done, attempts = 0, _Attempts(self, "streaming tensors")
        while done < len(entries):
            try:
                for entry, digest in self._stream(entries[done:], buffers):
                    if digest.result() != entry.sha256:
                        self.fetch_tensor(entry.name, buffers[entry.name])
                    done += 1
                    yield entry
            except _TRANSIENT as exc:
                attempts.failed(exc)

    def _stream_endpoint(self) -> tuple[str, int]:
        """Host and port of the seed's TCP stream server (asked once through ``GET /transfer``)."""
        if self._stream_address is None:
            response = self._retrying(
                "asking for the stream port", lambda: self._get("/transfer", MAX_CONTROL_BYTES)
            )
            info = _json(response, "GET /transfer answer")
            port = info.get("port") if isinstance(info, dict) else None
            if (
                not isinstance(port, int)
                or not 0 < port < 65536
                or info.get("protocol") != VERSION
                or not isinstance(info.get("tls"), bool)
                or not isinstance(info.get("auth"), bool)
            ):
                raise ProtocolError(
                    f"GET /transfer answered {info!r}: expected "
                    f"{{'port': 1..65535, 'protocol': {VERSION}, 'tls': bool, 'auth': bool}}"
                )
            if self._tls is not None and not info["tls"]:
                raise NetLoaderError(
                    f"seed {self.source} is https:// but its stream port does not use TLS; "
                    "refusing to receive weights over plain TCP"
                )
            if info["auth"] and self._token is None:
                raise NetLoaderError(f"seed {self.source} requires a token and none is configured")
            self._stream_address = (urlsplit(self.source).hostname or "", port)
        return self._stream_address

    def _connect(self, host: str, port: int) -> socket.socket:
        """A connection to the stream port; TLS-wrapped (certificate and host name checked) for https://."""
        conn = socket.create_connection((host, port), timeout=self.timeout)
        if self._tls is None:
            return conn
        try:
            return self._tls.wrap_socket(conn, server_hostname=host)
        except BaseException:
            conn.close()
            raise

    def _handshake(self, reader: FrameReader) -> bytes:
        """Read the seed's CHALLENGE; the AUTH frame to send back (empty when no token is asked for)."""
        frame = reader.next()
        if frame is not None and frame.type is MessageType.ERROR:
            raise self._seed_error(frame.header["message"])
        if frame is None or frame.type is not MessageType.CHALLENGE:
            got = "an empty stream" if frame is None else f"a {frame.type.name} frame"
            raise ProtocolError(f"expected the seed's CHALLENGE frame, got {got}")
        if not frame.header["auth"]:
            return b""
        if self._token is None:
            raise NetLoaderError(f"seed {self.source} requires a token and none is configured")
        try:
            nonce = bytes.fromhex(frame.header["nonce"])
        except ValueError:
            raise ProtocolError(f"CHALLENGE nonce {frame.header['nonce'][:80]!r} is not hex") from None
        return encode(MessageType.AUTH, {"mac": mac(self._token, STREAM_CONTEXT, nonce)})

    def _seed_error(self, message: str) -> Exception:
        """The exception for a seed's ERROR frame: ``seed busy`` is transient (waited for), the rest final."""
        if message.startswith(BUSY_PREFIX):
            return ProtocolError(message)
        return NetLoaderError(f"seed {self.source} reported an error: {message}")

    def _stream(
        self, entries: list[TensorEntry], buffers: dict[str, torch.Tensor]
    ) -> Iterator[tuple[TensorEntry, Future[str]]]:
        """One TCP request for ``entries``: yields each entry, with its pending sha256, once its bytes arrived.

        Each chunk is hashed on the hashing thread while the next one is received.
        """
        if not entries:
            return
        request = encode(MessageType.TENSOR_REQUEST, {"names": [e.name for e in entries]})
        host, port = self._stream_endpoint()
        with self._connect(host, port) as conn:
            reader = FrameReader(conn.recv_into)
            conn.sendall(self._handshake(reader) + request)
            pending = iter(entries)
            current: TensorEntry | None = None
            filled = 0
            total = 0
            while (frame := reader.next()) is not None:
                header = frame.header
                if frame.type is MessageType.ERROR:
                    raise self._seed_error(header["message"])
                if frame.type is MessageType.END:
                    if current is not None or next(pending, None) is not None or header["bytes"] != total:
                        raise ProtocolError(
                            f"END frame after {total} bytes, but {sum(e.nbytes for e in entries)} were requested"
                        )
                    return
                if frame.type is not MessageType.TENSOR:
                    raise ProtocolError(f"unexpected {frame.type.name} frame from the seed")
                if current is None:
                    current = next(pending, None)
                    filled = 0
                    if current is None:
                        raise ProtocolError(
                            f"unexpected TENSOR frame for {header['name']!r} after the last tensor"
                        )
                if (header["name"], header["start"], header["offset"]) != (
                    current.name,
                    filled,
                    current.offset + filled,
                ):
                    raise ProtocolError(
                        f"TENSOR frame out of order: got {header['name']!r} at byte {header['start']} "
                        f"(stream offset {header['offset']}), expected {current.name!r} at byte {filled} "
                        f"(stream offset {current.offset + filled})"
                    )
                if filled + header["length"] > current.nbytes:
                    raise ProtocolError(
                        f"TENSOR frame for {current.name!r} overruns the tensor: bytes {filled}.."
                        f"{filled + header['length']} of {current.nbytes}"
                    )
                if current.name not in buffers:
                    buffers[current.name] = current.empty()
                if filled == 0:
                    digest = hashlib.sha256()
                chunk = byte_view(buffers[current.name])[filled : filled + header["length"]]
                reader.readinto(chunk)
                self._hasher.submit(digest.update, chunk)
                filled += header["length"]
                total += header["length"]
                if filled == current.nbytes:
                    yield current, self._hasher.submit(digest.hexdigest)
                    current = None
            raise ProtocolError(f"truncated stream: ended after {total} bytes without an END frame")


def _json(response: httpx.Response, what: str) -> Any:
    """A seed's (size-bounded) JSON answer parsed fail-closed (:func:`~.protocol.loads_bounded`)."""
    return loads_bounded(response.content, what, max_bytes=len(response.content))


def _is_direct(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu" and tensor.is_contiguous()


def _checksum_message(entry: TensorEntry, digest: str, attempts: int) -> str:
    return (
        f"tensor {entry.name!r}: sha256 mismatch after {attempts} attempts "
        f"(manifest {entry.sha256}, received {digest})"
    )


def _describe(response: httpx.Response) -> str:
    """``status: detail`` of an error answer (FastAPI's ``detail`` when there is one), at most 1,000 characters."""
    try:
        data = _json(response, "error answer")
    except ProtocolError:
        data = None
    detail = data.get("detail", response.text) if isinstance(data, dict) else response.text
    return f"{response.status_code}: {truncate_message(str(detail), 1000)}"
