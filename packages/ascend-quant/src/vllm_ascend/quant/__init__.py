"""vllm_ascend.quant: ModelSlim quant descriptions and quantization schemes (lazy exports)."""

from __future__ import annotations

from vllm_ascend.core.lazy import lazy_exports
from vllm_ascend.quant._version import __version__

_LAZY: dict[str, str] = {
    "QuantDescription": "vllm_ascend.quant.description",
    "QuantDescriptionError": "vllm_ascend.quant.description",
    "W8A8DynamicLinear": "vllm_ascend.quant.schemes",
    "get_scheme": "vllm_ascend.quant.schemes",
    "quantize_per_token": "vllm_ascend.quant.schemes",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
