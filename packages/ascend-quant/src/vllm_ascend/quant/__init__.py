"""vllm_ascend.quant: ModelSlim quant descriptions and quantization schemes (lazy exports).

A library for now: it registers no vLLM quantization method, so ``--quantization ascend`` is
refused until the package provides a vLLM ``QuantizationConfig``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core.lazy import lazy_exports
from vllm_ascend.quant._version import __version__

if TYPE_CHECKING:  # real signatures for type checkers; at runtime the names load lazily
    from vllm_ascend.quant.description import QuantDescription as QuantDescription
    from vllm_ascend.quant.description import QuantDescriptionError as QuantDescriptionError
    from vllm_ascend.quant.schemes import W8A8DynamicLinear as W8A8DynamicLinear
    from vllm_ascend.quant.schemes import get_scheme as get_scheme
    from vllm_ascend.quant.schemes import quantize_per_token as quantize_per_token

_LAZY: dict[str, str] = {
    "QuantDescription": "vllm_ascend.quant.description",
    "QuantDescriptionError": "vllm_ascend.quant.description",
    "W8A8DynamicLinear": "vllm_ascend.quant.schemes",
    "get_scheme": "vllm_ascend.quant.schemes",
    "quantize_per_token": "vllm_ascend.quant.schemes",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
