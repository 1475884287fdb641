"""Length-prefixed message framing between a netloader client and a seed.

A frame is a fixed 18-byte prefix ``magic "VANL" | version u8 | type u8 | header_len u32 |
payload_len u64`` (network byte order), then a UTF-8 JSON header object of ``header_len`` bytes,
then ``payload_len`` raw bytes. Each message type declares the header fields it needs; a
``TENSOR`` frame carries one chunk of a tensor (``length`` must equal ``payload_len``).
:class:`FrameReader` decodes frames from any iterator of byte chunks (a socket or an HTTP body)
and writes payloads straight into caller memory.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAGIC = b"VANL"
VERSION = 1
PREFIX = struct.Struct("!4sBBIQ")
MAX_HEADER_BYTES = 1 << 20
MEDIA_TYPE = "application/x-vllm-ascend-netloader"


class ProtocolError(ValueError):
    """A malformed, unknown or truncated frame."""


class MessageType(enum.IntEnum):
    TENSOR_REQUEST = 1  # client → seed: {"names": [...]}
    TENSOR = 2  # seed → client: one chunk {"name", "offset", "start", "length"} + bytes
    END = 3  # seed → client: {"tensors", "bytes"} after the last chunk
    ERROR = 4  # seed → client: {"message"}


_FIELDS: dict[MessageType, dict[str, type]] = {
    MessageType.TENSOR_REQUEST: {"names": list},
    MessageType.TENSOR: {"name": str, "offset": int, "start": int, "length": int},
    MessageType.END: {"tensors": int, "bytes": int},
    MessageType.ERROR: {"message": str},
}


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
            raise ProtocolError(f"{kind.name} frame header: unknown field {name!r}; allowed: {', '.join(fields)}")
    for name, typ in fields.items():
        if name not in header:
            raise ProtocolError(f"{kind.name} frame header: missing field {name!r}")
        value = header[name]
        if not isinstance(value, typ) or isinstance(value, bool):
            raise ProtocolError(f"{kind.name} frame header: field {name!r} must be {typ.__name__}, got {value!r}")
        if typ is int and value < 0:
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


class FrameReader:
    """Decodes frames from an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = memoryview(b"")
        self._pending = 0  # payload bytes of the current frame not read yet
        self._current: Frame | None = None

    def _take(self, n: int) -> memoryview:
        """Up to ``n`` bytes (fewer only at end of stream)."""
        while not self._buffer:
            chunk = next(self._chunks, None)
            if chunk is None:
                return memoryview(b"")
            self._buffer = memoryview(chunk)
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def _read_exact(self, n: int, what: str, first: bytes = b"") -> bytes:
        parts, got = [first], len(first)
        while got < n:
            part = self._take(n - got)
            if not part:
                raise ProtocolError(f"truncated frame: stream ended after {got} of {n} {what} bytes")
            parts.append(bytes(part))
            got += len(part)
        return b"".join(parts)

    def next(self) -> Frame | None:
        """The next frame, or None at a clean end of stream (an unread payload is skipped)."""
        while self._pending:
            skipped = self._take(min(self._pending, 1 << 20))
            if not skipped:
                raise self._truncated(self._current)
            self._pending -= len(skipped)
        first = self._take(PREFIX.size)
        if not first:
            return None
        prefix = self._read_exact(PREFIX.size, "frame-prefix", bytes(first))
        magic, version, kind, header_len, payload_len = PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise ProtocolError(f"bad frame magic {magic!r}, expected {MAGIC!r}")
        if version != VERSION:
            raise ProtocolError(f"unsupported protocol version {version}; this side speaks {VERSION}")
        message_type = _message_type(kind)
        if header_len > MAX_HEADER_BYTES:
            raise ProtocolError(f"frame header length {header_len} exceeds the limit of {MAX_HEADER_BYTES}")
        raw = self._read_exact(header_len, f"{message_type.name} header")
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProtocolError(f"{message_type.name} frame header is not valid JSON: {exc}") from None
        _check_header(message_type, header, payload_len)
        self._current = Frame(message_type, header, payload_len)
        self._pending = payload_len
        return self._current

    def _truncated(self, frame: Frame | None) -> ProtocolError:
        assert frame is not None
        what = f" for {frame.header['name']!r}" if frame.type is MessageType.TENSOR else ""
        done = frame.payload_len - self._pending
        return ProtocolError(
            f"truncated {frame.type.name} payload{what}: stream ended after {done} of {frame.payload_len} bytes"
        )

    def readinto(self, out: memoryview) -> None:
        """Fill ``out`` (exactly the current frame's payload length) with the payload."""
        if len(out) != self._pending:
            raise ProtocolError(f"payload buffer of {len(out)} bytes for a payload of {self._pending} unread bytes")
        pos = 0
        while pos < len(out):
            part = self._take(len(out) - pos)
            if not part:
                raise self._truncated(self._current)
            out[pos : pos + len(part)] = part
            pos += len(part)
            self._pending -= len(part)
