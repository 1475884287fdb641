"""vllm_ascend.quant: ModelSlim quant descriptions and quantization schemes (lazy exports)."""

from __future__ import annotations

import importlib
from typing import Any

from vllm_ascend.quant._version import __version__

_LAZY: dict[str, str] = {
    "QuantDescription": "vllm_ascend.quant.description",
    "QuantDescriptionError": "vllm_ascend.quant.description",
    "W8A8DynamicLinear": "vllm_ascend.quant.schemes",
    "get_scheme": "vllm_ascend.quant.schemes",
    "quantize_per_token": "vllm_ascend.quant.schemes",
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
