"""Bounded JSON reading shared by every parser of user files (config, expert maps, quant descriptions).

``json.loads`` alone leaks ``RecursionError`` on deep nesting, ``UnicodeDecodeError`` on bad bytes,
accepts ``NaN``/``Infinity`` and says only "Expecting value" of an empty document; these helpers refuse
all of that (and a UTF-8 byte order mark) with one :class:`JsonInputError` naming the source, so each
package can wrap it in its own error type.
"""

from __future__ import annotations

import json
import os
import re
from itertools import accumulate
from typing import Any

#: Deepest nesting accepted; every document this project reads needs fewer than 8 levels.
MAX_JSON_DEPTH = 64
#: Largest file accepted (quant descriptions of the largest checkpoints are a few MiB).
MAX_JSON_BYTES = 64 * 1024 * 1024

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JsonInputError(ValueError):
    """JSON input that is unreadable, oversize, too deep, not UTF-8, empty, or not valid JSON.

    ``source`` names the input and ``problem`` says what is wrong (``str()`` is "<source> is <problem>")."""

    def __init__(self, source: str, problem: str) -> None:
        self.source, self.problem = source, problem
        super().__init__(f"{source} is {problem}")


def json_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting of ``text`` (brackets inside strings are ignored)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (non-finite values are refused)")


def parse_json(text: str, label: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode ``text``; ``label`` names the source in errors."""
    if text.startswith("\ufeff"):
        raise JsonInputError(
            label, "not valid JSON: it starts with a UTF-8 byte order mark (save it without a BOM)"
        )
    if not text.strip():
        raise JsonInputError(label, "empty: expected a JSON document")
    depth = json_depth(text)
    if depth > max_depth:
        raise JsonInputError(label, f"nested {depth} levels deep; at most {max_depth} levels are allowed")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise JsonInputError(
            label, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:  # a refused constant, or an integer over Python's digit limit
        raise JsonInputError(label, f"not valid JSON: {exc}") from None


def read_json_file(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Read and decode the UTF-8 JSON file at ``path`` (size checked before reading the bytes)."""
    label = f"{os.fspath(path)!r}"
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise JsonInputError(label, f"too large: {size} bytes; at most {max_bytes} are allowed")
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise JsonInputError(label, f"unreadable: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise JsonInputError(label, f"too large: over {max_bytes} bytes; at most {max_bytes} are allowed")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonInputError(
            label, f"not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} ({exc.reason})"
        ) from None
    return parse_json(text, label, max_depth=max_depth)
