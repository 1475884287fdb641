"""vllm_ascend.specdecode: speculative decoding proposers (lazy exports)."""

from __future__ import annotations

import importlib
from typing import Any

from vllm_ascend.specdecode._version import __version__

_LAZY: dict[str, str] = {
    "NgramConfigError": "vllm_ascend.specdecode.ngram",
    "NgramProposer": "vllm_ascend.specdecode.ngram",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
