"""Frame encoding and decoding: round trips over any chunking, and exact errors for bad frames."""

from __future__ import annotations

import struct

import pytest

from vllm_ascend.netloader.protocol import (
    MAGIC,
    MAX_ERROR_CHARS,
    PREFIX,
    VERSION,
    FrameReader,
    MessageType,
    ProtocolError,
    chunk_source,
    encode,
    encode_prefix,
    error_frame,
    json_depth,
    loads_bounded,
)


def _chunks(data: bytes, size: int):
    return chunk_source([data[i : i + size] for i in range(0, len(data), size)])


def _stream() -> bytes:
    return (
        encode(MessageType.TENSOR, {"name": "w", "offset": 0, "start": 0, "length": 5}, b"abcde")
        + encode(MessageType.TENSOR, {"name": "w", "offset": 5, "start": 5, "length": 0})
        + encode(MessageType.END, {"tensors": 1, "bytes": 5})
    )


@pytest.mark.parametrize("chunk", [1, 3, 18, 1000])
def test_round_trip_over_any_chunking(chunk):
    reader = FrameReader(_chunks(_stream(), chunk))
    frame = reader.next()
    assert (frame.type, frame.header, frame.payload_len) == (
        MessageType.TENSOR,
        {"name": "w", "offset": 0, "start": 0, "length": 5},
        5,
    )
    out = bytearray(5)
    reader.readinto(memoryview(out))
    assert bytes(out) == b"abcde"
    assert reader.next().payload_len == 0
    assert reader.next().header == {"tensors": 1, "bytes": 5}
    assert reader.next() is None


def test_unread_payload_is_skipped():
    reader = FrameReader(_chunks(_stream(), 2))
    assert reader.next().type is MessageType.TENSOR
    assert reader.next().header["offset"] == 5


def _error(data: bytes, chunk: int = 7) -> str:
    reader = FrameReader(_chunks(data, chunk))
    with pytest.raises(ProtocolError) as info:
        while (frame := reader.next()) is not None:
            if frame.payload_len:
                reader.readinto(memoryview(bytearray(frame.payload_len)))
    return str(info.value)


def _raw(
    kind: int, header: bytes, payload: bytes = b"", magic: bytes = MAGIC, version: int = VERSION
) -> bytes:
    return PREFIX.pack(magic, version, kind, len(header), len(payload)) + header + payload


def test_bad_prefix_fields():
    assert (
        _error(_raw(9, b"{}"))
        == "unknown message type 9; allowed: 1 (TENSOR_REQUEST), 2 (TENSOR), 3 (END), 4 (ERROR), "
        "5 (CHALLENGE), 6 (AUTH)"
    )
    assert _error(_raw(3, b"{}", magic=b"HTTP")) == "bad frame magic b'HTTP', expected b'VANL'"
    assert _error(_raw(3, b"{}", version=1)) == "unsupported protocol version 1; this side speaks 2"
    too_long = struct.pack("!4sBBIQ", MAGIC, VERSION, 3, (1 << 20) + 1, 0)
    assert _error(too_long) == "frame header length 1048577 exceeds the limit of 1048576"


def test_wrong_lengths():
    header = b'{"name":"w","offset":0,"start":0,"length":4}'
    assert (
        _error(_raw(2, header, b"abc"))
        == "TENSOR frame for 'w' declares length 4 but carries 3 payload bytes"
    )
    assert _error(_raw(3, b'{"tensors":0,"bytes":0}', b"x")) == "END frame must carry no payload, got 1 bytes"
    with pytest.raises(
        ProtocolError, match="TENSOR frame for 'w' declares length 2 but carries 1 payload bytes"
    ):
        encode(MessageType.TENSOR, {"name": "w", "offset": 0, "start": 0, "length": 2}, b"x")
    reader = FrameReader(chunk_source([_stream()]))
    reader.next()
    with pytest.raises(ProtocolError, match="payload buffer of 4 bytes for a payload of 5 unread bytes"):
        reader.readinto(memoryview(bytearray(4)))


def test_truncated_frames():
    data = _stream()
    assert _error(data[:10]) == "truncated frame: stream ended after 10 of 18 frame-prefix bytes"
    assert _error(data[:30]) == "truncated frame: stream ended after 12 of 44 TENSOR header bytes"
    assert _error(data[:65]) == "truncated TENSOR payload for 'w': stream ended after 3 of 5 bytes"
    reader = FrameReader(chunk_source([data[:65]]))
    reader.next()
    with pytest.raises(
        ProtocolError, match="truncated TENSOR payload for 'w': stream ended after 3 of 5 bytes"
    ):
        reader.next()  # skipping the unread payload also notices


def test_header_validation():
    assert _error(_raw(3, b"[1]")) == "END frame header must be a JSON object, got list"
    assert _error(_raw(3, b"{bad")) == (
        "END frame header is not valid JSON (Expecting property name enclosed in double quotes at offset 1)"
    )
    assert _error(_raw(3, b'{"tensors":1}')) == "END frame header: missing field 'bytes'"
    assert _error(_raw(3, b'{"tensors":1,"bytes":2,"x":3}')) == (
        "END frame header: unknown field 'x'; allowed: tensors, bytes"
    )
    assert (
        _error(_raw(3, b'{"tensors":"1","bytes":2}'))
        == "END frame header: field 'tensors' must be int, got '1'"
    )
    assert (
        _error(_raw(3, b'{"tensors":true,"bytes":2}'))
        == "END frame header: field 'tensors' must be int, got True"
    )
    assert (
        _error(_raw(3, b'{"tensors":-1,"bytes":2}'))
        == "END frame header: field 'tensors' must be >= 0, got -1"
    )
    assert _error(_raw(1, b'{"names":["a",2]}')) == (
        "TENSOR_REQUEST frame header: every entry of 'names' must be a string"
    )
    with pytest.raises(ProtocolError, match="ERROR frame header: missing field 'message'"):
        encode_prefix(MessageType.ERROR, {})


def test_headers_fail_closed_on_depth_integers_and_constants():
    """Finding 3: nested lists, huge integers and NaN in a header are ProtocolErrors, not crashes."""
    deep = b'{"names":' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert (
        _error(_raw(1, deep)) == "TENSOR_REQUEST frame header nests 5001 levels deep; at most 8 are allowed"
    )
    huge = b'{"tensors":' + b"9" * 5000 + b',"bytes":0}'
    assert _error(_raw(3, huge)) == (
        "END frame header: integer 9999999999999999999999999999999999999999… is out of range (|n| <= 2**63-1)"
    )
    assert _error(_raw(3, b'{"tensors":9223372036854775808,"bytes":0}')).startswith(
        "END frame header: integer 9223372036854775808 is out of range"
    )
    assert _error(_raw(3, b'{"tensors":NaN,"bytes":0}')) == (
        "END frame header: NaN is not a number this protocol accepts"
    )
    assert _error(_raw(3, b'{"tensors":1,"bytes":"\xff"}')) == (
        "END frame header is not valid UTF-8 (byte 0xff at offset 22)"
    )
    assert json_depth(b'["[[[[", {"a": [1]}]') == 3  # brackets inside strings do not count
    assert loads_bounded(b'{"a":[[[]]]}', "x") == {"a": [[[]]]}
    with pytest.raises(ProtocolError, match="manifest of 11 bytes exceeds the limit of 10"):
        loads_bounded(b'{"a":"bcd"}', "manifest", max_bytes=10)


def test_error_frames_are_bounded():
    """Finding 3: an error message longer than a frame header allows is cut, so the frame always encodes."""
    message = "x" * (3 << 20)
    frame = FrameReader(chunk_source([error_frame(message)])).next()
    text = frame.header["message"]
    assert len(text) == MAX_ERROR_CHARS
    assert text.endswith(f"x … (cut from {len(message)} characters)")
    assert FrameReader(chunk_source([error_frame("short")])).next().header == {"message": "short"}
