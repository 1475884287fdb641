"""Length-prefixed message framing between a netloader client and a seed.

A frame is a fixed 18-byte prefix ``magic "VANL" | version u8 | type u8 | header_len u32 |
payload_len u64`` (network byte order), then a UTF-8 JSON header object of ``header_len`` bytes,
then ``payload_len`` raw bytes. Each message type declares the header fields it needs; a
``TENSOR`` frame carries one chunk of a tensor (``length`` must equal ``payload_len``).
:class:`FrameReader` decodes frames from any ``recv_into``-style source (a socket, or byte
chunks through :func:`chunk_source`) and reads payloads straight into caller memory.

Headers are parsed fail-closed: at most :data:`MAX_HEADER_BYTES` bytes, nesting at most
:data:`MAX_JSON_DEPTH` deep, integers within a signed 64-bit range, no ``NaN``/``Infinity``;
anything else is a :class:`ProtocolError`. ``ERROR`` messages are cut to :data:`MAX_ERROR_CHARS`.
"""

from __future__ import annotations

import enum
import itertools
import json
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

MAGIC = b"VANL"
VERSION = 2
PREFIX = struct.Struct("!4sBBIQ")
MAX_HEADER_BYTES = 1 << 20
MAX_JSON_DEPTH = 8
MAX_INT = (1 << 63) - 1
MAX_ERROR_CHARS = 4096
BUSY_PREFIX = "seed busy:"
"""How a seed's ERROR frame for a connection over its cap begins (clients retry those)."""


class ProtocolError(ValueError):
    """A malformed, unknown or truncated frame."""


class MessageType(enum.IntEnum):
    TENSOR_REQUEST = 1  # client → seed: {"names": [...]}
    TENSOR = 2  # seed → client: one chunk {"name", "offset", "start", "length"} + bytes
    END = 3  # seed → client: {"tensors", "bytes"} after the last chunk
    ERROR = 4  # seed → client: {"message"}
    CHALLENGE = 5  # seed → client, first on every connection: {"nonce": hex, "auth": bool}
    AUTH = 6  # client → seed when the challenge says auth: {"mac": hex HMAC of the nonce}


_FIELDS: dict[MessageType, dict[str, type]] = {
    MessageType.TENSOR_REQUEST: {"names": list},
    MessageType.TENSOR: {"name": str, "offset": int, "start": int, "length": int},
    MessageType.END: {"tensors": int, "bytes": int},
    MessageType.ERROR: {"message": str},
    MessageType.CHALLENGE: {"nonce": str, "auth": bool},
    MessageType.AUTH: {"mac": str},
}
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


def _allowed_types() -> str:
    return ", ".join(f"{t.value} ({t.name})" for t in MessageType)


def _message_type(value: int) -> MessageType:
    try:
        return MessageType(value)
    except ValueError:
        raise ProtocolError(f"unknown message type {value}; allowed: {_allowed_types()}") from None


def _check_header(kind: MessageType, header: Any, payload_len: int) -> None:
    if not isinstance(header, dict):
        raise ProtocolError(f"{kind.name} frame header must be a JSON object, got {type(header).__name__}")
    fields = _FIELDS[kind]
    for name in header:
        if name not in fields:
            raise ProtocolError(
                f"{kind.name} frame header: unknown field {name!r}; allowed: {', '.join(fields)}"
            )
    for name, typ in fields.items():
        if name not in header:
            raise ProtocolError(f"{kind.name} frame header: missing field {name!r}")
        value = header[name]
        if not isinstance(value, typ) or (typ is not bool and isinstance(value, bool)):
            raise ProtocolError(
                f"{kind.name} frame header: field {name!r} must be {typ.__name__}, got {value!r}"
            )
        if isinstance(value, int) and value < 0:
            raise ProtocolError(f"{kind.name} frame header: field {name!r} must be >= 0, got {value}")
    if kind is MessageType.TENSOR:
        if header["length"] != payload_len:
            raise ProtocolError(
                f"TENSOR frame for {header['name']!r} declares length {header['length']} "
                f"but carries {payload_len} payload bytes"
            )
    elif payload_len:
        raise ProtocolError(f"{kind.name} frame must carry no payload, got {payload_len} bytes")
    if kind is MessageType.TENSOR_REQUEST and not all(isinstance(n, str) for n in header["names"]):
        raise ProtocolError("TENSOR_REQUEST frame header: every entry of 'names' must be a string")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(value := int(text)) > MAX_INT:
        raise ProtocolError(
            f"integer {text[:40]}{'…' if len(text) > 40 else ''} is out of range (|n| <= 2**63-1)"
        )
    return value


def _no_constant(name: str) -> float:
    raise ProtocolError(f"{name} is not a number this protocol accepts")


def json_depth(raw: bytes) -> int:
    """How deeply the arrays and objects of the JSON text ``raw`` nest (strings ignored)."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    steps = (1 if c in b"[{" else -1 for c in brackets)
    return max(itertools.accumulate(steps), default=0)


def loads_bounded(
    raw: bytes, what: str, max_bytes: int = MAX_HEADER_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """Parse JSON from a peer fail-closed: size, depth and integer bounds; :class:`ProtocolError` otherwise."""
    if len(raw) > max_bytes:
        raise ProtocolError(f"{what} of {len(raw)} bytes exceeds the limit of {max_bytes}")
    depth = json_depth(raw)
    if depth > max_depth:
        raise ProtocolError(f"{what} nests {depth} levels deep; at most {max_depth} are allowed")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(
            f"{what} is not valid UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})"
        ) from None
    try:
        return json.loads(text, parse_int=_bounded_int, parse_constant=_no_constant)
    except ProtocolError as exc:
        raise ProtocolError(f"{what}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"{what} is not valid JSON ({exc.msg} at offset {exc.pos})") from None


def truncate_message(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``message`` cut to ``limit`` characters, saying how long it was."""
    if len(message) <= limit:
        return message
    note = f" … (cut from {len(message)} characters)"
    return message[: limit - len(note)] + note


def error_frame(message: str) -> bytes:
    """An ERROR frame for ``message`` (cut to :data:`MAX_ERROR_CHARS`, so it always fits a frame)."""
    return encode(MessageType.ERROR, {"message": truncate_message(message)})


def encode_prefix(kind: MessageType, header: dict[str, Any], payload_len: int = 0) -> bytes:
    """Prefix and JSON header of a frame (the payload follows separately)."""
    _check_header(kind, header, payload_len)
    body = json.dumps(header, separators=(",", ":")).encode()
    if len(body) > MAX_HEADER_BYTES:
        raise ProtocolError(f"frame header of {len(body)} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    return PREFIX.pack(MAGIC, VERSION, kind, len(body), payload_len) + body


def encode(kind: MessageType, header: dict[str, Any], payload: bytes | memoryview = b"") -> bytes:
    """A whole frame."""
    return encode_prefix(kind, header, len(payload)) + bytes(payload)


@dataclass(frozen=True)
class Frame:
    """A decoded frame prefix and header; its payload is read through the :class:`FrameReader`."""

    type: MessageType
    header: dict[str, Any]
    payload_len: int


RecvInto = Callable[[memoryview], int]
"""Fills a prefix of the buffer and returns the byte count, 0 at end of stream (``socket.recv_into``)."""


def chunk_source(chunks: Iterable[bytes | memoryview]) -> RecvInto:
    """A :data:`RecvInto` over byte chunks (a request body, or chunks in tests)."""
    it = iter(chunks)
    rest = memoryview(b"")

    def recv_into(out: memoryview) -> int:
        nonlocal rest
        while not rest:
            nxt = next(it, None)
            if nxt is None:
                return 0
            rest = memoryview(nxt).cast("B")
        n = min(len(out), len(rest))
        out[:n] = rest[:n]
        rest = rest[n:]
        return n

    return recv_into


class FrameReader:
    """Decodes frames from a byte source; payloads go straight into caller memory."""

    def __init__(self, recv_into: RecvInto) -> None:
        self._recv_into = recv_into
        self._pending = 0  # payload bytes of the current frame not read yet
        self._current: Frame | None = None

    def _fill(self, out: memoryview) -> int:
        """Read until ``out`` is full or the stream ends; returns the bytes read."""
        got = 0
        while got < len(out):
            n = self._recv_into(out[got:])
            if n == 0:
                break
            got += n
        return got

    def _read_exact(self, n: int, what: str) -> bytes:
        buf = bytearray(n)
        got = self._fill(memoryview(buf))
        if got < n:
            raise ProtocolError(f"truncated frame: stream ended after {got} of {n} {what} bytes")
        return bytes(buf)

    def next(self) -> Frame | None:
        """The next frame, or None at a clean end of stream (an unread payload is skipped)."""
        if self._pending:
            scratch = memoryview(bytearray(min(self._pending, 1 << 20)))
            while self._pending:
                got = self._fill(scratch[: min(self._pending, len(scratch))])
                self._pending -= got
                if got == 0:
                    raise self._truncated()
        prefix = bytearray(PREFIX.size)
        got = self._fill(memoryview(prefix))
        if got == 0:
            return None
        if got < PREFIX.size:
            raise ProtocolError(
                f"truncated frame: stream ended after {got} of {PREFIX.size} frame-prefix bytes"
            )
        magic, version, kind, header_len, payload_len = PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise ProtocolError(f"bad frame magic {magic!r}, expected {MAGIC!r}")
        if version != VERSION:
            raise ProtocolError(f"unsupported protocol version {version}; this side speaks {VERSION}")
        message_type = _message_type(kind)
        if header_len > MAX_HEADER_BYTES:
            raise ProtocolError(f"frame header length {header_len} exceeds the limit of {MAX_HEADER_BYTES}")
        raw = self._read_exact(header_len, f"{message_type.name} header")
        header = loads_bounded(raw, f"{message_type.name} frame header")
        _check_header(message_type, header, payload_len)
        self._current = Frame(message_type, header, payload_len)
        self._pending = payload_len
        return self._current

    def _truncated(self) -> ProtocolError:
        frame = self._current
        assert frame is not None
        what = f" for {frame.header['name']!r}" if frame.type is MessageType.TENSOR else ""
        done = frame.payload_len - self._pending
        return ProtocolError(
            f"truncated {frame.type.name} payload{what}: stream ended after {done} of {frame.payload_len} bytes"
        )

    def readinto(self, out: memoryview) -> None:
        """Fill ``out`` (exactly the current frame's unread payload) with the payload."""
        if len(out) != self._pending:
            raise ProtocolError(
                f"payload buffer of {len(out)} bytes for a payload of {self._pending} unread bytes"
            )
        got = self._fill(out)
        self._pending -= got
        if self._pending:
            raise self._truncated()
