"""Every ``VLLM_ASCEND_*`` environment variable, declared once, validated and read lazily.

``from vllm_ascend.core import envs; envs.VLLM_ASCEND_DEVICE`` reads the variable at access
time (so tests and launchers may change it); a bad value raises :class:`EnvError` naming the
variable and the allowed values.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class EnvError(ValueError):
    """An environment variable with a value outside its allowed set or type."""


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: Any
    parse: Callable[[str], Any]
    help: str

    def read(self) -> Any:
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        return self.parse(raw)


def _choice(name: str, allowed: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise EnvError(f"{name}={raw!r} is invalid; allowed values: {', '.join(allowed)}")
        return value

    return parse


def _csv(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


DEVICE_MODES = ("auto", "npu", "reference", "off")

_VARS: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar(
            "VLLM_ASCEND_DEVICE",
            "auto",
            _choice("VLLM_ASCEND_DEVICE", DEVICE_MODES),
            "auto: activate on a usable Ascend NPU; npu: require one; reference: run on torch's cpu "
            "device through the reference adaptor; off: never activate the platform.",
        ),
        EnvVar(
            "VLLM_ASCEND_DISABLED_EXTENSIONS",
            (),
            _csv,
            "Comma-separated extension names (e.g. eplb,netloader) that core must not load.",
        ),
    )
}


def declare(var: EnvVar) -> None:
    """Declare a variable (core modules only; names must be unique)."""
    if var.name in _VARS:
        raise EnvError(f"environment variable {var.name} is declared twice")
    _VARS[var.name] = var


def variables() -> dict[str, EnvVar]:
    return dict(_VARS)


def __getattr__(name: str) -> Any:
    var = _VARS.get(name)
    if var is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return var.read()


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_VARS))
