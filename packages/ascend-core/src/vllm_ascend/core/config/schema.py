"""Typed, self-validating config sections built from JSON-like dicts.

A section is a frozen dataclass whose fields carry their constraints (range, choices, aliases) in
field metadata. Validation runs at construction, so a section built directly from Python and one
parsed from ``--additional-config`` JSON go through the same checks, and every error names the
full key path (``additional_config.eplb_config.num_redundant_experts``) and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Self


class ConfigError(ValueError):
    """Invalid Ascend configuration; the message names the key path and the allowed values."""


#: Integer fields hold values a C ``int64`` can hold (what torch, numpy and vLLM pass them on as).
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


def field_meta(
    doc: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    choices: tuple[Any, ...] | None = None,
    aliases: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Field metadata: help text and constraints (for ``dataclasses.field(metadata=...)``)."""
    return {"doc": doc, "ge": ge, "gt": gt, "le": le, "choices": choices, "aliases": aliases}


def option(default: Any, *, doc: str, **constraints: Any) -> Any:
    """A scalar config field: default, help text and constraints (see :func:`meta`)."""
    return dataclasses.field(default=default, metadata=field_meta(doc, **constraints))


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _int_text(value: int) -> str:
    """The integer, or its size when printing it would be unreadable (or over Python's digit limit)."""
    return str(value) if value.bit_length() <= 128 else f"an integer of {value.bit_length()} bits"


def _fmt_choice(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _fmt_bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _range_text(meta: Mapping[str, Any]) -> str:
    parts = []
    if meta["ge"] is not None:
        parts.append(f">= {_fmt_bound(meta['ge'])}")
    if meta["gt"] is not None:
        parts.append(f"> {_fmt_bound(meta['gt'])}")
    if meta["le"] is not None:
        parts.append(f"<= {_fmt_bound(meta['le'])}")
    return " and ".join(parts)


def allowed_text(meta: Mapping[str, Any]) -> str:
    """Human-readable allowed values of a field (for messages and docs)."""
    text = ", ".join(_fmt_choice(c) for c in meta["choices"])
    if meta["aliases"]:
        text += " (or " + ", ".join(repr(a) for a in meta["aliases"]) + ")"
    return text


def _split_optional(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def _coerce_scalar(value: Any, hint: Any, path: str) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path} must be a boolean (true or false), got {_describe(value)}")
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{path} must be an integer, got {_describe(value)}")
        if not INT_MIN <= value <= INT_MAX:
            raise ConfigError(
                f"{path} = {_int_text(value)} is out of range; integers must lie in [{INT_MIN}, {INT_MAX}]"
            )
        return value
    if hint is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"{path} must be a number, got {_describe(value)}")
        if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            raise ConfigError(
                f"{path} = {_int_text(value)} is out of range; numbers must lie in [{INT_MIN}, {INT_MAX}]"
            )
        if not math.isfinite(value):
            raise ConfigError(f"{path} must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path} must be a string, got {_describe(value)}")
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item_hint, _ellipsis) = typing.get_args(hint)
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path} must be a list, got {_describe(value)}")
        return tuple(_coerce_scalar(item, item_hint, f"{path}[{i}]") for i, item in enumerate(value))
    if isinstance(hint, type) and issubclass(hint, Section):
        if isinstance(value, hint):
            return value
        if isinstance(value, Mapping):
            return hint.from_dict(value)
        raise ConfigError(
            f"{path} must be a JSON object (allowed keys: {', '.join(sorted(hint.option_names()))}), got {_describe(value)}"
        )
    raise TypeError(f"unsupported config field type {hint!r} at {path}")


def _check_constraints(value: Any, meta: Mapping[str, Any], path: str) -> None:
    if value is None:
        return
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ConfigError(f"{path} = {_fmt_choice(value)} is invalid; allowed values: {allowed_text(meta)}")
    bounds = _range_text(meta)
    if not bounds or not isinstance(value, int | float):
        return
    ok = (
        (meta["ge"] is None or value >= meta["ge"])
        and (meta["gt"] is None or value > meta["gt"])
        and (meta["le"] is None or value <= meta["le"])
    )
    if not ok:
        raise ConfigError(f"{path} = {value} is out of range; allowed: {bounds}")


def unknown_key_message(path: str, key: str, allowed: list[str]) -> str:
    """Names the unknown key, the closest allowed key (difflib) if any, and every allowed key."""
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    return f"unknown option {path}.{key}{hint} Allowed keys: {', '.join(sorted(allowed))}"


@dataclasses.dataclass(frozen=True)
class Section:
    """Base of every config section. ``PATH`` is the section's key path in ``additional_config``."""

    PATH: ClassVar[str] = "additional_config"

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            path = f"{self.PATH}.{f.name}"
            meta = f.metadata
            value = getattr(self, f.name)
            aliases = meta.get("aliases")
            if aliases and isinstance(value, str):
                key = value.strip().lower()
                if key not in aliases:
                    raise ConfigError(f"{path} = {value!r} is invalid; allowed values: {allowed_text(meta)}")
                value = aliases[key]
            hint, optional = _split_optional(hints[f.name])
            if value is None and not optional:
                raise ConfigError(f"{path} must not be null")
            if value is not None:
                value = _coerce_scalar(value, hint, path)
            _check_constraints(value, meta, path)
            object.__setattr__(self, f.name, value)
        self._validate()

    def _validate(self) -> None:
        """Checks between fields of this section (override in sections that have any)."""

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Self:
        """Build from a JSON-like mapping; unknown keys are rejected with a suggestion."""
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{cls.PATH} must be a JSON object, got {_describe(data)}")
        allowed = cls.option_names()
        for key in data:
            if key not in allowed:
                raise ConfigError(unknown_key_message(cls.PATH, str(key), allowed))
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict that :meth:`from_dict` turns back into an equal section."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Section):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    def replace(self, **changes: Any) -> Self:
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def describe(cls) -> list[tuple[str, str, Any, str]]:
        """(key path, type, default, help) for every leaf option, nested sections expanded."""
        rows: list[tuple[str, str, Any, str]] = []
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint, _ = _split_optional(hints[f.name])
            if isinstance(hint, type) and issubclass(hint, Section):
                rows.extend(hint.describe())
                continue
            factory = f.default_factory
            default = factory() if callable(factory) else f.default
            rows.append((f"{cls.PATH}.{f.name}", str(hints[f.name]), default, f.metadata["doc"]))
        return rows
