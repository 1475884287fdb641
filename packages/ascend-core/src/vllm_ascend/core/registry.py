"""Typed, name-keyed registries that sibling distributions fill.

Core never imports a sibling: siblings put what they provide (quantization methods, EPLB
policies, workers, ...) into these registries from their extension's ``register()``.
A value is either the object itself or a lazy ``"module:attribute"`` path that is imported
on first :meth:`Registry.load`, so registering stays import-free.
"""

from __future__ import annotations

import argparse
import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(LookupError):
    """Unknown or duplicate name in a registry, or a value of the wrong type."""

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Entry:
    name: str
    value: Any
    owner: str


_state = threading.local()


def _current_owner() -> str:
    return getattr(_state, "owner", None) or "vllm-ascend-core"


@contextmanager
def registering_as(owner: str) -> Iterator[list[tuple[Registry[Any], str]]]:
    """Attribute registrations to ``owner``; on error, undo every registration made inside."""
    journal: list[tuple[Registry[Any], str]] = []
    previous = (getattr(_state, "owner", None), getattr(_state, "journal", None))
    _state.owner, _state.journal = owner, journal
    try:
        yield journal
    except BaseException:
        for registry, name in reversed(journal):
            registry.unregister(name)
        raise
    finally:
        _state.owner, _state.journal = previous


def load_object(path: str) -> Any:
    """Import ``"package.module:attr.sub"`` (or ``"package.module.attr"``)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"invalid object path {path!r}: expected 'module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Name → object (or lazy ``"module:attr"`` path) with clear errors on unknown or duplicate names."""

    def __init__(self, kind: str, check: Callable[[Any], bool] | None = None, expected: str = "") -> None:
        self.kind = kind
        self._check = check
        self._expected = expected
        self._entries: dict[str, Entry] = {}
        self._loaded: dict[str, T] = {}
        self._lock = threading.RLock()

    def register(self, name: str, value: T | str) -> T | str:
        """Add ``value`` under ``name``. The same owner re-registering the same value is a no-op."""
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if not isinstance(value, str) and self._check is not None and not self._check(value):
            raise RegistryError(
                f"{self.kind} {name!r}: expected {self._expected or 'a valid value'}, got {value!r}"
            )
        owner = _current_owner()
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None:
                if existing.owner == owner and (existing.value is value or existing.value == value):
                    return value
                raise RegistryError(
                    f"duplicate {self.kind} {name!r}: already registered by {existing.owner}, "
                    f"cannot register it again for {owner}"
                )
            self._entries[name] = Entry(name, value, owner)
            journal = getattr(_state, "journal", None)
            if journal is not None:
                journal.append((self, name))
        return value

    def unregister(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)
            self._loaded.pop(name, None)

    def _unknown(self, name: str) -> RegistryError:
        known = ", ".join(sorted(self._entries)) or "none"
        return RegistryError(f"unknown {self.kind} {name!r}; registered: {known}")

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise self._unknown(name) from None

    def get(self, name: str) -> T:
        """The registered object, importing a lazy path on first use."""
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            value = self.entry(name).value
            if isinstance(value, str):
                value = load_object(value)
                if self._check is not None and not self._check(value):
                    raise RegistryError(
                        f"{self.kind} {name!r}: {self._entries[name].value!r} resolved to {value!r}, "
                        f"expected {self._expected or 'a valid value'}"
                    )
            self._loaded[name] = value
            return value

    def owner(self, name: str) -> str:
        return self.entry(name).owner

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


@dataclass(frozen=True)
class CliCommand:
    """A ``vllm-ascend`` subcommand: ``configure`` adds its arguments, ``run`` returns the exit status."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _is_class(value: Any) -> bool:
    return isinstance(value, type)


#: vLLM quantization method name -> a vLLM ``QuantizationConfig`` subclass (registered with vLLM).
QUANT_METHODS: Registry[type] = Registry("quantization method", _is_class, "a QuantizationConfig class")
#: ``speculative_config.method`` -> a proposer class with ``from_vllm_config(vllm_config)`` and vLLM's
#: CPU-drafter ``propose(...)`` signature; the platform refuses other methods, the runner drafts with it.
SPEC_DECODE_METHODS: Registry[type] = Registry("speculative decoding method", _is_class, "a proposer class")
#: vLLM ``load_format`` -> a vLLM model loader class (registered with vLLM).
MODEL_LOADERS: Registry[type] = Registry("model loader", _is_class, "a model loader class")
#: any name -> a :class:`~vllm_ascend.core.device.overlay.DeviceOverlay` for one family.
DEVICE_OVERLAYS: Registry[Any] = Registry("device overlay")
#: ``vllm-ascend <name>`` -> a :class:`~vllm_ascend.core.cli.CliCommand`.
CLI_COMMANDS: Registry[Any] = Registry("CLI subcommand")
#: ``"default"`` -> the worker class vLLM runs on this platform.
WORKERS: Registry[type] = Registry("worker", _is_class, "a worker class")
#: ``additional_config`` section owned by a sibling -> ``validate(raw_mapping, vllm_config) -> object``,
#: called once per :func:`~vllm_ascend.core.config.init_ascend_config`.
CONFIG_SECTIONS: Registry[Callable[..., Any]] = Registry("config section", callable, "a validator callable")

ALL_REGISTRIES: dict[str, Registry[Any]] = {
    "quant_methods": QUANT_METHODS,
    "spec_decode_methods": SPEC_DECODE_METHODS,
    "model_loaders": MODEL_LOADERS,
    "device_overlays": DEVICE_OVERLAYS,
    "cli_commands": CLI_COMMANDS,
    "workers": WORKERS,
    "config_sections": CONFIG_SECTIONS,
}
