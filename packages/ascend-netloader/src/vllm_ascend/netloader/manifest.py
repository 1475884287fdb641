"""Weight manifest: what a seed serves (names, dtypes, shapes, byte offsets, sha256 per tensor).

Tensors are laid out back to back in manifest order, as one virtual byte stream: ``offset`` is a
tensor's position in that stream and ``nbytes`` its length. :meth:`Manifest.from_dict` checks
everything a peer could get wrong and reports every problem at once. ``kind`` says what the names
are: ``checkpoint`` (a model's checkpoint tensors, fed through its ``load_weights``) or ``live``
(a running model's post-load parameters and buffers, assigned by name). :func:`check_expected`
compares a manifest with what a model expects before anything is transferred.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

FORMAT = "vllm-ascend-netloader-manifest/1"

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_ENTRY_KEYS = ("name", "dtype", "shape", "offset", "nbytes", "sha256")
_TOP_KEYS = ("format", "kind", "total_bytes", "tensors")
_REQUIRED_TOP_KEYS = ("format", "total_bytes", "tensors")
KINDS = ("checkpoint", "live")
NAMES_SHOWN = 3
"""How many offending names :class:`WeightMismatch` names per category."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(ValueError):
    """A manifest (or a tensor checked against it) that cannot be used; ``problems`` lists every issue."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:
            super().__init__(f"invalid weight manifest: {self.problems[0]}")
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            super().__init__(f"invalid weight manifest: {len(self.problems)} problems\n{lines}")


class WeightMismatch(ManifestError):
    """The seed's tensors are not the ones the model expects.

    ``missing`` and ``extra`` are tensor names; ``mismatched`` describes each tensor served with
    another dtype or shape. The message names the first :data:`NAMES_SHOWN` of each.
    """

    def __init__(self, missing: list[str], extra: list[str], mismatched: list[str]) -> None:
        self.missing, self.extra, self.mismatched = missing, extra, mismatched
        super().__init__(
            [f"tensor {n!r} is missing" for n in missing]
            + [f"tensor {n!r} is not a weight of this model" for n in extra]
            + mismatched
        )
        parts = [
            f"{len(items)} {what} ({_first(items)})"
            for what, items in (
                ("missing", missing),
                ("unexpected", extra),
                ("with another dtype or shape", mismatched),
            )
            if items
        ]
        self.args = (f"the seed does not serve this model's weights: {'; '.join(parts)}",)


def _first(items: list[str]) -> str:
    shown = ", ".join(items[:NAMES_SHOWN])
    return shown if len(items) <= NAMES_SHOWN else f"{shown}, ... {len(items) - NAMES_SHOWN} more"


TensorSpec = tuple[str, tuple[int, ...]]
"""A tensor's manifest dtype name and shape."""


def check_expected(manifest: Manifest, expected: Mapping[str, TensorSpec]) -> None:
    """Raise :class:`WeightMismatch` unless ``manifest`` serves exactly ``expected`` (name → dtype, shape).

    Only names, dtypes and shapes are compared, so nothing is allocated or transferred; with every
    tensor matching, the manifest's total is the model's own.
    """
    served = {e.name: e for e in manifest.tensors}
    missing = [n for n in expected if n not in served]
    extra = [n for n in served if n not in expected]
    mismatched = []
    for name, (dtype, shape) in expected.items():
        entry = served.get(name)
        if entry is not None and (entry.dtype, entry.shape) != (dtype, tuple(shape)):
            mismatched.append(
                f"{name!r}: seed {entry.dtype} {list(entry.shape)}, model {dtype} {list(shape)}"
            )
    if missing or extra or mismatched:
        raise WeightMismatch(missing, extra, mismatched)


def spec_of(tensor: torch.Tensor) -> TensorSpec:
    """The :data:`TensorSpec` of ``tensor`` (a dtype without a manifest name keeps torch's name)."""
    return _DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype)), tuple(tensor.shape)


def dtype_name(dtype: torch.dtype) -> str:
    """The manifest name of ``dtype``."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ManifestError([f"dtype {dtype} cannot be served; allowed: {', '.join(DTYPES)}"]) from None


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of ``tensor`` (copied to a contiguous CPU tensor only when needed)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the manifest."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    sha256: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def empty(self) -> torch.Tensor:
        """A new CPU tensor of this entry's dtype and shape."""
        return torch.empty(self.shape, dtype=self.torch_dtype)

    def check_target(self, tensor: torch.Tensor) -> None:
        """Raise :class:`ManifestError` unless ``tensor`` can receive this entry's bytes."""
        problems = []
        if tensor.dtype != self.torch_dtype:
            problems.append(
                f"tensor {self.name!r}: the seed serves {self.dtype}, the target is {tensor.dtype}"
            )
        if tuple(tensor.shape) != self.shape:
            problems.append(
                f"tensor {self.name!r}: the seed serves shape {list(self.shape)}, the target has {list(tensor.shape)}"
            )
        if problems:
            raise ManifestError(problems)


@dataclass(frozen=True)
class Manifest:
    """The tensors a seed serves, in stream order."""

    tensors: tuple[TensorEntry, ...]
    kind: str = "checkpoint"
    _index: dict[str, TensorEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {e.name: e for e in self.tensors})

    @property
    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def select(self, names: Iterable[str]) -> list[TensorEntry]:
        """The entries for ``names`` in stream order; every unknown name is reported."""
        wanted = list(dict.fromkeys(names))
        missing = [n for n in wanted if n not in self._index]
        if missing:
            raise ManifestError([f"tensor {n!r} is not served by the seed" for n in missing])
        return [e for e in self.tensors if e.name in set(wanted)]

    def entry(self, name: str) -> TensorEntry:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"tensor {name!r} is not in the manifest ({len(self.tensors)} tensors)") from None

    @classmethod
    def from_state_dict(
        cls, state_dict: Mapping[str, torch.Tensor], kind: str = "checkpoint"
    ) -> tuple[Manifest, dict[str, memoryview]]:
        """The manifest of ``state_dict`` and the bytes of each tensor (the seed side)."""
        if kind not in KINDS:
            raise ManifestError([f"kind = {kind!r}: expected one of {', '.join(KINDS)}"])
        entries, data, offset = [], {}, 0
        for name, tensor in state_dict.items():
            raw = tensor_bytes(tensor)
            entries.append(
                TensorEntry(
                    name, dtype_name(tensor.dtype), tuple(tensor.shape), offset, raw.nbytes, sha256_hex(raw)
                )
            )
            data[name] = raw
            offset += raw.nbytes
        return cls(tuple(entries), kind), data

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kind": self.kind,
            "total_bytes": self.total_bytes,
            "tensors": [
                {
                    "name": e.name,
                    "dtype": e.dtype,
                    "shape": list(e.shape),
                    "offset": e.offset,
                    "nbytes": e.nbytes,
                    "sha256": e.sha256,
                }
                for e in self.tensors
            ],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """Validate a manifest received from a peer."""
        if not isinstance(data, Mapping):
            raise ManifestError([f"manifest must be a JSON object, got {type(data).__name__}"])
        problems: list[str] = []
        for key in data:
            if key not in _TOP_KEYS:
                problems.append(f"unknown key {key!r}; allowed: {', '.join(_TOP_KEYS)}")
        for key in _REQUIRED_TOP_KEYS:
            if key not in data:
                problems.append(f"missing key {key!r}")
        if "format" in data and data["format"] != FORMAT:
            problems.append(f"format = {data['format']!r}: expected {FORMAT!r}")
        kind = data.get("kind", "checkpoint")
        if kind not in KINDS:
            problems.append(f"kind = {kind!r}: expected one of {', '.join(KINDS)}")
        raw_entries = data.get("tensors", [])
        if not isinstance(raw_entries, list):
            problems.append(f"tensors must be a list, got {type(raw_entries).__name__}")
            raw_entries = []
        entries: list[TensorEntry] = []
        seen: set[str] = set()
        expected_offset = 0
        for i, raw in enumerate(raw_entries):
            entry = _parse_entry(i, raw, problems)
            if entry is None:
                if isinstance(raw, Mapping) and _is_int(raw.get("offset")) and _is_int(raw.get("nbytes")):
                    expected_offset = raw["offset"] + raw["nbytes"]
                continue
            label = f"tensors[{i}] ({entry.name!r})"
            if entry.name in seen:
                problems.append(f"{label}: duplicate tensor name")
            seen.add(entry.name)
            if entry.offset != expected_offset:
                problems.append(
                    f"{label}.offset = {entry.offset}: expected {expected_offset} "
                    "(tensors are laid out back to back in manifest order)"
                )
            expected_offset = entry.offset + entry.nbytes
            entries.append(entry)
        total = data.get("total_bytes")
        if "total_bytes" in data and not problems and total != expected_offset:
            problems.append(f"total_bytes = {total!r}: expected {expected_offset} (the sum of nbytes)")
        if problems:
            raise ManifestError(problems)
        return cls(tuple(entries), kind)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_entry(i: int, raw: Any, problems: list[str]) -> TensorEntry | None:
    if not isinstance(raw, Mapping):
        problems.append(f"tensors[{i}] must be an object, got {type(raw).__name__}")
        return None
    name = raw.get("name")
    label = f"tensors[{i}] ({name!r})" if isinstance(name, str) else f"tensors[{i}]"
    start = len(problems)
    for key in raw:
        if key not in _ENTRY_KEYS:
            problems.append(f"{label}: unknown key {key!r}; allowed: {', '.join(_ENTRY_KEYS)}")
    for key in _ENTRY_KEYS:
        if key not in raw:
            problems.append(f"{label}: missing key {key!r}")
    if len(problems) > start:
        return None
    dtype, shape, offset, nbytes, digest = (raw[k] for k in _ENTRY_KEYS[1:])
    if not isinstance(name, str) or not name:
        problems.append(f"{label}.name must be a non-empty string")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        problems.append(f"{label}.dtype = {dtype!r}: expected one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        problems.append(f"{label}.shape = {shape!r}: expected a list of non-negative integers")
    if not _is_int(offset) or offset < 0:
        problems.append(f"{label}.offset = {offset!r}: expected a non-negative integer")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        problems.append(f"{label}.sha256 = {digest!r}: expected 64 lowercase hex digits")
    if len(problems) > start or not isinstance(name, str):
        return None
    itemsize = DTYPES[dtype].itemsize
    expected = math.prod(shape) * itemsize
    if nbytes != expected:
        problems.append(
            f"{label}.nbytes = {nbytes!r}: expected {expected} (shape {shape} × {itemsize} bytes of {dtype})"
        )
        return None
    return TensorEntry(name, dtype, tuple(shape), offset, nbytes, digest)
