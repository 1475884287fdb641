"""Every ``VLLM_ASCEND_*`` environment variable, declared once, validated and read lazily.

``from vllm_ascend.core import envs; envs.VLLM_ASCEND_DEVICE`` reads the variable at access
time (so tests and launchers may change it); a bad value raises :class:`EnvError` naming the
variable and the allowed values.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
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


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _bool(name: str) -> Callable[[str], bool]:
    def parse(raw: str) -> bool:
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise EnvError(f"{name}={raw!r} is invalid; allowed values: {', '.join(_TRUE + _FALSE)}")

    return parse


def _int(name: str, low: int, high: int | None = None) -> Callable[[str], int]:
    allowed = f"an integer >= {low}" + (f" and <= {high}" if high is not None else "")

    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise EnvError(f"{name}={raw!r} is invalid; allowed: {allowed}") from None
        if value < low or (high is not None and value > high):
            raise EnvError(f"{name}={raw!r} is out of range; allowed: {allowed}")
        return value

    return parse


def _text(raw: str) -> str:
    return raw.strip()


DEVICE_MODES = ("auto", "npu", "reference", "off")
REFERENCE_FAMILIES = ("a2", "a3", "a5", "310p")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_COLOR_MODES = ("auto", "always", "never")

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
            "VLLM_ASCEND_REFERENCE_FAMILY",
            "a2",
            _choice("VLLM_ASCEND_REFERENCE_FAMILY", REFERENCE_FAMILIES),
            "The family the reference device emulates (case-insensitive): its profile (dtypes, capabilities, "
            "weight layout, worker) and, where an overlay provides one, its reference adaptor. 310p needs "
            "vllm-ascend[310p].",
        ),
        EnvVar(
            "VLLM_ASCEND_DISABLED_EXTENSIONS",
            (),
            _csv,
            "Comma-separated extension names (e.g. eplb,netloader) that core must not load.",
        ),
        EnvVar(
            "VLLM_ASCEND_KERNEL_BACKEND",
            "auto",
            _choice("VLLM_ASCEND_KERNEL_BACKEND", ("auto", "triton", "torch")),
            "Kernels of vllm_ascend.kernels: auto picks Triton where it can run on the tensor's device "
            "(else the torch reference); triton requires it; torch always uses the references.",
        ),
        EnvVar(
            "VLLM_ASCEND_CACHE_DIR",
            None,
            _text,
            "Where locally built artefacts (the demo's tiny models) are kept; default "
            "$XDG_CACHE_HOME/vllm-ascend.",
        ),
        EnvVar(
            "VLLM_ASCEND_LOG_LEVEL",
            "info",
            _choice("VLLM_ASCEND_LOG_LEVEL", LOG_LEVELS),
            "Level of the vllm_ascend loggers.",
        ),
        EnvVar(
            "VLLM_ASCEND_LOG_COLOR",
            "auto",
            _choice("VLLM_ASCEND_LOG_COLOR", LOG_COLOR_MODES),
            "auto: colour level names only when stderr is a terminal (and NO_COLOR is unset); "
            "always / never force it.",
        ),
        EnvVar(
            "VLLM_ASCEND_LOG_FILE",
            None,
            _text,
            "Also write vllm_ascend logs to this file, rotated by size.",
        ),
        EnvVar(
            "VLLM_ASCEND_LOG_FILE_MAX_BYTES",
            64 << 20,
            _int("VLLM_ASCEND_LOG_FILE_MAX_BYTES", 1024),
            "Size in bytes at which the log file is rotated.",
        ),
        EnvVar(
            "VLLM_ASCEND_LOG_FILE_BACKUP_COUNT",
            5,
            _int("VLLM_ASCEND_LOG_FILE_BACKUP_COUNT", 0, 1000),
            "Rotated log files kept (file.1 ... file.N); 0 truncates instead.",
        ),
        EnvVar(
            "VLLM_ASCEND_MOE_COMM_METHOD",
            None,
            _choice("VLLM_ASCEND_MOE_COMM_METHOD", ("allgather", "alltoall", "mc2")),
            "Force the MoE communication method of expert-parallel layers on every step (default: chosen per "
            "step by device family and token count).",
        ),
        EnvVar(
            "VLLM_ASCEND_BATCH_INVARIANT",
            False,
            _bool("VLLM_ASCEND_BATCH_INVARIANT"),
            "Attention attends every request alone, so its result is bitwise independent of the rest of the "
            "batch (reference device; the other ops are not made batch-invariant yet).",
        ),
        EnvVar(
            "VLLM_ASCEND_NPU_SMI",
            "npu-smi",
            _text,
            "The npu-smi command used to read NPU/CPU topology for CPU binding.",
        ),
    )
}


#: Upstream variables this version refuses (name -> what they would do): setting one is an error.
UNSUPPORTED: dict[str, str] = {
    "VLLM_ASCEND_ENABLE_NZ": "matmul weights in FRACTAL_NZ layout",
}


def unsupported_message(name: str) -> str:
    from vllm_ascend.core._version import __version__

    return f"`{name}` is not supported yet by vllm-ascend {__version__} ({UNSUPPORTED[name]}); unset it"


def refuse_unsupported(environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`EnvError` when a refused variable is set (to anything but the empty string)."""
    env = os.environ if environ is None else environ
    for name in UNSUPPORTED:
        if env.get(name):
            raise EnvError(unsupported_message(name))


def declare(var: EnvVar) -> None:
    """Declare a variable (core modules only; names must be unique)."""
    if var.name in _VARS:
        raise EnvError(f"environment variable {var.name} is declared twice")
    _VARS[var.name] = var


def variables() -> dict[str, EnvVar]:
    return dict(_VARS)


def check_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """Validate every declared variable that is set; return a note per unknown ``VLLM_ASCEND_*`` name.

    Bad values raise :class:`EnvError`; unknown names (typos are otherwise silently ignored)
    are reported with the closest declared name.
    """
    env = os.environ if environ is None else environ
    notes: list[str] = []
    for name, raw in env.items():
        var = _VARS.get(name)
        if name in UNSUPPORTED:
            if raw:
                raise EnvError(unsupported_message(name))
        elif var is not None:
            if raw != "":
                var.parse(raw)
        elif name.startswith("VLLM_ASCEND_"):
            # Compare without the shared prefix, which would make every name look close.
            prefix = "VLLM_ASCEND_"
            suffixes = [v[len(prefix) :] for v in _VARS if v.startswith(prefix)]
            close = difflib.get_close_matches(name[len(prefix) :], suffixes, n=1, cutoff=0.6)
            hint = f"; did you mean {prefix}{close[0]}?" if close else ""
            notes.append(f"unknown environment variable {name} is ignored{hint}")
    return sorted(notes)


def __getattr__(name: str) -> Any:
    var = _VARS.get(name)
    if var is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return var.read()


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_VARS))
