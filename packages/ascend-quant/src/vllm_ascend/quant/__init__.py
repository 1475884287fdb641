"""vllm_ascend.quant: ModelSlim quant descriptions and quantization schemes (lazy exports).

Importing the package loads neither torch nor vLLM; the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core.sdk import lazy_exports
from vllm_ascend.quant._version import __version__

if TYPE_CHECKING:  # real signatures for type checkers; at runtime the names load lazily
    from vllm_ascend.quant.description import QuantDescription as QuantDescription
    from vllm_ascend.quant.description import QuantDescriptionError as QuantDescriptionError
    from vllm_ascend.quant.errors import QuantLoadError as QuantLoadError
    from vllm_ascend.quant.schemes import AscendLinearScheme as AscendLinearScheme
    from vllm_ascend.quant.schemes import AscendMoEScheme as AscendMoEScheme
    from vllm_ascend.quant.schemes import TensorSpec as TensorSpec
    from vllm_ascend.quant.schemes import UnsupportedQuantType as UnsupportedQuantType
    from vllm_ascend.quant.schemes import get_scheme_class as get_scheme_class
    from vllm_ascend.quant.schemes import register_scheme as register_scheme

_LAZY: dict[str, str] = {
    "AscendLinearScheme": "vllm_ascend.quant.schemes",
    "AscendMoEScheme": "vllm_ascend.quant.schemes",
    "QuantDescription": "vllm_ascend.quant.description",
    "QuantDescriptionError": "vllm_ascend.quant.description",
    "QuantLoadError": "vllm_ascend.quant.errors",
    "TensorSpec": "vllm_ascend.quant.schemes",
    "UnsupportedQuantType": "vllm_ascend.quant.schemes",
    "get_scheme_class": "vllm_ascend.quant.schemes",
    "register_scheme": "vllm_ascend.quant.schemes",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
